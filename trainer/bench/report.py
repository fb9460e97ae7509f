"""A bench report's rows and machine record, shared by the CPU suite (command.py) and the GPU suite (gpu.py):
every result is a value beside a baseline measured in the same run."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from trainer.bench.training import MeasuredRun, memory_against_planner


def add_memory_results(report: dict, runs: Sequence[MeasuredRun]) -> None:
    """One row per (layout, pipeline stage): the planner's peak against the measured one (the highest rank)."""
    rows = [row for run in runs for row in memory_against_planner(run)]
    report["details"]["memory"] = rows
    highest: dict[tuple[str, int], dict] = {}
    for row in rows:
        key = (row["layout"], row["pipeline_rank"])
        if key not in highest or row["measured"]["peak"] > highest[key]["measured"]["peak"]:
            highest[key] = row
    for (layout, stage), row in highest.items():
        add_result(
            report,
            f"peak memory {layout} stage {stage}",
            "MiB",
            row["predicted"]["peak"] / 2**20,
            "measured (allocated bytes)",
            row["measured"]["peak"] / 2**20,
        )


def add_result(
    report: dict, name: str, unit: str, value: float | None, baseline: str, baseline_value: float | None
) -> None:
    """A row: value against its baseline (None where there is none to show, e.g. n/a on one device)."""
    report["results"].append(
        {
            "name": name,
            "unit": unit,
            "value": value,
            "baseline": baseline,
            "baseline_value": baseline_value,
            "ratio": value / baseline_value if value is not None and baseline_value else None,
        }
    )


def machine() -> dict:
    import torch

    cpu_model = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": cpu_model,
        "cpus_usable": len(os.sched_getaffinity(0)),
        "load_average_1m_at_start": os.getloadavg()[0],
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
