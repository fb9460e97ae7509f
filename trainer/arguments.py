"""argparse types for the verbs' counts and amounts: zero or a negative number fails while parsing, with the
option's name and argparse's usage line, before a process starts (torchrun would take `--nproc 0` or `--tp 0`
further, into a division by zero or a job of no processes)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give one of at least 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give one above 0") from None
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text}: must be above 0")
    return value
