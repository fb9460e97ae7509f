"""megatron-core dist_checkpointing: how `engine: megatron` saves and loads, inside the store's protocol.

Tensors are stored by global name and offset, so a checkpoint saved at one (TP, PP, DP) loads at any other; RNG
states only come back at the layout they were saved at. Each holds the model, optimizer, LR scheduler, RNG states,
progress, layout and model record; a weights-only checkpoint (`python -m trainer convert` writes them) holds the
model and its record alone.
"""

from __future__ import annotations

import random
from dataclasses import asdict
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

from trainer import faults
from trainer.checkpoint.record import ModelRecord
from trainer.checkpoint.store import Progress, agree_or_raise, publish, stage
from trainer.distributed import megatron_compat
from trainer.distributed.parallel import ParallelDims
from trainer.model import llama, weights

ENGINE = "megatron"
# Optimizer state stored per parameter in model space (gathered over DP to save): loads at any layout.
_OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}


def is_checkpoint(path: Path) -> bool:
    return (path / "metadata.json").is_file()


def saved_state(path: Path) -> dict:
    """What a checkpoint saved besides tensors: model_record, and unless weights only progress, scheduler, layout."""
    return dist_checkpointing.load_common_state_dict(str(path))


def _model_state(model: list[torch.nn.Module]) -> dict:
    return {f"chunk{i}": chunk.sharded_state_dict() for i, chunk in enumerate(unwrap_model(model))}


def _state_dict(
    model: list[torch.nn.Module],
    optimizer: MegatronOptimizer | None,
    scheduler: OptimizerParamScheduler | None,
    progress: Progress,
    dims: ParallelDims,
    record: ModelRecord | None,
    *,
    is_loading: bool,
    with_rng: bool,
) -> dict:
    model_state = _model_state(model)
    state = {
        "model": model_state,
        "progress": asdict(progress),
        "layout": {"tp": dims.tp, "pp": dims.pp, "dp": dims.dp, "vp": dims.vp},
        "model_record": record.to_dict() if record else None,
    }
    if optimizer is not None:  # None: a weights-only checkpoint
        state["optimizer"] = optimizer.sharded_state_dict(
            model_state, is_loading=is_loading, metadata=_OPTIMIZER_METADATA
        )
        state["scheduler"] = scheduler.state_dict()
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
    optimizer: MegatronOptimizer | None,
    scheduler: OptimizerParamScheduler | None,
    progress: Progress,
    dims: ParallelDims,
    keep_last: int,
    record: ModelRecord,
) -> Path:
    """Save on every rank, then publish: rename into place, point `latest` at it, drop the oldest beyond keep_last.
    Without optimizer and scheduler it saves the weights only."""
    staging = stage(directory, progress.step)
    state = _state_dict(
        model, optimizer, scheduler, progress, dims, record, is_loading=False, with_rng=optimizer is not None
    )
    # Replicated tensors are written by the data-parallel replicas in turn rather than all by one.
    strategy = FullyParallelSaveStrategyWrapper(
        get_default_save_sharded_strategy(),
        parallel_state.get_data_parallel_group(with_context_parallel=True),
    )
    try:
        with faults.inject_in_save(progress.step):
            dist_checkpointing.save(state, str(staging), sharded_strategy=strategy)
        failure = None
    except (CheckpointException, OSError) as error:
        failure = error
    agree_or_raise(failure, f"saving step {progress.step} to {staging}", staging)
    return publish(staging, progress.step, keep_last)


def load(
    checkpoint: Path,
    model: list[torch.nn.Module],
    optimizer: MegatronOptimizer,
    scheduler: OptimizerParamScheduler,
    dims: ParallelDims,
) -> Progress:
    """Restore everything `save` wrote into already-built model, optimizer and scheduler; returns the progress."""
    common = saved_state(checkpoint)
    same_layout = common["layout"] == {"tp": dims.tp, "pp": dims.pp, "dp": dims.dp, "vp": dims.vp}
    megatron_compat.prepare_torch_adam_for_load(optimizer)
    progress = Progress()
    request = _state_dict(
        model, optimizer, scheduler, progress, dims, None, is_loading=True, with_rng=same_layout
    )
    state = dist_checkpointing.load(request, str(checkpoint))
    for i, chunk in enumerate(unwrap_model(model)):
        chunk.load_state_dict(state["model"][f"chunk{i}"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if same_layout:
        _set_rng_state(state["rng"])
    return Progress(**state["progress"])


def load_weights(checkpoint: Path, model: list[torch.nn.Module]) -> None:
    """The model's weights alone, at this rank's layout, whatever the layout they were saved at."""
    state = dist_checkpointing.load({"model": _model_state(model)}, str(checkpoint))
    for i, chunk in enumerate(unwrap_model(model)):
        chunk.load_state_dict(state["model"][f"chunk{i}"])


def full_weights(checkpoint: Path, record: ModelRecord) -> dict[str, torch.Tensor]:
    """Every full weight (trainer/model/weights.py's naming), in one process of a TP = PP = 1 layout: the model
    is rebuilt whole from its record to read the checkpoint."""
    cfg = weights.model_only_config(record.config, seq_length=record.seq_length)
    chunks = llama.build(cfg).chunks
    load_weights(checkpoint, chunks)
    return weights.gather(chunks)
