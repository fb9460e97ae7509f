"""megatron-core dist_checkpointing: how `engine: megatron` saves and loads, inside the store's protocol.

Tensors are stored by global name and offset, so a checkpoint saved at one (TP, PP, DP) loads at any other; RNG
states only come back at the layout they were saved at. Each holds the model, optimizer, LR scheduler, RNG states,
progress, layout, model record, the schedule and data settings (trainer/checkpoint/settings.py) and the optimizer
format; a weights-only checkpoint (`python -m trainer convert` writes them) holds the model and its record alone.

Saves and loads are fully parallel: each data-parallel replica writes, and reads, its share of what the replicas
hold alike (FullyParallelSaveStrategyWrapper, FullyParallelLoadStrategyWrapper). A save in the background
returns once the state is copied into the writer's staging buffer (trainer/checkpoint/writer.py); it is
published, by the store's protocol, only once every rank's write has finished.
A run's saves share a `Plans`: the first save of each optimizer format plans the write (which rank writes what,
the global metadata) and checks the sharding; the ones after it reuse that plan, as Megatron-LM does with
--ckpt-assume-constant-structure (megatron/training/checkpointing.py, core_v0.16.1): a run's state has the same
tensors and shapes at every save.
The distributed optimizer's state is saved dp_reshardable (each DP rank its own buffers, no gather; loads at the
same TP x PP x VP, any DP) or fully_reshardable (gathered per parameter onto DP rank 0: any layout); a
dp_reshardable one loaded at another TP x PP x VP restores weights, progress and LR schedule, and Adam's moments
start again from zero (megatron-core 0.16.1 optimizer/distrib_optimizer.py sharded_state_dict).
A checkpoint loads whatever the layer spec on each side: `_extra_state` entries (Transformer Engine's, absent
from the local spec's checkpoints) are the only ones allowed to be absent.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.dist_checkpointing.serialization import (
    get_default_load_sharded_strategy,
    get_default_save_sharded_strategy,
)
from megatron.core.dist_checkpointing.strategies.base import AsyncSaveShardedStrategy
from megatron.core.dist_checkpointing.strategies.fully_parallel import (
    FullyParallelLoadStrategyWrapper,
    FullyParallelSaveStrategyWrapper,
)
from megatron.core.dist_checkpointing.validation import StrictHandling
from megatron.core.optimizer import MegatronOptimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.utils import unwrap_model
from torch.distributed.checkpoint.api import CheckpointException

from trainer import faults
from trainer.checkpoint import digest
from trainer.checkpoint.record import ModelRecord
from trainer.checkpoint.settings import KEY as SETTINGS
from trainer.checkpoint.store import CheckpointError, Progress, agree_or_raise, stage
from trainer.checkpoint.writer import Write, Writer, install_results_queue
from trainer.config import ParallelDims
from trainer.distributed import megatron_compat
from trainer.model import llama, weights

ENGINE = "megatron"
# What checkpoints saved before the trainer recorded its optimizer format used: loads at any layout.
_DEFAULT_OPTIMIZER_FORMAT = "fully_reshardable"
# Transformer Engine's modules keep FP8 metadata under these keys; the local spec has none.
_EXTRA_STATE = "_extra_state"


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
    settings: dict | None = None,
    optimizer_format: str = _DEFAULT_OPTIMIZER_FORMAT,
) -> dict:
    model_state = _model_state(model)
    state: dict[str, Any] = {
        "model": model_state,
        "progress": asdict(progress),
        "layout": _layout(dims),
        "model_record": record.to_dict() if record else None,
    }
    if optimizer is not None:  # None: a weights-only checkpoint
        assert scheduler is not None  # an optimizer's state is saved and loaded with its LR schedule
        metadata = {"distrib_optim_sharding_type": optimizer_format}
        state["optimizer"] = optimizer.sharded_state_dict(
            model_state, is_loading=is_loading, metadata=metadata
        )
        state["scheduler"] = scheduler.state_dict()
        state["optimizer_format"] = optimizer_format
        state[SETTINGS] = settings
    if with_rng:
        rank = torch.distributed.get_rank()
        state["rng"] = ShardedObject("rng_state", _rng_state(), (dims.world_size,), (rank,), replica_id=0)
    return state


def _layout(dims: ParallelDims) -> dict:
    return {"tp": dims.tp, "pp": dims.pp, "dp": dims.dp, "vp": dims.vp}


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


@dataclass
class Plans:
    """What a run's saves keep between them: one save strategy per optimizer format, whose cached plans (megatron-
    core 0.16.1 TorchDistSaveShardedStrategy `use_cached_ckpt_structure`, FullyParallelSaveStrategyWrapper
    `do_cache_distribution`) skip the planning collectives after the first save. Valid while the state's structure
    stays (one model and optimizer per process)."""

    strategies: dict[str, AsyncSaveShardedStrategy] = field(default_factory=dict)

    def strategy(self, optimizer_format: str) -> tuple[AsyncSaveShardedStrategy, bool]:
        """The strategy for saves in this format, and whether this is its first save (whose sharding is checked:
        dist_checkpointing.save's validate_access_integrity, a gather of every rank's shard metadata)."""
        if optimizer_format in self.strategies:
            return self.strategies[optimizer_format], False
        strategy = get_default_save_sharded_strategy()
        strategy.use_cached_ckpt_structure = True
        replicas = parallel_state.get_data_parallel_group(with_context_parallel=True)
        # Replicated tensors are written by the data-parallel replicas in turn rather than all by one. Without
        # replicas the wrapper has nothing to share out, caches no distribution and so re-checks the sharding at
        # every save (megatron-core 0.16.1 exchange_utils.py determine_main_replica_uniform_distribution returns
        # None for a group of one; fully_parallel.py apply_saving_parallelization): it is left out.
        if torch.distributed.get_world_size(replicas) > 1:
            strategy = FullyParallelSaveStrategyWrapper(strategy, replicas, do_cache_distribution=True)
        self.strategies[optimizer_format] = strategy
        return strategy, True


def save(
    directory: Path,
    model: list[torch.nn.Module],
    optimizer: MegatronOptimizer | None,
    scheduler: OptimizerParamScheduler | None,
    progress: Progress,
    dims: ParallelDims,
    record: ModelRecord,
    *,
    settings: dict | None = None,
    optimizer_format: str = _DEFAULT_OPTIMIZER_FORMAT,
    writer: Writer | None = None,
    plans: Plans | None = None,
) -> Write:
    """Start saving on every rank into the staging directory; `finish()` on the result publishes it (rename into
    place, point `latest` at it). With a writer, in the background: this returns once the state is copied into
    the writer's staging buffer. Without optimizer and scheduler it saves the weights only.
    `plans`: the run's, reused from its earlier saves (None: a one-off save, planned afresh)."""
    digest.install()  # every tensor file hashed as it is written
    install_results_queue()
    staging = stage(directory, progress.step)
    state = _state_dict(
        model,
        optimizer,
        scheduler,
        progress,
        dims,
        record,
        is_loading=False,
        with_rng=optimizer is not None,
        settings=settings,
        optimizer_format=optimizer_format,
    )
    plans = plans or Plans()
    strategy, first = plans.strategy(optimizer_format if optimizer is not None else "weights")
    saved_format = optimizer_format if optimizer is not None else None
    write = Write(staging, progress.step, optimizer_format=saved_format)
    # A synchronous save writes here, in processes forked from this one: they inherit TRAINSTACK_FAULT's save
    # faults (the background writer applies them itself).
    with faults.inject_in_save(progress.step):
        try:
            request = dist_checkpointing.save(
                state,
                str(staging),
                sharded_strategy=strategy,
                async_sharded_save=writer is not None,
                validate_access_integrity=first,
            )
        except (CheckpointException, OSError) as error:
            write.failure, request = error, None
        if writer is not None:
            # Every rank has planned its write, or every rank stops here alike; agreed before any writer starts.
            agree_or_raise(write.failure, f"saving step {progress.step} to {staging}", staging)
            writer.schedule(write, request)
    return write


def load(
    checkpoint: Path,
    model: list[torch.nn.Module],
    optimizer: MegatronOptimizer,
    scheduler: OptimizerParamScheduler,
    dims: ParallelDims,
) -> Progress:
    """Restore everything `save` wrote into already-built model, optimizer and scheduler; returns the progress."""
    common = saved_state(checkpoint)
    saved_layout = common["layout"]
    same_layout = saved_layout == _layout(dims)
    optimizer_format = common.get("optimizer_format", _DEFAULT_OPTIMIZER_FORMAT)
    # dp_reshardable holds the distributed optimizer's own buffers per TP x PP x VP domain: any DP, nothing else.
    with_optimizer = optimizer_format != "dp_reshardable" or all(
        saved_layout[key] == value for key, value in _layout(dims).items() if key != "dp"
    )
    megatron_compat.prepare_torch_adam_for_load(optimizer)
    progress = Progress()
    request = _state_dict(
        model,
        optimizer if with_optimizer else None,
        scheduler,
        progress,
        dims,
        None,
        is_loading=True,
        with_rng=same_layout,
        optimizer_format=optimizer_format,
    )
    if not with_optimizer:
        request["scheduler"] = scheduler.state_dict()
    state = _load(request, checkpoint)
    _load_model(model, state["model"])
    if with_optimizer:
        # Without grad: dp_reshardable's load copies into parameters that require grad, and megatron-core 0.16.1
        # leaves it outside no_grad (optimizer/distrib_optimizer.py load_parameter_state_from_dp_reshardable has no
        # @torch.no_grad(), unlike load_parameter_state_from_fs_model_space beside it).
        with torch.no_grad():
            optimizer.load_state_dict(state["optimizer"])
    else:
        optimizer.reload_model_params()  # fp32 masters from the loaded weights; Adam's moments start from zero
        if torch.distributed.get_rank() == 0:
            print(
                f"{checkpoint} holds the optimizer state as dp_reshardable at {saved_layout}, this run is "
                f"{_layout(dims)}: restored the weights, step and LR schedule; Adam's moments start again from "
                "zero (save with checkpoint.optimizer_format=fully_reshardable before changing TP, PP or VP)",
                flush=True,
            )
    scheduler.load_state_dict(state["scheduler"])
    if same_layout:
        _set_rng_state(state["rng"])
    return Progress(**state["progress"])


def load_weights(checkpoint: Path, model: list[torch.nn.Module]) -> None:
    """The model's weights alone, at this rank's layout, whatever the layout they were saved at."""
    _load_model(model, _load({"model": _model_state(model)}, checkpoint)["model"])


def _load(request: dict, checkpoint: Path) -> dict:
    """dist_checkpointing.load, fully parallel over the data-parallel replicas (each reads its share of what they
    hold alike, then they exchange it); entries only Transformer Engine's modules have (`_extra_state`) may be
    absent from the checkpoint, nothing else."""
    strategy = FullyParallelLoadStrategyWrapper(
        get_default_load_sharded_strategy(str(checkpoint)),
        parallel_state.get_data_parallel_group(with_context_parallel=True),
    )
    # RETURN_UNEXPECTED: what the request asks for and the checkpoint lacks ("unexpected") is dropped from the
    # request and returned; the checkpoint's entries nobody asked for ("missing") are ignored (megatron-core
    # 0.16.1 dist_checkpointing/validation.py StrictHandling, serialization.py load).
    state, _, absent = dist_checkpointing.load(
        request, str(checkpoint), sharded_strategy=strategy, strict=StrictHandling.RETURN_UNEXPECTED
    )
    refused = sorted(key for key in absent if not _is_extra_state(key))
    if refused:
        raise CheckpointError(
            f"checkpoint {str(checkpoint)!r} lacks {len(refused)} entries this model needs, e.g. "
            f"{', '.join(refused[:3])}: saved from another model or truncated"
        )
    return state


def _is_extra_state(key: str) -> bool:
    return key.split("/", 1)[0].endswith(_EXTRA_STATE)


def _load_model(model: list[torch.nn.Module], state: dict) -> None:
    """Each chunk's loaded weights into it; its `_extra_state` entries may be absent (strict otherwise)."""
    for i, chunk in enumerate(unwrap_model(model)):
        result = chunk.load_state_dict(state[f"chunk{i}"], strict=False)
        missing = [key for key in result.missing_keys if not key.endswith(_EXTRA_STATE)]
        if missing or result.unexpected_keys:
            raise CheckpointError(
                f"model chunk {i}: weights missing {missing[:3]}, unexpected {result.unexpected_keys[:3]}"
            )


def full_weights(path: Path, record: ModelRecord | None) -> dict[str, torch.Tensor]:
    """Every full weight (trainer/model/weights.py's naming), in one process of a TP = PP = 1 layout: the model
    is rebuilt whole from its record to read the checkpoint."""
    if record is None:
        raise CheckpointError(
            f"checkpoint {str(path)!r} records no model config (saved before checkpoints did)"
        )
    cfg = weights.model_only_config(record.config, seq_length=record.seq_length)
    chunks = llama.build(cfg).chunks
    load_weights(path, chunks)
    return weights.gather(chunks)
