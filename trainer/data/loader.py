"""What a training process reads: the run's train and validation samples, and this data-parallel rank's
micro-batch streams over them (one identical stream per virtual pipeline stage), on the device."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, cast

from trainer.config import TrainConfig
from trainer.data.datasets import build_gpt_datasets
from trainer.data.sampler import sample_batches
from trainer.data.tokenizer import load_tokenizer
from trainer.device import device_type

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

    from trainer.config import ParallelDims


def train_and_valid(cfg: TrainConfig) -> tuple[Dataset, Dataset]:
    """Train and validation samples: megatron-core GPTDatasets over the prepared blend, in the seed's order."""
    s = cfg.schedule
    if cfg.data.format == "chat":
        return _packed_chat(cfg)
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
    assert valid_data is not None  # data.split's validation weight is above 0 (DataConfig checks it)
    return train_data, valid_data


def _packed_chat(cfg: TrainConfig) -> tuple[Dataset, Dataset]:
    """Packed fine-tuning samples of the chat dataset (trainer/data/packing.py), padded with the tokenizer's EOD."""
    from trainer.data.datasets import check_tokenizer_matches_dataset
    from trainer.data.packing import build_packed_datasets

    s, prefix = cfg.schedule, cfg.data.prefixes[0]
    tokenizer = load_tokenizer(cfg.data.tokenizer_path)
    check_tokenizer_matches_dataset(prefix, tokenizer)
    return build_packed_datasets(
        prefix,
        cfg.data.split,
        cfg.data.seq_length,
        cfg.seed,
        (s.train_iters * s.global_batch_size, s.eval_iters * s.global_batch_size),
        tokenizer.eod,
    )


def micro_batch_streams(
    dataset: Dataset, consumed_samples: int, cfg: TrainConfig, dims: ParallelDims
) -> list[Iterator[dict]]:
    """This DP rank's micro-batches from `consumed_samples` on, on the device (this CP rank's part of each
    sequence): one identical stream per virtual pipeline stage (megatron's interleaved schedule reads one iterator
    per model chunk). On GPUs the samples are collated into pinned host memory and copied without blocking the
    host, which queues the copy ahead of the micro-batch's kernels."""
    from megatron.core import (
        parallel_state,  # megatron's groups: both engines start them (parallel.initialize)
    )

    from trainer.distributed import fast_path

    s, device = cfg.schedule, device_type()
    rank, pinned = parallel_state.get_data_parallel_rank(), device == "cuda"

    def stream() -> Iterator[dict]:
        batches = sample_batches(
            # megatron-core's GPTDataset (untyped) sizes and indexes like a sequence; torch's Dataset declares neither.
            cast("Sequence[dict[str, torch.Tensor]]", dataset),
            consumed_samples,
            s.global_batch_size,
            s.micro_batch_size,
            rank,
            dims.dp,
            pin_memory=pinned,
        )
        for batch in batches:
            on_device = {field: tensor.to(device, non_blocking=pinned) for field, tensor in batch.items()}
            yield fast_path.this_context_parallel_rank(on_device) if dims.cp > 1 else on_device

    return [stream() for _ in range(dims.vp)]
