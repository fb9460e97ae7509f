"""How a training process meets faults, in the training loop's terms.

- SIGTERM (what AWS Batch, ECS and Spot send before they kill) asks for a stop: every rank finishes its step, the
  ranks agree through one all-reduce that they stop at the same step, save, and exit 0.
- A step with a non-finite loss or gradient norm is skipped (no update) and counted; too many in a row stop the run.
- A collective that times out, or loses the rank on the other end, becomes one message that names the collective,
  where the trainer called it, and what to check.
"""

from __future__ import annotations

import math
import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer import parallel


class TrainingStopped(RuntimeError):
    """The run cannot go on (too many non-finite steps in a row); the newest checkpoint is the last good one."""


class StopRequest:
    """Set by SIGTERM on any rank; `agreed()` tells every rank, at a step boundary, whether any rank got one."""

    def __init__(self) -> None:
        self.received = False
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.received = True

    def agreed(self) -> bool:
        """A collective: every rank calls it at the same step boundary and gets the same answer."""
        flag = torch.tensor([1.0 if self.received else 0.0], device=parallel.device_type())
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return flag.item() > 0


@dataclass
class SkipCounter:
    """Steps skipped for a non-finite loss or gradient norm: in a row, and in all (that one is checkpointed)."""

    limit: int  # optimizer.max_consecutive_skips
    total: int = 0
    in_a_row: int = 0

    @staticmethod
    def finite(loss: float, grad_norm: float) -> bool:
        return math.isfinite(loss) and math.isfinite(grad_norm)

    def record(self, step: int, skipped: bool, newest_checkpoint: Callable[[], Path | None]) -> None:
        """Count a step; raise TrainingStopped when `limit` skipped steps have come in a row."""
        if not skipped:
            self.in_a_row = 0
            return
        self.total += 1
        self.in_a_row += 1
        if self.in_a_row >= self.limit:
            first = step - self.in_a_row + 1
            newest = newest_checkpoint()
            kept = f"the newest checkpoint, {newest}," if newest else "no checkpoint"
            raise TrainingStopped(
                f"steps {first} to {step}: {self.in_a_row} steps in a row had a non-finite loss or gradient norm "
                f"(optimizer.max_consecutive_skips = {self.limit}); stopped without saving, so {kept} holds the "
                "last good weights. Lower optimizer.lr or raise schedule.lr_warmup_iters, and check the data "
                "those steps read"
            )


# What a collective's error says when the rank at the other end is gone, as gloo and NCCL word it.
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused")


def collective_failure(error: BaseException, timeout_minutes: float) -> str | None:
    """One message for a collective that timed out or lost its peer: which collective, called from where in
    the trainer, and what to check; None for any other error."""
    text = str(error)
    if "timed out" in text.lower() or "timeout" in text.lower():
        seconds = timeout_minutes * 60
        what = (
            f"timed out after {seconds:g} s (parallel.distributed_timeout_minutes = {timeout_minutes:g}): "
            "another rank stopped taking part. Look in the other ranks' output for an error, or for a rank that "
            "is stuck (py-spy dump --pid PID shows where); check the node's health and the network "
            "(NCCL_DEBUG=INFO on GPUs). If a step, an evaluation or a save legitimately takes longer, raise "
            "parallel.distributed_timeout_minutes"
        )
    elif any(marker in text for marker in _PEER_LOST):
        what = (
            "lost the rank at the other end, which died: its own output (or torchrun's summary below) "
            "says why"
        )
    else:
        return None
    frames = traceback.extract_tb(error.__traceback__)
    # The innermost library frame is the collective; the innermost trainer frame is where the trainer asked for it.
    library = [f for f in frames if _module(f.filename).startswith(("torch.distributed", "megatron."))]
    library = [f for f in library if f.name != "wrapper"] or library  # c10d's logging decorator
    ours = [
        f
        for f in frames
        if _module(f.filename).startswith("trainer.") and "megatron_compat" not in f.filename
    ]
    collective = f"{_module(library[-1].filename)}.{library[-1].name}" if library else "a collective"
    collective = collective.replace("torch.distributed.distributed_c10d.", "torch.distributed.")
    caller = f" (called from {_module(ours[-1].filename)}.{ours[-1].name})" if ours else ""
    notes = "".join(f", {note}" for note in getattr(error, "__notes__", []))
    return f"{collective}{caller}{notes} {what}"


def _module(filename: str) -> str:
    """`.../site-packages/torch/distributed/distributed_c10d.py` -> `torch.distributed.distributed_c10d`."""
    parts = filename.removesuffix(".py").replace("\\", "/").split("/")
    for root in ("torch", "megatron", "trainer"):
        if root in parts:
            start = len(parts) - 1 - parts[::-1].index(root)
            return ".".join(parts[start:])
    return filename
