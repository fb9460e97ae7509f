"""What an engine's optimizer step reports to the loop (trainer/loop.py) and the metrics (trainer/metrics.py)."""

from __future__ import annotations

from typing import NamedTuple


class StepResult(NamedTuple):
    """What one optimizer step over a global batch reports."""

    loss: float  # mean loss per token over the global batch
    grad_norm: float  # before clipping
    lr: float  # the learning rate the step used
    skipped: bool  # a non-finite loss or gradient norm: nothing was applied
