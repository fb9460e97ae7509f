"""How a training process meets faults, in the training loop's terms.

- SIGTERM (what AWS Batch, ECS and Spot send before they kill) asks for a stop: every rank finishes its step, the
  ranks agree through one all-reduce that they stop at the same step, save, and exit 0.
- A step with a non-finite loss or gradient norm is skipped (no update) and counted; too many in a row stop the run.
- A collective that times out, or loses the rank on the other end, becomes one message that names the collective,
  where the trainer called it, and what to check.

The tests' way in is one environment variable, TRAINSTACK_FAULT, read here and nowhere else: faults separated by
";", each a kind and where it strikes, e.g. `kill step=13 rank=1 restart=0; enospc step=10`.
    kill          SIGKILL this rank in step N (after its backward pass)
    hang          sleep `seconds` (default 600) in step N, leaving the other ranks waiting in a collective
    slow          sleep `seconds` (required) in step N and every later step: a straggler
    clock         from step N on, every rank's step compute reads as `seconds` (required) on the straggler windows'
                  clock, whatever it measured, and a `slow` fault adds its seconds to that reading instead of
                  sleeping: a straggler whose ratio a loaded machine cannot stretch or shrink (rank= is ignored);
                  the cost ledger then pays `seconds` for each step and nothing for start-up, saves or evaluation,
                  so a budget cap stops at a step that no machine's speed moves
    nan-grad      make step N's gradients NaN
    sigterm       send SIGTERM to this rank in step N (as Batch's cancel or a Spot reclaim would)
    kill-in-save  SIGKILL this rank while it writes step N's checkpoint (after its first item is on disk)
    enospc        fail the checkpoint write of step N with OSError(ENOSPC), as a full file system does
`rank` defaults to 0; `restart` (torchrun's restart count) to every attempt.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import math
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.device import device_type


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
        flag = torch.tensor([1.0 if self.received else 0.0], device=device_type())
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
        if _module(f.filename).startswith("trainer.")
        and not _module(f.filename).startswith(("trainer.distributed.megatron_compat", "trainer.health."))
    ]
    collective = f"{_module(library[-1].filename)}.{library[-1].name}" if library else "a collective"
    collective = collective.replace("torch.distributed.distributed_c10d.", "torch.distributed.")
    caller = f" (called from {_module(ours[-1].filename)}.{ours[-1].name})" if ours else ""
    notes = "".join(f", {note}" for note in getattr(error, "__notes__", []))
    return f"{collective}{caller}{notes} {what}"


def _module(filename: str) -> str:
    """`.../site-packages/torch/distributed/distributed_c10d.py` -> `torch.distributed.distributed_c10d`."""
    parts = filename.removesuffix(".py").replace("\\", "/").split("/")
    directories = parts[:-1]  # a package root is a directory: trainer/engines/megatron.py is the trainer's
    for root in ("torch", "megatron", "trainer"):
        if root in directories:
            start = len(directories) - 1 - directories[::-1].index(root)
            return ".".join(parts[start:])
    return filename


FAULT_ENV = "TRAINSTACK_FAULT"
_IN_STEP = ("kill", "hang", "nan-grad", "slow", "sigterm")  # what inject_in_step does
_STEP_FAULTS = (*_IN_STEP, "clock")
_SAVE_FAULTS = ("kill-in-save", "enospc")


@dataclass(frozen=True)
class Fault:
    """One fault a test asks for (TRAINSTACK_FAULT)."""

    kind: str
    step: int
    rank: int = 0
    restart: int | None = None  # TORCHELASTIC_RESTART_COUNT it strikes at; None: every attempt
    seconds: float = 600.0  # hang and slow

    @classmethod
    def parse(cls, text: str) -> Fault:
        kind, *settings = text.split()
        if kind not in _STEP_FAULTS + _SAVE_FAULTS:
            raise ValueError(
                f"{FAULT_ENV}: unknown fault {kind!r}; known: {', '.join(_STEP_FAULTS + _SAVE_FAULTS)}"
            )
        values = dict(setting.split("=", 1) for setting in settings)
        unknown = set(values) - {"step", "rank", "restart", "seconds"}
        if unknown or "step" not in values:
            raise ValueError(f"{FAULT_ENV}: {text!r} needs step=N and takes only rank=, restart=, seconds=")
        if kind in ("slow", "clock") and "seconds" not in values:
            raise ValueError(
                f"{FAULT_ENV}: {text!r} needs seconds=S: how much longer each of the rank's steps takes"
                if kind == "slow"
                else f"{FAULT_ENV}: {text!r} needs seconds=S: what every rank's step compute reads as"
            )
        return cls(
            kind,
            int(values["step"]),
            int(values.get("rank", 0)),
            int(values["restart"]) if "restart" in values else None,
            float(values.get("seconds", 600)),
        )


@functools.cache
def _requested() -> tuple[Fault, ...]:
    return tuple(Fault.parse(item) for item in os.environ.get(FAULT_ENV, "").split(";") if item.strip())


def _striking(kinds: tuple[str, ...], step: int) -> Fault | None:
    rank = int(os.environ.get("RANK", "0"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    for fault in _requested():
        strikes = step >= fault.step if fault.kind in ("slow", "clock") else step == fault.step  # from N on
        on_rank = fault.kind == "clock" or fault.rank == rank  # the clock is every rank's
        if fault.kind in kinds and strikes and on_rank and fault.restart in (None, restart):
            return fault
    return None


def clock_seconds() -> float | None:
    """The `clock` fault's seconds a step, where one is requested for this attempt (the cost ledger's clock)."""
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    return next((f.seconds for f in _requested() if f.kind == "clock" and f.restart in (None, restart)), None)


def step_compute(step: int, measured: float) -> float:
    """Step N's compute time as the straggler windows see it: `measured`, or under a `clock` fault its reading
    plus this rank's `slow` seconds."""
    clock = _striking(("clock",), step)
    if clock is None:
        return measured
    slow = _striking(("slow",), step)
    return clock.seconds + (slow.seconds if slow is not None else 0.0)


def inject_in_step(step: int, chunks: list[torch.nn.Module]) -> None:
    """TRAINSTACK_FAULT's step faults, between step N's backward pass and its optimizer step."""
    fault = _striking(_IN_STEP, step)
    if fault is None:
        return
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    elif fault.kind in ("hang", "slow"):
        if fault.kind == "hang" or _striking(("clock",), step) is None:
            time.sleep(fault.seconds)  # a slow rank on the clock only reads slower (step_compute)
    else:
        for chunk in chunks:
            for param in chunk.parameters():
                param.main_grad.fill_(math.nan)  # type: ignore[attr-defined]  # megatron's DDP adds main_grad


@contextlib.contextmanager
def inject_in_save(step: int, rank_pid: int | None = None) -> Iterator[None]:
    """TRAINSTACK_FAULT's save faults, at the call that writes each item of a checkpoint file, in this process
    and the writer processes megatron forks from it (they inherit the wrapped call). `rank_pid`: the training
    rank a kill strikes with the writer, where this is the rank's background writer process."""
    fault = _striking(_SAVE_FAULTS, step)
    if fault is None:
        yield
        return
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    write_item = filesystem_async._write_item
    rank_pid = os.getpid() if rank_pid is None else rank_pid
    # The rank first, then its background writer where this is one: killed the other way round, a loaded machine
    # could leave the rank running long enough to see its writer's death as a failed save and exit 1 itself.
    killed = list(dict.fromkeys((rank_pid, os.getpid())))

    @functools.wraps(write_item)  # megatron reads its signature
    def faulty_write_item(*args, **kwargs):
        stream = next(arg for arg in args if hasattr(arg, "fileno"))
        if fault.kind == "enospc":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), stream.name)
        result = write_item(*args, **kwargs)
        stream.flush()
        for pid in killed:
            if pid != os.getpid():
                os.kill(pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)  # the process megatron forked for this file (last)
        return result

    filesystem_async._write_item = faulty_write_item
    try:
        yield
    finally:
        filesystem_async._write_item = write_item
