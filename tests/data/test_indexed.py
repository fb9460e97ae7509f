"""trainer/data/indexed.py writes the same .bin/.idx bytes as megatron-core's IndexedDatasetBuilder, and
megatron-core's IndexedDataset reads them back."""

from __future__ import annotations

import numpy as np
import pytest
from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder

from trainer.data.indexed import IndexedDatasetWriter, token_dtype


def documents(vocab_size: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(count)
    return [rng.integers(0, vocab_size, size=rng.integers(1, 300)) for _ in range(count)]


@pytest.mark.parametrize("vocab_size", [8192, 65499, 65500, 128256])
def test_writer_matches_megatron_core_builder_byte_for_byte(tmp_path, vocab_size):
    docs = documents(vocab_size, 50)
    dtype = token_dtype(vocab_size)
    assert dtype is DType.optimal_dtype(vocab_size)

    builder = IndexedDatasetBuilder(str(tmp_path / "megatron.bin"), dtype=dtype)
    for doc in docs:
        builder.add_document(doc, [len(doc)])
    builder.finalize(str(tmp_path / "megatron.idx"))
    writer = IndexedDatasetWriter(tmp_path / "ours.bin", dtype)
    for start in range(0, len(docs), 7):  # in batches, as prepare's workers hand them over
        batch = docs[start : start + 7]
        writer.add_documents(np.concatenate(batch).astype(dtype), np.array([len(d) for d in batch]))
    writer.finalize(tmp_path / "ours.idx")

    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"ours{suffix}").read_bytes() == (tmp_path / f"megatron{suffix}").read_bytes()
    read = IndexedDataset(str(tmp_path / "ours"))
    assert [read[i].tolist() for i in range(len(read))] == [doc.tolist() for doc in docs]


def test_an_empty_dataset_matches_megatron_core_too(tmp_path):
    builder = IndexedDatasetBuilder(str(tmp_path / "megatron.bin"), dtype=np.uint16)
    builder.finalize(str(tmp_path / "megatron.idx"))
    IndexedDatasetWriter(tmp_path / "ours.bin", np.uint16).finalize(tmp_path / "ours.idx")

    assert (tmp_path / "ours.idx").read_bytes() == (tmp_path / "megatron.idx").read_bytes()
