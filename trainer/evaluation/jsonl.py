"""The JSONL files evaluation reads (generate's prompts, a suite's generation tasks): one JSON object a line,
each with the string fields its reader asks for; blank lines are skipped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def string_records(
    path: Path, fields: tuple[str, ...], at: str, shape: str, error: type[Exception]
) -> list[dict[str, Any]]:
    """Every line's object, each holding a string under every one of `fields`; a line that is not JSON, or not
    such an object, raises `error` naming `at`, the line's number and what to give (`shape`)."""
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as problem:
            raise error(f"{at} line {number}: not JSON ({problem})") from None
        if not isinstance(entry, dict) or not all(isinstance(entry.get(name), str) for name in fields):
            raise error(f"{at} line {number}: {shape}")
        records.append(entry)
    return records
