"""Which checkpoint a run starts from, and what stops it from starting there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainer.checkpoint import formats
from trainer.checkpoint.record import model_mismatches
from trainer.checkpoint.store import CheckpointError, latest_checkpoint
from trainer.config import ModelConfig, TrainConfig


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
            source = formats.resolve(cfg.checkpoint.load)
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
    saved_by = formats.saved_by(start.path)
    if start.resumed and saved_by != cfg.engine:
        return [
            f"resuming from {start.path}: saved by engine: {saved_by}, and this run has engine: {cfg.engine}; set "
            f"engine: {saved_by} to resume it, or start another run with checkpoint.load: {start.path} to take its "
            "weights (or convert it: python -m trainer convert)"
        ]
    where = "resuming from" if start.resumed else "checkpoint.load:"
    try:
        record = formats.read_record(start.path)
    except CheckpointError as error:
        return [f"{where} {error}"]
    if record is None:
        return []
    return [
        f"{where} {start.path} holds another model: {mismatch}"
        for mismatch in model_mismatches(record.config, model)
    ]
