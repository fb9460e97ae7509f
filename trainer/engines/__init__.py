"""Training engines: what does one optimizer step, evaluates, saves and loads, behind one interface.

    megatron          megatron-core: tensor, pipeline and data parallel (1F1B, interleaved), distributed optimizer
    deepspeed         DeepSpeed ZeRO stage 1-3 data parallel of the same model (TP = PP = 1)
    deepspeed_config  the DeepSpeed config derived from the trainer's, merged with raw `deepspeed:` keys
    step              StepResult: what one optimizer step reports

The loop in trainer/loop.py knows only `Engine`, and its checkpoints only through the checkpointer
(trainer/checkpoint/checkpointer.py), which calls the engine's `save` and `load`. A new engine is a module here
with a `build(cfg, dims)` that returns one, a value of `engine:` in trainer/config/schema.py, and its checkpoint
format in trainer/checkpoint/.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from trainer.engines.step import StepResult

if TYPE_CHECKING:
    from trainer.checkpoint.record import ModelRecord
    from trainer.checkpoint.store import Progress
    from trainer.checkpoint.writer import Write, Writer
    from trainer.config import ParallelDims, TrainConfig


class Engine(Protocol):
    """One training process's model, optimizer, LR schedule and data, as the loop uses them."""

    cfg: TrainConfig
    dims: ParallelDims
    padded_vocab_size: int
    model_record: ModelRecord  # what each checkpoint records about the model
    saves_in_background: bool  # whether `save` takes a Writer

    def train_batches(self, consumed_samples: int) -> list[Iterator[dict]]:
        """This rank's micro-batch streams over the training samples, from consumed_samples on."""

    def train_step(self, batches: list[Iterator[dict]], step: int | None = None) -> StepResult:
        """One optimizer step over a global batch. `step` is where TRAINSTACK_FAULT's step faults strike."""

    def evaluate(self) -> float:
        """Mean loss per token over the validation samples (the same ones every time)."""

    def save(self, progress: Progress, *, writer: Writer | None = None) -> Write:
        """Write this step's checkpoint in the engine's format into the store's staging directory, on every rank;
        with a writer, in the background. The checkpointer publishes it (trainer/checkpoint/checkpointer.py)."""

    def load(self, path: Path, *, weights_only: bool = False) -> Progress:
        """Restore a checkpoint (any format: the weights alone from another engine's); where training stands."""


def problems(cfg: TrainConfig, world_size: int) -> list[str]:
    """What the engine cfg names refuses before any process starts: for engine: deepspeed, its raw
    `deepspeed:` keys against the derived ones and DeepSpeed's own config model (megatron's are config checks)."""
    if cfg.engine != "deepspeed":
        return []
    from trainer.engines.deepspeed_config import deepspeed_problems  # imports DeepSpeed: only its runs pay

    return deepspeed_problems(cfg, data_parallel_size=world_size)  # TP = PP = 1


def build(cfg: TrainConfig, dims: ParallelDims) -> Engine:
    """The engine cfg names, built for this rank: data, model, optimizer and LR schedule from the seed; its cfg
    is `cfg` with the vocabulary resolved (the train command resolves it before: then `cfg` itself)."""
    from trainer.data.tokenizer import with_resolved_model

    cfg = with_resolved_model(cfg)
    if cfg.engine == "deepspeed":
        from trainer.engines import deepspeed  # imports DeepSpeed, which megatron runs do without

        return deepspeed.build(cfg, dims)
    from trainer.engines import megatron

    return megatron.build(cfg, dims)
