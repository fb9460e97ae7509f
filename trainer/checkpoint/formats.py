"""The one dispatch on a checkpoint directory's format (megatron's dist_checkpointing or DeepSpeed's): every path
that reads a checkpoint it did not save itself (resume across engines, checkpoint.load, score, convert) asks here.
Each format module gives what `Format` declares (mypy checks the modules against it)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from trainer.checkpoint import deepspeed, megatron
from trainer.checkpoint.record import ModelRecord
from trainer.checkpoint.store import CheckpointError, damage, latest_checkpoint
from trainer.model import weights


class Format(Protocol):
    """A checkpoint format, as a module of trainer/checkpoint/ gives it (megatron.py, deepspeed.py): the engine
    that saves it, whether a directory holds one, what it saved besides tensors, and its full weights."""

    ENGINE: str

    def is_checkpoint(self, path: Path) -> bool: ...

    def saved_state(self, path: Path) -> dict: ...

    def full_weights(self, path: Path, record: ModelRecord | None) -> dict[str, torch.Tensor]: ...


FORMATS: tuple[Format, ...] = (megatron, deepspeed)


def format_of(path: Path) -> Format | None:
    """The module that reads this checkpoint directory; None when it is none of theirs."""
    return next((f for f in FORMATS if f.is_checkpoint(path)), None)


def saved_by(path: Path) -> str:
    """The engine whose format a checkpoint directory holds."""
    return (format_of(path) or megatron).ENGINE


def saved_state(path: Path) -> dict:
    """What a checkpoint saved besides tensors (model_record; progress, scheduler, layout unless weights only)."""
    try:
        return (format_of(path) or megatron).saved_state(
            path
        )  # neither: megatron's reader says what is wrong
    except Exception as error:  # megatron-core and torch.load raise whatever their JSON and pickle readers do
        raise CheckpointError(
            f"checkpoint {str(path)!r} cannot be read ({type(error).__name__}: {error}): truncated, or "
            "not a trainer checkpoint; give another, or re-create it"
        ) from None


def read_record(path: Path) -> ModelRecord | None:
    """The model record a checkpoint holds (None: saved before checkpoints carried one)."""
    saved = saved_state(path).get("model_record")
    return ModelRecord.from_dict(saved) if saved else None


def full_weights(path: Path, record: ModelRecord | None) -> dict[str, torch.Tensor]:
    """Every full weight of a checkpoint of any format, in trainer/model/weights.py's naming (megatron's needs
    the record to rebuild the model; DeepSpeed's names are global and need none)."""
    return _format(path).full_weights(path, record)


def load_weights(path: Path, chunks: list[torch.nn.Module]) -> None:
    """A checkpoint's weights alone into this rank's megatron chunks, whatever the format and layout they were
    saved at."""
    if format_of(path) is megatron:
        megatron.load_weights(path, chunks)
    else:
        weights.load_into(chunks, full_weights(path, read_record(path)).__getitem__)


def resolve(path: str | Path) -> Path:
    """A checkpoint directory itself, or the one a directory of checkpoints names in `latest`."""
    path = Path(path)
    if format_of(path) is not None:
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


def _format(path: Path) -> Format:
    found = format_of(path)
    if found is None:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is neither megatron's (metadata.json) nor DeepSpeed's (*model_states.pt)"
        )
    return found
