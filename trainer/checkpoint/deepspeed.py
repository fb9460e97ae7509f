"""DeepSpeed's checkpoint format (what `engine: deepspeed` saves), inside the store's protocol; read here without
DeepSpeed's engine or a process group.

    iter_NNNNNNN/*model_states.pt   DeepSpeed's module file(s), each with the trainer's client state: progress,
                                    LR schedule, ZeRO layout, model record (a converted one: the record alone)
    iter_NNNNNNN/*optim_states.pt   one ZeRO shard of the fp32 master weights and Adam's moments per rank
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trainer.checkpoint.record import ModelRecord
from trainer.checkpoint.settings import KEY as SETTINGS
from trainer.checkpoint.store import stage
from trainer.checkpoint.writer import Write
from trainer.model import llama

if TYPE_CHECKING:
    import deepspeed

ENGINE = "deepspeed"


def is_checkpoint(path: Path) -> bool:
    return any(path.glob("*model_states.pt"))


def saved_state(path: Path) -> dict:
    """The trainer's own entries: `model_record` always; `progress`, `scheduler`, `layout`, the schedule and data
    settings (trainer/checkpoint/settings.py) unless weights only."""
    files = sorted(path.glob("*model_states.pt"))  # ZeRO-3 writes one per rank, each with the client state
    if not files:
        raise FileNotFoundError(f"{path} is not a DeepSpeed checkpoint: no *model_states.pt in it")
    state = torch.load(files[0], map_location="cpu", weights_only=False)
    kept = ("model_record", "progress", "scheduler", "layout", SETTINGS)
    return {key: state[key] for key in kept if key in state}


def full_weights(path: Path, record: ModelRecord | None = None) -> dict[str, torch.Tensor]:
    """Every weight in full fp32, in trainer/model/weights.py's naming: DeepSpeed's zero_to_fp32 merges the ZeRO
    shards of any stage and data-parallel size (the record is not needed: the names are global already)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint  # imports DeepSpeed

    state = get_fp32_state_dict_from_zero_checkpoint(str(path.parent), tag=path.name)
    # The engine wraps the model whole (TP = PP = 1): its names are global ones already.
    return {llama.local_spec_name(name): tensor.contiguous() for name, tensor in state.items()}


def save(engine: deepspeed.DeepSpeedEngine, directory: Path, step: int, client_state: dict) -> Write:
    """DeepSpeed's checkpoint of this step, written into the store's staging directory; `finish()` publishes it."""
    staging = stage(directory, step)
    try:
        engine.save_checkpoint(
            str(staging.parent), tag=staging.name, client_state=client_state, save_latest=False
        )
        failure = None
    except OSError as error:
        failure = error
    return Write(staging, step, failure=failure)
