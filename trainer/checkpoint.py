"""Distributed checkpoints (megatron-core dist_checkpointing): save, find the newest complete one, resume.

Layout under the checkpoint directory:
    iter_0000200/   one checkpoint: model, optimizer, LR scheduler, RNG states, step, consumed samples, and a
                    record of the model (its config), so that it can be rebuilt without the run's config
    latest          the name of the newest complete checkpoint, rewritten last
A checkpoint is written to `iter_NNNNNNN.tmp` and renamed when every rank has finished, so a crash never leaves
a half-written `iter_*` directory. Tensors are stored by global name and offset, so a checkpoint saved at one
(TP, PP, DP) loads at any other; RNG states only come back at the layout they were saved at. A weights-only
checkpoint (`python -m trainer convert` writes them) holds the model and its record alone.

A DeepSpeed checkpoint (`engine: deepspeed`, trainer/deepspeed_checkpoint.py) resolves, records its model and
gives its weights the same way here, at any layout; megatron's engine takes its weights only.
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

from trainer import deepspeed_checkpoint, megatron_compat, parallel, weights
from trainer import model as llama
from trainer.config import ModelConfig, TrainConfig
from trainer.parallel import ParallelDims

LATEST = "latest"
# Optimizer state stored per parameter in model space (gathered over DP to save): loads at any layout.
_OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, or holds another model than the one asked for."""


@dataclass
class Progress:
    """Where training stands: what a resumed run continues from."""

    step: int = 0
    consumed_samples: int = 0


@dataclass(frozen=True)
class ModelRecord:
    """What a checkpoint records about its model: enough to rebuild it without the run's config (score,
    convert) and to refuse a config it does not fit."""

    config: ModelConfig  # vocab_size set (the tokenizer's where the run's config left it unset)
    seq_length: int  # the sequence length it was trained at; converted: the source's maximum
    hf_config: dict | None = None  # the Hugging Face config.json it was converted from, if it was

    def to_dict(self) -> dict:
        return {
            "config": self.config.model_dump(),
            "seq_length": self.seq_length,
            "hf_config": self.hf_config,
        }

    @classmethod
    def from_dict(cls, saved: dict) -> ModelRecord:
        return cls(ModelConfig(**saved["config"]), saved["seq_length"], saved["hf_config"])


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
        "progress": {"step": progress.step, "consumed_samples": progress.consumed_samples},
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
    *,
    weights_only: bool = False,
) -> Progress:
    """Restore everything `save` wrote into already-built model, optimizer and scheduler; returns the progress.
    With weights_only, or from a weights-only or DeepSpeed checkpoint, the model alone: training starts at step 0."""
    deepspeed = deepspeed_checkpoint.is_deepspeed_checkpoint(checkpoint)
    common = {} if deepspeed else dist_checkpointing.load_common_state_dict(str(checkpoint))
    if weights_only or "scheduler" not in common:
        load_weights(checkpoint, model)
        optimizer.reload_model_params()  # its fp32 master weights were copied from the initialization
        return Progress()
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
    """The model's weights alone, at this rank's layout, whatever the layout (or engine) they were saved at."""
    if deepspeed_checkpoint.is_deepspeed_checkpoint(checkpoint):
        weights.load_into(model, deepspeed_checkpoint.full_weights(checkpoint).__getitem__)
        return
    state = dist_checkpointing.load({"model": _model_state(model)}, str(checkpoint))
    for i, chunk in enumerate(unwrap_model(model)):
        chunk.load_state_dict(state["model"][f"chunk{i}"])


def resolve(path: str | Path) -> Path:
    """A checkpoint directory itself, or the one a directory of checkpoints names in `latest`."""
    path = Path(path)
    if (path / "metadata.json").is_file() or deepspeed_checkpoint.is_deepspeed_checkpoint(path):
        return path
    found = latest_checkpoint(path)
    if found is None:
        state = (
            "does not exist"
            if not path.exists()
            else "holds no checkpoint (no metadata.json or *model_states.pt, no iter_NNNNNNN/)"
        )
        raise CheckpointError(
            f"checkpoint {str(path)!r} {state}; give a checkpoint directory or a directory of them with `latest` "
            "(a run's checkpoints/, or what `python -m trainer convert` wrote)"
        )
    return found


def read_record(checkpoint: Path) -> ModelRecord | None:
    """The model record a checkpoint holds (None: saved before checkpoints carried one)."""
    try:
        if deepspeed_checkpoint.is_deepspeed_checkpoint(checkpoint):
            saved = deepspeed_checkpoint.client_state(checkpoint).get("model_record")
        else:
            saved = dist_checkpointing.load_common_state_dict(str(checkpoint)).get("model_record")
    except Exception as error:  # megatron-core and torch.load raise whatever their JSON and pickle readers do
        raise CheckpointError(
            f"checkpoint {str(checkpoint)!r} cannot be read ({type(error).__name__}: {error}): truncated, or "
            "not a trainer checkpoint; give another, or re-create it"
        ) from None
    return ModelRecord.from_dict(saved) if saved else None


def full_weights(checkpoint: Path, record: ModelRecord) -> dict[str, torch.Tensor]:
    """Every full weight of a checkpoint (trainer/weights.py's naming), in one process of a TP = PP = 1 layout:
    the model is rebuilt whole from its record to read a megatron checkpoint."""
    if deepspeed_checkpoint.is_deepspeed_checkpoint(checkpoint):
        return deepspeed_checkpoint.full_weights(checkpoint)
    cfg = weights.model_only_config(record.config, seq_length=record.seq_length)
    padded_vocab_size = record.config.padded_vocab_size(record.config.vocab_size)
    chunks = llama.build_model(cfg, llama.transformer_config(cfg, parallel.device_type()), padded_vocab_size)
    load_weights(checkpoint, chunks)
    return weights.gather(chunks)


def model_mismatches(saved: ModelConfig, wanted: ModelConfig) -> list[str]:
    """How a model config differs from the one a checkpoint holds, in what decides its weights and outputs."""

    def weights_defining(m: ModelConfig) -> dict:
        return {
            "model.num_layers": m.num_layers,
            "model.hidden_size": m.hidden_size,
            "model.ffn_hidden_size": m.ffn_hidden_size,
            "model.num_attention_heads": m.num_attention_heads,
            "model.num_query_groups": m.query_groups,
            "model.kv_channels": m.head_dim,
            "model.vocab_size": m.vocab_size,
            "padded vocabulary (model.make_vocab_size_divisible_by)": m.padded_vocab_size(m.vocab_size),
            "model.rotary_base": m.rotary_base,
            "model.rope_scaling_factor": m.rope_scaling_factor,
            "model.norm_epsilon": m.norm_epsilon,
            "model.share_embeddings_and_output_weights": m.share_embeddings_and_output_weights,
        }

    theirs, ours = weights_defining(saved), weights_defining(wanted)
    return [
        f"{key} = {ours[key]} in the config, {theirs[key]} in the checkpoint"
        for key in ours
        if ours[key] != theirs[key]
    ]


@dataclass(frozen=True)
class Start:
    """The checkpoint a run starts from, and whether it takes the weights only."""

    path: Path
    weights_only: bool
    resumed: bool  # the run's own checkpoint, rather than checkpoint.load


def starting_checkpoint(cfg: TrainConfig, *, fresh: bool = False) -> Start | None:
    """The run's own newest checkpoint takes precedence, so a restarted run (a fine-tune too) continues where it
    stopped; until it has one, checkpoint.load (its weights only with checkpoint.finetune); else None."""
    own = latest_checkpoint(cfg.checkpoint_dir) if cfg.checkpoint.resume and not fresh else None
    if own is not None:
        return Start(own, weights_only=False, resumed=True)
    if cfg.checkpoint.load:
        try:
            source = resolve(cfg.checkpoint.load)
        except CheckpointError as error:
            raise CheckpointError(f"checkpoint.load = {cfg.checkpoint.load!r}: {error}") from None
        return Start(source, weights_only=cfg.checkpoint.finetune, resumed=False)
    return None


def start_problems(cfg: TrainConfig, model: ModelConfig, *, fresh: bool = False) -> list[str]:
    """What stops a run from starting from its checkpoint: one missing, holding another model, or the run's own
    saved by the other engine (whose optimizer state this engine cannot resume)."""
    try:
        start = starting_checkpoint(cfg, fresh=fresh)
    except CheckpointError as error:
        return [str(error)]
    if start is None:
        return []
    saved_by = "deepspeed" if deepspeed_checkpoint.is_deepspeed_checkpoint(start.path) else "megatron"
    if start.resumed and saved_by != cfg.engine:
        return [
            f"resuming from {start.path}: saved by engine: {saved_by}, and this run has engine: {cfg.engine}; set "
            f"engine: {saved_by} to resume it, or start another run with checkpoint.load: {start.path} to take its "
            "weights (or convert it: python -m trainer convert)"
        ]
    where = "resuming from" if start.resumed else "checkpoint.load:"
    try:
        record = read_record(start.path)
    except CheckpointError as error:
        return [f"{where} {error}"]
    if record is None:
        return []
    return [
        f"{where} {start.path} holds another model: {mismatch}"
        for mismatch in model_mismatches(record.config, model)
    ]
