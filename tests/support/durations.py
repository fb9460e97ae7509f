"""The suite's balance across xdist workers: each test file's measured seconds (tests/durations.json), so that the
slowest files start first and the short ones fill in behind them.

xdist's loadfile scheduler hands out whole files in collection order, by default reordered by test count
(pytest-xdist 3.8.0, scheduler/loadscope.py, `loadscopereorder`): a file of three 80-second tests then starts last
and runs alone at the end. The Makefile turns that reorder off (--no-loadscope-reorder) and this orders the files
longest first (longest-processing-time-first scheduling). A file not measured yet counts as the median.

Regenerate after a suite run with --junitxml (its testcase times include setup and teardown, pytest's default
junit_duration_report = total): python -m tests.support.durations JUNIT.xml > tests/durations.json
"""

from __future__ import annotations

import json
import statistics
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

DURATIONS = Path(__file__).resolve().parent.parent / "durations.json"


def file_seconds() -> dict[str, float]:
    return json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}


def order_longest_first(items: list, seconds: dict[str, float]) -> None:
    """Sort `items` (pytest items) by their file's seconds, longest first, keeping each file's own order."""
    default = statistics.median(seconds.values()) if seconds else 0.0
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(item.nodeid.split("::")[0], len(first_seen))

    def key(item) -> tuple[float, int]:
        path = item.nodeid.split("::")[0]
        return (-seconds.get(path, default), first_seen[path])

    items.sort(key=key)  # stable: a file's tests keep their order


def from_junit(path: str) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for case in ElementTree.parse(path).iter("testcase"):
        module = case.get("classname", "").split(".")
        # classname is the dotted module (and class): tests.bench.test_bench[.TestClass]
        parts = [p for p in module if not p[:1].isupper()]
        totals["/".join(parts) + ".py"] += float(case.get("time", 0))
    return {name: round(seconds, 1) for name, seconds in sorted(totals.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    json.dump(from_junit(sys.argv[1]), sys.stdout, indent=1)
    sys.stdout.write("\n")
