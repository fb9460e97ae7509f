"""Reads image/efa.env, the one source of the NCCL/EFA environment (the job definition sets it on every node,
image/entrypoint.sh exports it for runs outside Batch)."""

from __future__ import annotations

import shlex
from pathlib import Path

EFA_ENV_FILE = Path(__file__).resolve().parent.parent / "image" / "efa.env"


def efa_environment(path: Path = EFA_ENV_FILE) -> dict[str, str]:
    """KEY="value" lines in shell syntax; comments and blank lines ignored."""
    environment: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        words = shlex.split(line, comments=True)
        if not words:
            continue
        key, sep, value = words[0].partition("=")
        if len(words) != 1 or not sep or not key.isidentifier():
            raise ValueError(f'{path}:{number}: expected KEY="value", got {line!r}')
        environment[key] = value
    return environment
