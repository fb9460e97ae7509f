"""Distributed checkpoints (megatron-core dist_checkpointing): save, find the newest complete one, resume.

Layout under the checkpoint directory:
    iter_0000200/   one checkpoint: model, optimizer, LR scheduler, RNG states, step, consumed samples, and
                    manifest.json (every file's size; small files' SHA-256), written last
    latest          the name of the newest complete checkpoint, rewritten last
A checkpoint is written to `iter_NNNNNNN.tmp` and renamed when every rank has finished, so a crash never leaves
a half-written `iter_*` directory; old ones are renamed away before they are deleted. A directory that does not
match its manifest (a copy cut short, a truncated file, garbage) is skipped with a warning, never loaded. Tensors
are stored by global name and offset, so a checkpoint saved at one (TP, PP, DP) loads at any other; RNG states
only come back at the layout they were saved at.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper
from megatron.core.optimizer import MegatronOptimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.utils import unwrap_model
from torch.distributed.checkpoint.api import CheckpointException

from trainer import megatron_compat
from trainer.parallel import ParallelDims

LATEST = "latest"
MANIFEST = "manifest.json"
# Files up to this size are hashed as well as measured (dist_checkpointing's metadata and common state; at scale
# the tensor files are too big to hash at save time).
_HASHED_MAX_BYTES = 16 * 2**20
# Optimizer state stored per parameter in model space (gathered over DP to save): loads at any layout.
_OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}


class CheckpointSaveError(RuntimeError):
    """A save that did not complete on every rank; nothing was published and the previous checkpoint stands."""


@dataclasses.dataclass
class Progress:
    """Where training stands: what a resumed run continues from."""

    step: int = 0
    consumed_samples: int = 0
    skipped_steps: int = 0  # steps skipped for a non-finite loss or gradient norm, in all


def checkpoint_name(step: int) -> str:
    return f"iter_{step:07d}"


def checkpoint_dirs(directory: Path) -> list[Path]:
    """Directories named as checkpoints, oldest first (an unfinished save still carries its .tmp suffix)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_dir() and re.fullmatch(r"iter_\d{7}", p.name))


def _file_record(path: Path) -> dict:
    size = path.stat().st_size
    if size > _HASHED_MAX_BYTES:
        return {"bytes": size}
    return {"bytes": size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def _write_manifest(checkpoint: Path, step: int) -> None:
    files = sorted(p for p in checkpoint.rglob("*") if p.is_file() and p.name != MANIFEST)
    manifest = {"step": step, "files": {str(p.relative_to(checkpoint)): _file_record(p) for p in files}}
    _write_atomically(checkpoint / MANIFEST, json.dumps(manifest, indent=1) + "\n")


def damage(checkpoint: Path) -> str | None:
    """What is wrong with a checkpoint directory, measured against the manifest its save wrote last; None when
    every file it lists is there with its size (and, for small files, its hash)."""
    try:
        files = json.loads((checkpoint / MANIFEST).read_text())["files"]
        if not all(isinstance(record, dict) and "bytes" in record for record in files.values()):
            raise ValueError("a file without its size")
    except FileNotFoundError:
        return f"no {MANIFEST} (a save or a copy that did not finish, or not a trainer checkpoint)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return f"unreadable {MANIFEST} ({type(error).__name__}: {error})"
    for name, expected in files.items():
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        found = _file_record(path) if "sha256" in expected else {"bytes": path.stat().st_size}
        if found["bytes"] != expected["bytes"]:
            return f"{name} is {found['bytes']} bytes, the save wrote {expected['bytes']}"
        if found != expected:
            return f"{name} does not hold what the save wrote (SHA-256 differs)"
    return None


def _warn_on_rank0(message: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"warning: {message}", file=sys.stderr, flush=True)


def latest_checkpoint(directory: Path, warn: Callable[[str], None] = _warn_on_rank0) -> Path | None:
    """The intact checkpoint `latest` names, else the newest intact one; damaged ones are skipped with a warning."""
    found = checkpoint_dirs(directory)
    pointer = directory / LATEST
    named = directory / pointer.read_text().strip() if pointer.is_file() else None
    for candidate in sorted(found, key=lambda path: (path == named, path.name), reverse=True):
        problem = damage(candidate)
        if problem is None:
            return candidate
        warn(f"skipping checkpoint {candidate}: {problem}")
    return None


def _state_dict(
    model: list[torch.nn.Module],
    optimizer: MegatronOptimizer,
    scheduler: OptimizerParamScheduler,
    progress: Progress,
    dims: ParallelDims,
    *,
    is_loading: bool,
    with_rng: bool,
) -> dict:
    model_state = {f"chunk{i}": chunk.sharded_state_dict() for i, chunk in enumerate(unwrap_model(model))}
    state = {
        "model": model_state,
        "optimizer": optimizer.sharded_state_dict(
            model_state, is_loading=is_loading, metadata=_OPTIMIZER_METADATA
        ),
        "scheduler": scheduler.state_dict(),
        "progress": dataclasses.asdict(progress),
        "layout": {"tp": dims.tp, "pp": dims.pp, "dp": dims.dp, "vp": dims.vp},
    }
    if with_rng:
        rank = torch.distributed.get_rank()
        state["rng"] = ShardedObject("rng_state", _rng_state(), (dims.world_size,), (rank,), replica_id=0)
    return state


def _rng_state() -> dict:
    return {
        "random": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }


def _set_rng_state(state: dict) -> None:
    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


def save(
    directory: Path,
    model: list[torch.nn.Module],
    optimizer: MegatronOptimizer,
    scheduler: OptimizerParamScheduler,
    progress: Progress,
    dims: ParallelDims,
    keep_last: int,
) -> Path:
    """Save on every rank, then publish: rename into place, point `latest` at it, drop the oldest beyond keep_last."""
    final = directory / checkpoint_name(progress.step)
    staging = final.with_name(final.name + ".tmp")
    if torch.distributed.get_rank() == 0:
        for unfinished in directory.glob("iter_*.tmp"):  # left by a crash mid-save
            shutil.rmtree(unfinished)
        staging.mkdir(parents=True)
    torch.distributed.barrier()
    state = _state_dict(model, optimizer, scheduler, progress, dims, is_loading=False, with_rng=True)
    # Replicated tensors are written by the data-parallel replicas in turn rather than all by one.
    strategy = FullyParallelSaveStrategyWrapper(
        get_default_save_sharded_strategy(),
        parallel_state.get_data_parallel_group(with_context_parallel=True),
    )
    try:
        dist_checkpointing.save(state, str(staging), sharded_strategy=strategy)
        failure = None
    except (CheckpointException, OSError) as error:
        failure = error
    _agree_or_raise(failure, f"saving step {progress.step} to {staging}", staging)
    failure = None
    if torch.distributed.get_rank() == 0:
        try:
            _publish(staging, final, progress.step, keep_last)
        except OSError as error:
            failure = error
    _agree_or_raise(failure, f"publishing {final}", staging)
    return final


def _publish(staging: Path, final: Path, step: int, keep_last: int) -> None:
    """Seal the staging directory with its manifest, rename it into place, point `latest` at it, prune."""
    directory = final.parent
    _write_manifest(staging, step)
    # The same step saved again (resumed from an older `latest`): swap it in, then drop the old one.
    replaced = final.with_name(final.name + ".replaced.tmp")
    if final.exists():
        final.rename(replaced)
    staging.rename(final)
    _write_atomically(directory / LATEST, final.name + "\n")
    shutil.rmtree(replaced, ignore_errors=True)
    # Only intact checkpoints count and go: a damaged one may be someone's copy in progress.
    older = [path for path in checkpoint_dirs(directory) if path != final and damage(path) is None]
    for old in older[: max(0, len(older) - (keep_last - 1))]:
        # Renamed first, so that a crash mid-delete leaves a .tmp directory, not a damaged checkpoint.
        doomed = old.rename(old.with_name(old.name + ".pruned.tmp"))
        shutil.rmtree(doomed)


def _agree_or_raise(failure: BaseException | None, doing: str, staging: Path) -> None:
    """Every rank learns whether any rank failed; if one did, all raise, after rank 0 clears the staging
    directory (freeing the space a full disk needs back). The previous checkpoint and `latest` stay as they were."""
    causes: list[str | None] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(causes, _cause(failure) if failure is not None else None)
    failed = [(rank, cause) for rank, cause in enumerate(causes) if cause is not None]
    if not failed:
        return
    if torch.distributed.get_rank() == 0:
        shutil.rmtree(staging, ignore_errors=True)
    rank, cause = next(((r, c) for r, c in failed if "[Errno" in c), failed[0])
    previous = latest_checkpoint(staging.parent, warn=lambda _: None)
    kept = f"{previous.name} is intact and `latest` still names it" if previous else "no earlier checkpoint"
    raise CheckpointSaveError(
        f"{doing} failed on rank {rank}: {cause}. Nothing was published: {kept}. Fix that (free space on "
        "that file system, or set checkpoint.dir to another) and run again to resume"
    )


def _cause(error: BaseException) -> str:
    """One line: the underlying error (dist_checkpointing wraps each rank's in a CheckpointException)."""
    if isinstance(error, CheckpointException):
        causes = [str(exc).removeprefix("Worker failure: ") for exc, _ in error.failures.values()]
        return next((c for c in causes if "[Errno" in c), causes[0] if causes else type(error).__name__)
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def load(
    checkpoint: Path,
    model: list[torch.nn.Module],
    optimizer: MegatronOptimizer,
    scheduler: OptimizerParamScheduler,
    dims: ParallelDims,
) -> Progress:
    """Restore everything `save` wrote into already-built model, optimizer and scheduler; returns the progress."""
    saved_layout = dist_checkpointing.load_common_state_dict(str(checkpoint))["layout"]
    same_layout = saved_layout == {"tp": dims.tp, "pp": dims.pp, "dp": dims.dp, "vp": dims.vp}
    megatron_compat.prepare_torch_adam_for_load(optimizer)
    progress = Progress()
    request = _state_dict(model, optimizer, scheduler, progress, dims, is_loading=True, with_rng=same_layout)
    state = dist_checkpointing.load(request, str(checkpoint))
    for i, chunk in enumerate(unwrap_model(model)):
        chunk.load_state_dict(state["model"][f"chunk{i}"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if same_layout:
        _set_rng_state(state["rng"])
    return Progress(**state["progress"])
