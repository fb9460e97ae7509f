"""Micro-batches for one data-parallel rank from a position in the sample stream, so that a run resumed at
`consumed_samples` sees exactly the samples it would have seen without stopping.

The layout is megatron's pretraining sampler: the dataset's (already seed-shuffled) samples are read in order;
each global batch is cut into micro-batches of `micro_batch_size * data_parallel_size` samples, and rank r takes
the r-th `micro_batch_size` of each. Every layout therefore trains on the same global batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from trainer.data import DataError

FIELDS = ("tokens", "labels", "loss_mask", "position_ids")


def sample_batches(
    dataset: Sequence[dict[str, torch.Tensor]],
    consumed_samples: int,
    global_batch_size: int,
    micro_batch_size: int,
    data_parallel_rank: int,
    data_parallel_size: int,
    *,
    pin_memory: bool = False,
) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's micro-batches (FIELDS -> [micro_batch_size, seq_length] tensors), whole global batches only,
    from `consumed_samples` until the dataset cannot fill another global batch. Checks its arguments at once.
    `pin_memory`: collate into page-locked host memory (as torch's DataLoader(pin_memory=True) does), so that a
    `.to("cuda", non_blocking=True)` copies asynchronously; needs CUDA."""
    per_micro_step = micro_batch_size * data_parallel_size
    if micro_batch_size < 1 or data_parallel_size < 1:
        raise DataError(
            f"micro_batch_size {micro_batch_size} and data_parallel_size {data_parallel_size} must be at least 1"
        )
    if global_batch_size < 1 or global_batch_size % per_micro_step:
        raise DataError(
            f"global_batch_size {global_batch_size} must be a positive multiple of micro_batch_size x "
            f"data_parallel_size = {micro_batch_size} x {data_parallel_size} = {per_micro_step}"
        )
    if not 0 <= data_parallel_rank < data_parallel_size:
        raise DataError(f"data_parallel_rank {data_parallel_rank}: must be in 0..{data_parallel_size - 1}")
    if not 0 <= consumed_samples <= len(dataset):
        raise DataError(
            f"consumed_samples {consumed_samples}: must be in 0..{len(dataset)} (the dataset's size)"
        )
    starts = (
        micro_start + data_parallel_rank * micro_batch_size
        for step_start in range(consumed_samples, len(dataset) - global_batch_size + 1, global_batch_size)
        for micro_start in range(step_start, step_start + global_batch_size, per_micro_step)
    )
    return (
        _collate([dataset[index] for index in range(start, start + micro_batch_size)], pin_memory)
        for start in starts
    )


def _collate(samples: list[dict[str, torch.Tensor]], pin_memory: bool) -> dict[str, torch.Tensor]:
    # Packed chat samples (trainer/data/packing.py) also carry their conversations' bounds.
    fields = (*FIELDS, "cu_seqlens") if "cu_seqlens" in samples[0] else FIELDS
    batch = {field: torch.stack([sample[field] for sample in samples]) for field in fields}
    return {field: tensor.pin_memory() for field, tensor in batch.items()} if pin_memory else batch
