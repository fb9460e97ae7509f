"""Distributed checkpoints (megatron-core dist_checkpointing): save, find the newest complete one, resume.

Layout under the checkpoint directory:
    iter_0000200/   one checkpoint: model, optimizer, LR scheduler, RNG states, step, consumed samples, a
                    record of the model (its config), so that it can be rebuilt without the run's config, and
                    manifest.json (every file's size; small files' SHA-256), written last
    latest          the name of the newest complete checkpoint, rewritten last
A checkpoint is written to `iter_NNNNNNN.tmp` and renamed when every rank has finished, so a crash never leaves
a half-written `iter_*` directory; old ones are renamed away before they are deleted. A directory that does not
match its manifest (a copy cut short, a truncated file, garbage) is skipped with a warning, never loaded. Tensors
are stored by global name and offset, so a checkpoint saved at one (TP, PP, DP) loads at any other; RNG states
only come back at the layout they were saved at. A weights-only checkpoint (`python -m trainer convert` writes
them) holds the model and its record alone.

A DeepSpeed checkpoint (`engine: deepspeed`, trainer/checkpoint/deepspeed.py) is staged, sealed with its manifest
and published the same way (`stage`, `publish`), and resolves, records its model and gives its weights the same
way here, at any layout; megatron's engine takes its weights only.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
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
from trainer.checkpoint import deepspeed as deepspeed_checkpoint
from trainer.config import ModelConfig, TrainConfig
from trainer.distributed import megatron_compat, parallel
from trainer.distributed.parallel import ParallelDims
from trainer.model import llama, weights

LATEST = "latest"
MANIFEST = "manifest.json"
# Files up to this size are hashed as well as measured (dist_checkpointing's metadata and common state; at scale
# the tensor files are too big to hash at save time).
_HASHED_MAX_BYTES = 16 * 2**20
# Optimizer state stored per parameter in model space (gathered over DP to save): loads at any layout.
_OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, or holds another model than the one asked for."""


class CheckpointSaveError(RuntimeError):
    """A save that did not complete on every rank; nothing was published and the previous checkpoint stands."""


@dataclass
class Progress:
    """Where training stands: what a resumed run continues from."""

    step: int = 0
    consumed_samples: int = 0
    skipped_steps: int = 0  # steps skipped for a non-finite loss or gradient norm, in all


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


def write_manifest(checkpoint: Path, step: int) -> None:
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


_warned: set[str] = set()


def _warn_on_rank0(message: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0 and message not in _warned:  # once per process
        _warned.add(message)
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


def stage(directory: Path, step: int) -> Path:
    """The empty `iter_NNNNNNN.tmp` directory every rank writes step's checkpoint into (any engine's format)."""
    staging = directory / (checkpoint_name(step) + ".tmp")
    if torch.distributed.get_rank() == 0:
        for unfinished in directory.glob("iter_*.tmp"):  # left by a crash mid-save
            shutil.rmtree(unfinished)
        staging.mkdir(parents=True)
    torch.distributed.barrier()
    return staging


def publish(staging: Path, step: int, keep_last: int) -> Path:
    """Once every rank has written `staging` (and agreed so): rank 0 seals, renames and points `latest` at it,
    and prunes; every rank learns whether that worked."""
    final = staging.with_suffix("")
    failure = None
    if torch.distributed.get_rank() == 0:
        try:
            _publish(staging, final, step, keep_last)
        except OSError as error:
            failure = error
    agree_or_raise(failure, f"publishing {final}", staging)
    return final


def _publish(staging: Path, final: Path, step: int, keep_last: int) -> None:
    """Seal the staging directory with its manifest, rename it into place, point `latest` at it, prune."""
    directory = final.parent
    write_manifest(staging, step)
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


def agree_or_raise(failure: BaseException | None, doing: str, staging: Path) -> None:
    """Every rank learns whether any rank failed; if one did, all raise, after rank 0 clears the staging
    directory (freeing the space a full disk needs back). The previous checkpoint and `latest` stay as they were."""
    reports: list[dict[int, str]] = [{}] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(reports, _failures(failure) if failure is not None else {})
    failed = {rank: cause for report in reports for rank, cause in report.items()}
    if not failed:
        return
    if torch.distributed.get_rank() == 0:
        shutil.rmtree(staging, ignore_errors=True)
    # An OS error (ENOSPC, EIO, ...) says what to fix; the other ranks' errors only echo it.
    rank = next((r for r in sorted(failed) if "[Errno" in failed[r]), min(failed))
    previous = latest_checkpoint(staging.parent, warn=lambda _: None)
    kept = f"{previous.name} is intact and `latest` still names it" if previous else "no earlier checkpoint"
    raise CheckpointSaveError(
        f"{doing} failed on rank {rank}: {failed[rank]}. Nothing was published: {kept}. Fix that (free space "
        "on that file system, or set checkpoint.dir to another) and run again to resume"
    )


def _failures(error: BaseException) -> dict[int, str]:
    """The failing ranks and their errors in one line each (dist_checkpointing gathers every rank's failures
    into a CheckpointException keyed by rank)."""
    if isinstance(error, CheckpointException) and error.failures:
        return {
            rank: str(exc).removeprefix("Worker failure: ").splitlines()[0] or type(exc).__name__
            for rank, (exc, _) in error.failures.items()
        }
    return {torch.distributed.get_rank(): str(error).splitlines()[0] if str(error) else type(error).__name__}


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
        problem = damage(path)
        if problem is not None:
            raise CheckpointError(f"checkpoint {str(path)!r} is damaged, not loaded: {problem}")
        return path
    skipped: list[str] = []
    found = latest_checkpoint(path, warn=skipped.append)
    if found is None:
        if skipped:  # none loaded: say why each was refused
            raise CheckpointError(
                f"checkpoint {str(path)!r} holds no intact checkpoint: {'; '.join(skipped)}"
            )
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
    """Every full weight of a checkpoint (trainer/model/weights.py's naming), in one process of a TP = PP = 1 layout:
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
