"""Checkpoint speed, measured inside a bench worker (trainer/bench/worker.py) on the production engine:

- a synchronous save and its load at the same layout (bytes, seconds: throughput against the disk's write speed);
- the stall of a background save: the seconds it blocks training (its start: staging, planning, the common
  state, forking the writer; its end: finalizing and publishing at a step boundary), the step that starts one
  against the steps that do not, and how long until it is published (steps keep running meanwhile);
- a load at another layout, in a worker started at that layout (`--load`).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from trainer.checkpoint.store import Progress
from trainer.engines.megatron import MegatronEngine

PLAIN_STEPS = 2  # steps without a save, the stall's baseline


def _timed(call) -> tuple[float, object]:
    torch.distributed.barrier()
    started = time.perf_counter()
    result = call()
    torch.distributed.barrier()
    return time.perf_counter() - started, result


def time_checkpoint(run: MegatronEngine, batches: list, step: int) -> dict:
    save_seconds, saved = _timed(lambda: run.save(Progress(step=step)))
    load_seconds, _ = _timed(lambda: run.load(saved))
    size = sum(path.stat().st_size for path in saved.rglob("*") if path.is_file())
    plain = [_timed(lambda: run.train_step(batches))[0] for _ in range(PLAIN_STEPS)]

    started = time.perf_counter()
    step_seconds, _ = _timed(lambda: run.train_step(batches))
    # What training waits for: staging, planning, the common state, the fork of the writer.
    start_seconds, _ = _timed(lambda: run.save(Progress(step=step + 1), background=True))
    while_writing = []
    published: list[Path] = []
    while not published:
        seconds, _ = _timed(lambda: run.train_step(batches))
        while_writing.append(seconds)
        # Also blocking: the check at each step boundary, and once written, finalizing and publishing.
        check_seconds, published = _timed(lambda: run.finish_saves(wait=False))
    return {
        "bytes": size,
        "save_seconds": save_seconds,
        "load_seconds": load_seconds,
        "plain_step_seconds": statistics.median(plain),
        "saving_step_seconds": step_seconds + start_seconds,
        "background_start_seconds": start_seconds,
        "background_publish_step_seconds": check_seconds,  # the check that finalized and published it
        "background_blocking_seconds": start_seconds + check_seconds,
        "stall_seconds": step_seconds + start_seconds - statistics.median(plain),
        "steps_while_writing_seconds": while_writing,
        "background_publish_seconds": time.perf_counter() - started,
        "checkpoint": str(saved),
    }


def time_load(run: MegatronEngine, checkpoint: Path) -> dict:
    seconds, _ = _timed(lambda: run.load(checkpoint))
    return {"load_seconds": seconds}
