"""Checkpoint speed, measured inside a bench worker (trainer/bench/worker.py) on the production engine:

- a synchronous save in the format of a run's interval saves (dp_reshardable under auto) (bytes, seconds:
  throughput against the disk's write speed) and its load at the same layout;
- the stall of the background saves a run makes on its interval: the seconds each blocks training (its start:
  staging, the state dict, planning, the common state, forking the writer; its end: finalizing and publishing at
  a step boundary), the step that starts one against the steps that do not, and how long until it is published
  (steps keep running meanwhile). A run's first save of a format
  plans it, its second checks the plan again, the ones after reuse it (trainer/checkpoint/megatron.py Plans): the
  last of BACKGROUND_SAVES is a steady-state save, the first a run's first;
- a load at another layout, in a worker started at that layout (`--load`): weights, step and LR schedule (a
  dp_reshardable checkpoint's Adam moments load at its own TP x PP x VP only).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from trainer.checkpoint.store import Progress
from trainer.engines.megatron import MegatronEngine

PLAIN_STEPS = 2  # steps without a save, the stall's baseline
BACKGROUND_SAVES = 3  # plan, check the plan, reuse it


def _timed(call) -> tuple[float, object]:
    torch.distributed.barrier()
    started = time.perf_counter()
    result = call()
    torch.distributed.barrier()
    return time.perf_counter() - started, result


def _size(checkpoint: Path) -> int:
    return sum(path.stat().st_size for path in checkpoint.rglob("*") if path.is_file())


def _interval_saves(run: MegatronEngine, keep_last: int) -> None:
    """Every save in the format a run's interval (background) saves use, keeping `keep_last` (all of them: the
    first is loaded at another layout afterwards; 1 where disk is short, as for the GPU suite's 17 GB saves)."""
    update = {"keep_last": keep_last, "optimizer_format": run.optimizer_format(background=True)}
    c = run.cfg.checkpoint.model_copy(update=update)
    run.cfg = run.cfg.model_copy(update={"checkpoint": c})


def _background_save(run: MegatronEngine, batches: list, step: int, plain: float) -> dict:
    started = time.perf_counter()
    step_seconds, _ = _timed(lambda: run.train_step(batches))
    # What training waits for: staging, the state dict, planning, the common state, the fork of the writer.
    start_seconds, _ = _timed(lambda: run.save(Progress(step=step), background=True))
    while_writing = []
    published: list[Path] = []
    while not published:
        seconds, _ = _timed(lambda: run.train_step(batches))
        while_writing.append(seconds)
        # Also blocking: the check at each step boundary, and once written, finalizing and publishing.
        check_seconds, published = _timed(lambda: run.finish_saves(wait=False))
    return {
        "start_seconds": start_seconds,
        "publish_step_seconds": check_seconds,  # the check that finalized and published it
        "blocking_seconds": start_seconds + check_seconds,
        "stall_seconds": step_seconds + start_seconds - plain,
        "steps_while_writing_seconds": while_writing,
        "publish_seconds": time.perf_counter() - started,
    }


def time_checkpoint(run: MegatronEngine, batches: list, step: int, keep_last: int | None = None) -> dict:
    _interval_saves(run, keep_last or 1 + BACKGROUND_SAVES)
    save_seconds, saved = _timed(lambda: run.save(Progress(step=step)))
    load_seconds, _ = _timed(lambda: run.load(saved))
    plain = statistics.median(_timed(lambda: run.train_step(batches))[0] for _ in range(PLAIN_STEPS))
    return {
        "bytes": _size(saved),
        "save_seconds": save_seconds,
        "load_seconds": load_seconds,
        "plain_step_seconds": plain,
        # In order: a run's first background save, ..., a steady-state one (the last).
        "background_saves": [
            _background_save(run, batches, step + 1 + i, plain) for i in range(BACKGROUND_SAVES)
        ],
        "checkpoint": str(saved),
    }


def time_load(run: MegatronEngine, checkpoint: Path) -> dict:
    seconds, _ = _timed(lambda: run.load(checkpoint))
    return {"load_seconds": seconds}
