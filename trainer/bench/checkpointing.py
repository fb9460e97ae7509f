"""Checkpoint speed, measured inside a bench worker (trainer/bench/worker.py) on the production engine:

- a synchronous save and its load at the same layout (bytes, seconds: throughput against the disk's write speed);
- the stall of a background save: the step that starts one against the steps that do not, and how long until
  it is published (steps keep running meanwhile);
- a load at another layout, in a worker started at that layout (`--load`).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from trainer.checkpoint.store import Progress
from trainer.engines.megatron import MegatronEngine

PLAIN_STEPS = 3  # steps without a save, the stall's baseline


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

    def step_and_save():
        run.train_step(batches)
        run.save(Progress(step=step + 1), background=True)

    started = time.perf_counter()
    saving_step, _ = _timed(step_and_save)
    while_writing = []
    published: list[Path] = []
    while not published:
        seconds, _ = _timed(lambda: run.train_step(batches))
        while_writing.append(seconds)
        published = run.finish_saves(wait=False)
    return {
        "bytes": size,
        "save_seconds": save_seconds,
        "load_seconds": load_seconds,
        "plain_step_seconds": statistics.median(plain),
        "saving_step_seconds": saving_step,
        "stall_seconds": saving_step - statistics.median(plain),
        "steps_while_writing_seconds": while_writing,
        "background_publish_seconds": time.perf_counter() - started,
        "checkpoint": str(saved),
    }


def time_load(run: MegatronEngine, checkpoint: Path) -> dict:
    seconds, _ = _timed(lambda: run.load(checkpoint))
    return {"load_seconds": seconds}
