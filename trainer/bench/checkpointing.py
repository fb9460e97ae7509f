"""Checkpoint speed, measured inside a bench worker (trainer/bench/worker.py) on the production engine:

- a synchronous save in the format of a run's interval saves (dp_reshardable under auto) (bytes, seconds:
  throughput against the disk's write speed), the digest of its every byte checked over the ranks (what a load
  checks first, and about what the writers spend hashing as they write) and its load at the same layout;
- the stall of the background saves a run makes on its interval: the seconds each blocks training (its start:
  staging, the state dict, planning, the common state, the copy into the writer's buffer; its end: finalizing
  and publishing at a step boundary), each measured directly between barriers; how much slower the steps run while the writer
  works (their median against a plain step's, a ratio); and how long until it is published (steps keep running
  meanwhile). A run's first save of a format plans it, its second checks the plan again, the ones after reuse it
  (trainer/checkpoint/megatron.py Plans): the first of BACKGROUND_SAVES is a run's first save, and a steady-state
  save's stall is the median of the third and later ones (`steady_blocking`: one save's stall moves by several
  times itself when the 2-core machine's scheduler or write-back holds a rank back);
- a load at another layout, in a worker started at that layout (`--load`): weights, step and LR schedule (a
  dp_reshardable checkpoint's Adam moments load at its own TP x PP x VP only).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from trainer.checkpoint import digest
from trainer.checkpoint.store import Progress, prune, verify
from trainer.checkpoint.writer import Write, Writer
from trainer.engines.megatron import MegatronEngine

T = TypeVar("T")

PLAIN_STEPS = 2  # steps without a save, the stall's baseline
BACKGROUND_SAVES = 7  # plan, check the plan, reuse it (five times)


def _timed(call: Callable[[], T]) -> tuple[float, T]:
    torch.distributed.barrier()
    started = time.perf_counter()
    result = call()
    torch.distributed.barrier()
    return time.perf_counter() - started, result


def _size(checkpoint: Path) -> int:
    return sum(path.stat().st_size for path in checkpoint.rglob("*") if path.is_file())


def _interval_saves(run: MegatronEngine) -> None:
    """Every save in the format a run's interval (background) saves use."""
    c = run.cfg.checkpoint.model_copy(update={"optimizer_format": run.optimizer_format(background=True)})
    run.cfg = run.cfg.model_copy(update={"checkpoint": c})


def _kept(published: Path, keep_last: int | None) -> Path:
    """After a publish: prune to keep_last, as the checkpointer does (rank 0), when given."""
    if keep_last is not None and torch.distributed.get_rank() == 0:
        prune(published.parent, keep_last)
    return published


def _published(write: Write, keep_last: int | None) -> Path | None:
    """The check the checkpointer makes at each step boundary: publish once every rank's write is done."""
    return _kept(write.finish(), keep_last) if write.done() else None


def _background_save(
    run: MegatronEngine, writer: Writer, batches: list, step: int, plain: float, keep_last: int | None
) -> dict:
    started = time.perf_counter()
    # What training waits for: staging, the state dict, planning, the common state, the copy to the writer.
    start_seconds, write = _timed(lambda: run.save(Progress(step=step), writer=writer))
    while_writing = []
    published = None
    while published is None:
        seconds, _ = _timed(lambda: run.train_step(batches))
        while_writing.append(seconds)
        # Also blocking: the check at each step boundary, and once written, finalizing and publishing.
        check_seconds, published = _timed(lambda: _published(write, keep_last))
    return {
        "start_seconds": start_seconds,
        "publish_step_seconds": check_seconds,  # the check that finalized and published it
        "blocking_seconds": start_seconds + check_seconds,
        # The steps that run while the writer works, against a plain step: what the writer takes of the CPUs.
        "step_slowdown_while_writing": statistics.median(while_writing) / plain,
        "steps_while_writing_seconds": while_writing,
        "publish_seconds": time.perf_counter() - started,
    }


def time_checkpoint(
    run: MegatronEngine,
    batches: list,
    step: int,
    keep_last: int | None = None,
    background_saves: int = BACKGROUND_SAVES,
) -> dict:
    """`keep_last`: prune to that many after each save, as a run's retention would (1 where disk is short, as for
    the GPU suite's 17 GB saves); None keeps every one (the first is loaded at another layout afterwards)."""
    _interval_saves(run)
    writer = Writer()
    writer.ready()  # as a run's checkpointer has it by its first save (trainer/checkpoint/writer.py)
    save_seconds, saved = _timed(lambda: _kept(run.save(Progress(step=step)).finish(), keep_last))
    size = _size(saved)
    # Every byte's digest, the files shared out over the ranks (what a run's load checks first): about what each
    # rank's writer spends hashing its share while it writes.
    verify_seconds, problem = _timed(lambda: verify(saved))
    assert problem is None, problem
    hash_seconds = _hashing_seconds(saved)
    load_seconds, _ = _timed(lambda: run.load(saved))
    plain = statistics.median(_timed(lambda: run.train_step(batches))[0] for _ in range(PLAIN_STEPS))
    return {
        "bytes": size,
        "save_seconds": save_seconds,
        "verify_seconds": verify_seconds,
        "hash_seconds": hash_seconds,
        "load_seconds": load_seconds,
        "plain_step_seconds": plain,
        # In order: a run's first background save, ..., a steady-state one (the last).
        "background_saves": [
            _background_save(run, writer, batches, step + 1 + i, plain, keep_last)
            for i in range(background_saves)
        ],
        "checkpoint": str(saved),
    }


def _hashing_seconds(checkpoint: Path) -> float:
    """What the writers spend hashing as they write: each rank's share of the checkpoint's bytes, already in
    memory as a writer has them, through the same streaming digest (XXH3-128), the ranks at once."""
    files = sorted(p for p in checkpoint.rglob("*") if p.is_file())
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    share = [path.read_bytes() for path in files[rank::world]]

    def hash_share() -> None:
        for data in share:
            digest.streaming_hash().update(data)

    seconds, _ = _timed(hash_share)
    return seconds


def time_load(run: MegatronEngine, checkpoint: Path) -> dict:
    seconds, _ = _timed(lambda: run.load(checkpoint))
    return {"load_seconds": seconds}
