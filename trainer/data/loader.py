"""What a training process reads: the run's train and validation samples, and this data-parallel rank's
micro-batch streams over them (one identical stream per virtual pipeline stage), on the device."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from trainer.config import ModelConfig, TrainConfig
from trainer.data.datasets import build_gpt_datasets
from trainer.data.sampler import sample_batches
from trainer.data.tokenizer import load_tokenizer
from trainer.distributed.parallel import device_type

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from trainer.distributed.parallel import ParallelDims


def train_and_valid(cfg: TrainConfig) -> tuple[Dataset, Dataset]:
    """Train and validation samples: megatron-core GPTDatasets over the prepared blend, in the seed's order."""
    s = cfg.schedule
    train_data, valid_data, _ = build_gpt_datasets(
        prefixes=cfg.data.prefixes,
        weights=cfg.data.weights,
        split=cfg.data.split,
        seq_length=cfg.data.seq_length,
        seed=cfg.seed,
        # Every evaluation reads the same validation samples, so its losses compare over time.
        num_samples=(s.train_iters * s.global_batch_size, s.eval_iters * s.global_batch_size, 0),
        tokenizer_path=cfg.data.tokenizer_path,
        cache_dir=cfg.data.cache_dir or str(cfg.run_dir / "data-cache"),
    )
    return train_data, valid_data


def micro_batch_streams(
    dataset: Dataset, consumed_samples: int, cfg: TrainConfig, dims: ParallelDims
) -> list[Iterator[dict]]:
    """This DP rank's micro-batches from `consumed_samples` on, on the device: one identical stream per virtual
    pipeline stage (megatron's interleaved schedule reads one iterator per model chunk)."""
    from megatron.core import (
        parallel_state,  # megatron's groups: both engines start them (parallel.initialize)
    )

    s, device = cfg.schedule, device_type()
    rank = parallel_state.get_data_parallel_rank()

    def stream() -> Iterator[dict]:
        for batch in sample_batches(
            dataset, consumed_samples, s.global_batch_size, s.micro_batch_size, rank, dims.dp
        ):
            yield {field: tensor.to(device) for field, tensor in batch.items()}

    return [stream() for _ in range(dims.vp)]


def resolved_model(cfg: TrainConfig) -> ModelConfig:
    """The model section with its vocabulary size set: the tokenizer's unless the config gives one."""
    vocab_size = cfg.model.vocab_size or load_tokenizer(cfg.data.tokenizer_path).vocab_size
    return cfg.model.model_copy(update={"vocab_size": vocab_size})


def with_resolved_model(cfg: TrainConfig) -> TrainConfig:
    """cfg with resolved_model's model section: what the model is built from."""
    return cfg.model_copy(update={"model": resolved_model(cfg)})
