"""The DeepSpeed config of an `engine: deepspeed` run: derived from the trainer's config tree, never kept by hand.

Batch sizes, precision, clipping and the ZeRO stage and offload come from the trainer's keys; the `deepspeed:`
section adds raw DeepSpeed keys on top (say `zero_optimization.overlap_comm`). A raw key that sets a derived
value differently, or a section the trainer owns (its AdamW, its LR schedule, megatron's recompute), is refused
with the trainer key to change instead. The merged result is validated by DeepSpeed's own config model
(`deepspeed.runtime.config.DeepSpeedConfig` and its pydantic sections), plus a check that every top-level key is
one DeepSpeed reads, so a misspelt key fails before any process starts rather than being ignored.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import KeysView
from typing import Any

from pydantic import ValidationError

from trainer.config import TrainConfig

# Raw sections that the trainer provides itself, and the trainer key that sets each instead.
_OWNED_SECTIONS = {
    "optimizer": "optimizer.* (the trainer's AdamW)",
    "scheduler": "schedule.* (the trainer's warmup + decay)",
    "fp16": "precision (bf16 or fp32)",
    "activation_checkpointing": "parallel.recompute (megatron's recompute inside the model)",
}


def derived_config(cfg: TrainConfig, data_parallel_size: int, *, torch_optimizer_offload: bool) -> dict:
    """The DeepSpeed keys that follow from the trainer's config at this data-parallel size.

    `torch_optimizer_offload`: the optimizer given to DeepSpeed is torch's AdamW while its states live on the host
    (CPU-only machines); DeepSpeed otherwise insists on its compiled CPU Adam there."""
    s, z = cfg.schedule, cfg.zero
    zero: dict[str, Any] = {"stage": z.stage}
    if z.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": z.offload_optimizer}
    if z.offload_param != "none":
        zero["offload_param"] = {"device": z.offload_param}
    config = {
        "train_batch_size": s.global_batch_size,
        "train_micro_batch_size_per_gpu": s.micro_batch_size,
        "gradient_accumulation_steps": s.global_batch_size // (s.micro_batch_size * data_parallel_size),
        "gradient_clipping": cfg.optimizer.clip_grad,
        "bf16": {"enabled": cfg.precision == "bf16"},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,  # torch's AdamW is not on DeepSpeed's list
        "steps_per_print": 2**31 - 1,  # the trainer logs its own metrics
    }
    if torch_optimizer_offload:
        config["zero_force_ds_cpu_optimizer"] = False
    return config


def _conflicts(derived: dict, raw: dict, path: str = "") -> list[str]:
    problems = []
    for key, value in raw.items():
        dotted = f"{path}{key}"
        if not path and key in _OWNED_SECTIONS:
            problems.append(f"deepspeed.{key} is set by the trainer; use {_OWNED_SECTIONS[key]} instead")
        elif isinstance(derived.get(key), dict) and isinstance(value, dict):
            problems += _conflicts(derived[key], value, f"{dotted}.")
        elif key in derived and derived[key] != value:
            problems.append(
                f"deepspeed.{dotted} = {value!r} conflicts with {derived[key]!r}, which the trainer derives from "
                f"{_DERIVED_FROM.get(dotted, 'its config')}; change that key instead, or drop this one"
            )
    return problems


_DERIVED_FROM = {
    "train_batch_size": "schedule.global_batch_size",
    "train_micro_batch_size_per_gpu": "schedule.micro_batch_size",
    "gradient_accumulation_steps": "schedule.global_batch_size / (schedule.micro_batch_size x data parallel size)",
    "gradient_clipping": "optimizer.clip_grad",
    "bf16.enabled": "precision",
    "zero_optimization.stage": "zero.stage",
    "zero_optimization.offload_optimizer.device": "zero.offload_optimizer",
    "zero_optimization.offload_param.device": "zero.offload_param",
}


def merged_config(derived: dict, raw: dict) -> dict:
    """The derived keys with the raw `deepspeed:` ones merged over them, section by section."""
    merged = copy.deepcopy(derived)
    for key, value in raw.items():
        if isinstance(merged.get(key), dict) and isinstance(value, dict):
            merged[key] = merged_config(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _section_of(config: dict, loc: tuple) -> str:
    """The top-level section (with a dot) that holds the key a section model's error points at."""
    sections = [key for key, value in config.items() if isinstance(value, dict) and loc and loc[0] in value]
    return f"{sections[0]}." if sections else ""


class _ReadKeys(dict):
    """A config dict that remembers which top-level keys DeepSpeed looked for while reading it."""

    def __init__(self, *args, looked_up: set[str] | None = None):
        super().__init__(*args)
        self.looked_up = set() if looked_up is None else looked_up

    def get(self, key, default=None):
        self.looked_up.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.looked_up.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.looked_up.add(key)
        return super().__contains__(key)

    def keys(self):
        return _ReadKeysView(self)

    def __copy__(self):  # DeepSpeedConfig reads a shallow copy
        return _ReadKeys(self, looked_up=self.looked_up)


class _ReadKeysView(KeysView):
    def __contains__(self, key):
        return key in self._mapping


def deepspeed_problems(cfg: TrainConfig, data_parallel_size: int) -> list[str]:
    """Conflicts between `cfg.deepspeed` and the derived keys, then what DeepSpeed's config model refuses."""
    derived = derived_config(cfg, data_parallel_size, torch_optimizer_offload=True)
    problems = _conflicts(derived, cfg.deepspeed)
    if problems:
        return problems
    from deepspeed.runtime.config import DeepSpeedConfig

    merged = merged_config(derived, cfg.deepspeed)
    # Checked without a process group, DeepSpeed takes the world as one process: the batch arithmetic (the
    # trainer's, checked already) must not count the data-parallel size.
    del merged["train_batch_size"]
    readable = _ReadKeys(merged)
    try:
        DeepSpeedConfig(readable)
    except ValidationError as error:  # raised by one section's model, whose errors carry no section name
        return [
            f"deepspeed.{_section_of(merged, e['loc'])}{'.'.join(map(str, e['loc']))} = {e['input']!r}: {e['msg']}"
            for e in error.errors()
        ]
    except (AssertionError, ValueError, TypeError) as error:
        return [f"deepspeed: DeepSpeed refuses the merged config: {error}"]
    return [
        f"deepspeed.{key}: not a DeepSpeed config key"
        + "".join(
            f"; did you mean {close!r}?" for close in difflib.get_close_matches(key, readable.looked_up, n=1)
        )
        for key in cfg.deepspeed
        if key not in readable.looked_up
    ]
