"""Which checkpoint a run starts from, and what stops it from starting there."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainer.checkpoint.record import ModelRecord, model_mismatches
from trainer.checkpoint.settings import ALLOW, KEY, setting_changes
from trainer.checkpoint.store import CheckpointError, damaged_checkpoints, latest_checkpoint
from trainer.config import ModelConfig, TrainConfig


@dataclass(frozen=True)
class Start:
    """The checkpoint a run starts from, and whether it takes the weights only."""

    path: Path
    weights_only: bool
    resumed: bool  # the run's own checkpoint, rather than checkpoint.load


def starting_checkpoint(
    cfg: TrainConfig, *, fresh: bool = False, damaged: Mapping[Path, str] | None = None
) -> Start | None:
    """The run's own newest checkpoint takes precedence, so a restarted run (a fine-tune too) continues where it
    stopped; until it has one, checkpoint.load (its weights only with checkpoint.finetune); else None. When the
    run has checkpoints and none is intact it refuses (CheckpointError) rather than start over. `damaged`: the
    run's own checkpoints found damaged already (by a full check), with what is wrong."""
    resume = cfg.checkpoint.resume and not fresh
    damaged = damaged or {}
    own = latest_checkpoint(cfg.checkpoint_dir, exclude=damaged.keys()) if resume else None
    if resume and own is None and (none_intact := damaged_checkpoints(cfg.checkpoint_dir, damaged)):
        raise CheckpointError(_none_intact(cfg.checkpoint_dir, none_intact))
    if own is not None:
        return Start(own, weights_only=False, resumed=True)
    if cfg.checkpoint.load:
        from trainer.checkpoint import formats  # its readers import torch: only where a checkpoint is read

        try:
            source = formats.resolve(cfg.checkpoint.load)
        except CheckpointError as error:
            raise CheckpointError(f"checkpoint.load = {cfg.checkpoint.load!r}: {error}") from None
        return Start(source, weights_only=cfg.checkpoint.finetune, resumed=False)
    return None


def _none_intact(directory: Path, damaged: Mapping[Path, str]) -> str:
    named = "; ".join(f"{path.name}: {problem}" for path, problem in damaged.items())
    return (
        f"{directory} holds checkpoints and none is intact ({named}). Nothing was deleted: restore one (from the "
        "checkpoints bucket's versions, or a copy), or start over with make train FRESH=1 (train --fresh), which "
        "removes them"
    )


def start_problems(cfg: TrainConfig, model: ModelConfig, *, fresh: bool = False) -> list[str]:
    """What stops a run from starting from its checkpoint: one missing, holding another model, the run's own
    saved by the other engine (whose optimizer state this engine cannot resume), or a resume whose config changes
    the schedule or data settings the checkpoint was trained under (unless checkpoint.allow_schedule_change)."""
    try:
        start = starting_checkpoint(cfg, fresh=fresh)
    except CheckpointError as error:
        return [str(error)]
    if start is None:
        return []
    from trainer.checkpoint import formats  # its readers import torch: only where a checkpoint is read

    saved_by = formats.saved_by(start.path)
    if start.resumed and saved_by != cfg.engine:
        return [
            f"resuming from {start.path}: saved by engine: {saved_by}, and this run has engine: {cfg.engine}; set "
            f"engine: {saved_by} to resume it, or start another run with checkpoint.load: {start.path} to take its "
            "weights (or convert it: python -m trainer convert)"
        ]
    where = "resuming from" if start.resumed else "checkpoint.load:"
    try:
        saved = formats.saved_state(start.path)
    except CheckpointError as error:
        return [f"{where} {error}"]
    record = ModelRecord.from_dict(saved["model_record"]) if saved.get("model_record") else None
    problems = [
        f"{where} {start.path} holds another model: {mismatch}"
        for mismatch in (model_mismatches(record.config, model) if record is not None else [])
    ]
    # Only a checkpoint whose LR schedule and progress the run continues from: not weights taken alone.
    if not start.weights_only and "scheduler" in saved and not cfg.checkpoint.allow_schedule_change:
        problems += [
            f"{where} {start.path} was trained with other settings: {change}; put the checkpoint's value back, "
            f"or set {ALLOW}=true (train --allow-schedule-change) to continue under the config's"
            for change in setting_changes(saved.get(KEY) or {}, cfg)
        ]
    return problems
