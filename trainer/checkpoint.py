"""Distributed checkpoints (megatron-core dist_checkpointing): save, find the newest complete one, resume.

Layout under the checkpoint directory:
    iter_0000200/   one checkpoint: model, optimizer, LR scheduler, RNG states, step, consumed samples
    latest          the name of the newest complete checkpoint, rewritten last
A checkpoint is written to `iter_NNNNNNN.tmp` and renamed when every rank has finished, so a crash never leaves
a half-written `iter_*` directory. Tensors are stored by global name and offset, so a checkpoint saved at one
(TP, PP, DP) loads at any other; RNG states only come back at the layout they were saved at.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from dataclasses import dataclass
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

from trainer import megatron_compat
from trainer.parallel import ParallelDims

LATEST = "latest"
# Optimizer state stored per parameter in model space (gathered over DP to save): loads at any layout.
_OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}


@dataclass
class Progress:
    """Where training stands: what a resumed run continues from."""

    step: int = 0
    consumed_samples: int = 0


def checkpoint_name(step: int) -> str:
    return f"iter_{step:07d}"


def complete_checkpoints(directory: Path) -> list[Path]:
    """Finished checkpoints, oldest first (an unfinished one still carries its .tmp suffix)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_dir() and re.fullmatch(r"iter_\d{7}", p.name))


def latest_checkpoint(directory: Path) -> Path | None:
    """The checkpoint `latest` names; the newest complete one if the pointer is missing or dangling."""
    pointer = directory / LATEST
    if pointer.is_file():
        named = directory / pointer.read_text().strip()
        if named in complete_checkpoints(directory):
            return named
    found = complete_checkpoints(directory)
    return found[-1] if found else None


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
        "progress": {"step": progress.step, "consumed_samples": progress.consumed_samples},
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
    staging = stage(directory, progress.step)
    state = _state_dict(model, optimizer, scheduler, progress, dims, is_loading=False, with_rng=True)
    # Replicated tensors are written by the data-parallel replicas in turn rather than all by one.
    strategy = FullyParallelSaveStrategyWrapper(
        get_default_save_sharded_strategy(),
        parallel_state.get_data_parallel_group(with_context_parallel=True),
    )
    dist_checkpointing.save(state, str(staging), sharded_strategy=strategy)
    return publish(staging, keep_last)


def stage(directory: Path, step: int) -> Path:
    """The empty `iter_NNNNNNN.tmp` directory every rank writes step's checkpoint into (any engine's format)."""
    staging = directory / (checkpoint_name(step) + ".tmp")
    if torch.distributed.get_rank() == 0:
        for unfinished in directory.glob("iter_*.tmp"):  # left by a crash mid-save
            shutil.rmtree(unfinished)
        staging.mkdir(parents=True)
    torch.distributed.barrier()
    return staging


def publish(staging: Path, keep_last: int) -> Path:
    """Once every rank has written `staging`: rename it into place, point `latest` at it, prune the oldest."""
    torch.distributed.barrier()
    directory, final = staging.parent, staging.with_suffix("")
    if torch.distributed.get_rank() == 0:
        # The same step saved again (resumed from an older `latest`): swap it in, then drop the old one.
        replaced = final.with_name(final.name + ".replaced.tmp")
        if final.exists():
            final.rename(replaced)
        staging.rename(final)
        _write_atomically(directory / LATEST, final.name + "\n")
        shutil.rmtree(replaced, ignore_errors=True)
        older = [path for path in complete_checkpoints(directory) if path != final]
        for old in older[: max(0, len(older) - (keep_last - 1))]:
            shutil.rmtree(old)
    torch.distributed.barrier()
    return final


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
