"""Packed fine-tuning samples: short conversations from `prepare --format chat` packed into full sequences, each
conversation attending only to itself and starting again at position 0.

The layout is Megatron-Bridge's GPTSFTPackedDataset (src/megatron/bridge/data/datasets/sft.py, collate_fn): a
conversation of L tokens gives L - 1 inputs and the L - 1 labels after them, the loss mask is the mask of those
labels, position ids restart at 0 per conversation, and `cu_seqlens` (cumulative lengths, -1 padded, the tail of
padding its own last segment) goes to the model as megatron-core's PackedSeqParams(qkv_format="thd")
(src/megatron/bridge/training/utils/packed_seq_utils.py get_packed_seq_params). There, rotary embeddings restart
per segment (megatron-core 0.16.1 models/common/embeddings/rope_utils.py _apply_rotary_pos_emb_thd) and the core
attention is per segment: TransformerEngine's on GPUs, trainer/model/attention.py's SDPA elsewhere.
As in Megatron-Bridge, a packed sample is one micro-batch of one sequence (schedule.micro_batch_size = 1).

Packing is first fit in a seed-shuffled order (Megatron-Bridge's packing_utils.py first_fit_shuffle): a
conversation goes into the first pack it fits, so a pack of seq_length inputs holds whole conversations only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from trainer.data import DataError
from trainer.data.chat import check_chat_dataset, mask_prefix

if TYPE_CHECKING:
    from megatron.core.packed_seq_params import PackedSeqParams


def first_fit(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Indices of `lengths` grouped into packs of total length <= capacity, each into the first pack it fits."""
    packs: list[list[int]] = []
    room: list[int] = []
    for index, length in enumerate(lengths.tolist()):
        if length > capacity:
            raise DataError(
                f"a conversation of {length + 1} tokens does not fit a packed sample of {capacity}"
            )
        slot = next((pack for pack, free in enumerate(room) if free >= length), None)
        if slot is None:
            packs.append([])
            room.append(capacity)
            slot = len(packs) - 1
        packs[slot].append(index)
        room[slot] -= length
    return packs


class PackedChatDataset(torch.utils.data.Dataset):
    """`num_samples` packed samples of `seq_length` inputs from the conversations [first, last) of a chat dataset:
    each epoch shuffles the conversations with (seed, epoch) and packs them first fit, until enough packs exist.
    Samples: tokens, labels, loss_mask, position_ids ([seq_length]) and cu_seqlens ([max_segments + 1], -1
    padded)."""

    def __init__(
        self, prefix: str, first: int, last: int, seq_length: int, num_samples: int, seed: int, pad_id: int
    ) -> None:
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        self.tokens, self.mask = IndexedDataset(prefix), IndexedDataset(mask_prefix(prefix))
        self.seq_length, self.pad_id = seq_length, pad_id
        lengths = self.tokens.sequence_lengths.astype(np.int64) - 1  # the inputs each conversation gives
        conversations = np.arange(first, last)
        if conversations.size == 0:
            raise DataError(f"chat dataset {prefix!r}: no conversations in this split ({first}..{last})")
        self.packs: list[list[int]] = []
        epoch = 0
        while len(self.packs) < num_samples:
            order = np.random.default_rng([seed, epoch]).permutation(conversations)
            self.packs += [[int(order[i]) for i in pack] for pack in first_fit(lengths[order], seq_length)]
            epoch += 1
        del self.packs[num_samples:]
        # One more than the most segments a pack has (its padding), so every sample's cu_seqlens has one shape.
        self.segments = max((len(pack) for pack in self.packs), default=0) + 1

    def __len__(self) -> int:
        return len(self.packs)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        pieces = [(self.tokens[c].astype(np.int64), self.mask[c].astype(np.int64)) for c in self.packs[index]]
        return packed_sample(pieces, self.seq_length, self.pad_id, self.segments)


def packed_sample(
    conversations: list[tuple[np.ndarray, np.ndarray]], seq_length: int, pad_id: int, segments: int
) -> dict[str, torch.Tensor]:
    """One packed sample from (tokens, mask) pairs: inputs and labels shifted by one within each conversation,
    the labels' mask as loss mask, positions from 0 per conversation, padding (pad_id, masked) as a last segment."""
    tokens = np.full(seq_length, pad_id, dtype=np.int64)
    labels = np.full(seq_length, pad_id, dtype=np.int64)
    loss_mask = np.zeros(seq_length, dtype=np.float32)
    position_ids = np.zeros(seq_length, dtype=np.int64)
    bounds = [0]
    for ids, mask in conversations:
        start, end = bounds[-1], bounds[-1] + ids.size - 1
        tokens[start:end], labels[start:end], loss_mask[start:end] = ids[:-1], ids[1:], mask[1:]
        position_ids[start:end] = np.arange(end - start)
        bounds.append(end)
    if bounds[-1] < seq_length:
        position_ids[bounds[-1] :] = np.arange(seq_length - bounds[-1])
        bounds.append(seq_length)
    cu_seqlens = np.full(segments + 1, -1, dtype=np.int32)
    cu_seqlens[: len(bounds)] = bounds
    return {
        "tokens": torch.from_numpy(tokens),
        "labels": torch.from_numpy(labels),
        "loss_mask": torch.from_numpy(loss_mask),
        "position_ids": torch.from_numpy(position_ids),
        "cu_seqlens": torch.from_numpy(cu_seqlens),
    }


def packed_seq_params(cu_seqlens: torch.Tensor) -> PackedSeqParams:
    """megatron-core's thd parameters for one packed sample's -1 padded cu_seqlens ([1, segments + 1])."""
    from megatron.core.packed_seq_params import PackedSeqParams

    if cu_seqlens.dim() == 2 and cu_seqlens.size(0) != 1:
        raise ValueError(f"packed samples go one per micro-batch; got {cu_seqlens.size(0)}")
    bounds = cu_seqlens.reshape(-1)
    bounds = bounds[bounds >= 0].to(torch.int32)
    longest = int((bounds[1:] - bounds[:-1]).max())
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=bounds,
        cu_seqlens_kv=bounds,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
    )


def build_packed_datasets(
    prefix: str, split: str, seq_length: int, seed: int, num_samples: tuple[int, int], pad_id: int
) -> tuple[PackedChatDataset, PackedChatDataset]:
    """Train and validation packed samples of one chat dataset, its conversations cut into contiguous split ranges
    with megatron-core's rounding (as GPTDataset's documents are)."""
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )

    manifest = check_chat_dataset(prefix, seq_length)
    count = manifest.conversations
    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    # A split of weight 0 has no range (None): the same as an empty one here.
    ranges = [(round(b[0] * count), round(b[1] * count)) if b else (0, 0) for b in matrix[:2]]
    for name, (first, last) in zip(("train", "valid"), ranges, strict=True):
        if first == last:
            raise DataError(
                f"data.split {split!r} leaves the {name} split of chat dataset {prefix!r} ({count} conversations) "
                "none; give it more weight or prepare more conversations"
            )
    train, valid = (
        PackedChatDataset(prefix, first, last, seq_length, samples, seed, pad_id)
        for (first, last), samples in zip(ranges, num_samples, strict=True)
    )
    return train, valid
