"""`<run_dir>/health.json`: what the health checks found, for people and for `make status`.

{"stragglers": {"step": N, "interval": steps per window, "median_s": ..., "ranks": [{rank, host, instance_id,
compute_s, median_s, ratio, windows}]}, "hang": {...the watchdog's summary...}}. Rank 0 writes it (write and
rename, so a reader never sees half a file). No torch here: status verbs read it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

HEALTH_FILE = "health.json"


def remove(run_dir: Path) -> None:
    """A fresh start forgets the last run's findings and dumps."""
    (run_dir / HEALTH_FILE).unlink(missing_ok=True)
    shutil.rmtree(run_dir / "hang", ignore_errors=True)


def read_health(run_dir: Path) -> dict[str, Any]:
    path = run_dir / HEALTH_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def write_health(run_dir: Path, key: str, value: Any) -> None:
    """Set one key of health.json, keeping the others."""
    health = read_health(run_dir)
    health[key] = value
    run_dir.mkdir(parents=True, exist_ok=True)
    staging = run_dir / f"{HEALTH_FILE}.tmp"
    staging.write_text(json.dumps(health, indent=2) + "\n")
    os.replace(staging, run_dir / HEALTH_FILE)


def describe_rank(entry: dict[str, Any]) -> str:
    """`rank 3 on ip-10-0-1-7 (i-0abc...)`."""
    return f"rank {entry['rank']} on {entry['host']} ({entry['instance_id']})"


def summary(health: dict[str, Any]) -> str:
    """One line for the end of a run and for `make status`."""
    parts = []
    stragglers = health.get("stragglers")
    if stragglers and stragglers["ranks"]:
        slow = "; ".join(
            f"{describe_rank(r)} {r['ratio']:.1f}x the median step compute time for {r['windows']} windows"
            for r in stragglers["ranks"]
        )
        parts.append(f"stragglers at step {stragglers['step']}: {slow}")
    elif stragglers:
        parts.append(f"no straggler (last window ended at step {stragglers['step']})")
    if hang := health.get("hang"):
        parts.append(f"hang: {hang['message']}")
    return "; ".join(parts) or "no health report yet"
