"""Reading a DeepSpeed checkpoint (what `engine: deepspeed` saves, trainer/engines/deepspeed.py) without DeepSpeed's
engine or a process group: the trainer's entries of its client state, and its full fp32 weights.

    iter_NNNNNNN/*model_states.pt   DeepSpeed's module file(s), each with the trainer's client state: progress,
                                    LR schedule, ZeRO layout, model record (a converted one: the record alone)
    iter_NNNNNNN/*optim_states.pt   one ZeRO shard of the fp32 master weights and Adam's moments per rank
"""

from __future__ import annotations

from pathlib import Path

import torch

from trainer.model import llama as model


def is_deepspeed_checkpoint(path: Path) -> bool:
    return any(path.glob("*model_states.pt"))


def client_state(path: Path) -> dict:
    """The trainer's own entries: `model_record` always; `progress`, `scheduler`, `layout` unless weights only."""
    files = sorted(path.glob("*model_states.pt"))  # ZeRO-3 writes one per rank, each with the client state
    if not files:
        raise FileNotFoundError(f"{path} is not a DeepSpeed checkpoint: no *model_states.pt in it")
    state = torch.load(files[0], map_location="cpu", weights_only=False)
    return {key: state[key] for key in ("model_record", "progress", "scheduler", "layout") if key in state}


def full_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every weight in full fp32, in trainer/model/weights.py's naming: DeepSpeed's zero_to_fp32 merges the ZeRO shards
    of any stage and data-parallel size."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint  # imports DeepSpeed

    state = get_fp32_state_dict_from_zero_checkpoint(str(path.parent), tag=path.name)
    # The engine wraps the model whole (TP = PP = 1): its names are global ones already.
    return {model.local_spec_name(name): tensor.contiguous() for name, tensor in state.items()}
