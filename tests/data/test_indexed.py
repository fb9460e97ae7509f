"""trainer/data/indexed.py writes the same .bin/.idx bytes as megatron-core's IndexedDatasetBuilder, and
megatron-core's IndexedDataset reads them back; its index check passes megatron-core's indexes and finds damage."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest
from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder

from trainer.data.indexed import INDEX_ARRAYS_OFFSET, IndexedDatasetWriter, index_problem, token_dtype


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


def megatron_dataset(tmp_path, name: str, count: int = 200, sequences_per_document: int = 1) -> Path:
    """A dataset written by megatron-core's own builder (the format's reference writer)."""
    builder = IndexedDatasetBuilder(str(tmp_path / f"{name}.bin"), dtype=np.uint16)
    for doc in documents(8192, count):
        cut = len(doc) // 2 if sequences_per_document == 2 and len(doc) > 1 else len(doc)
        lengths = [cut, len(doc) - cut] if cut < len(doc) else [len(doc)]
        builder.add_document(doc, lengths)
    builder.finalize(str(tmp_path / f"{name}.idx"))
    return tmp_path / name


@pytest.mark.parametrize("sequences_per_document", [1, 2])
def test_megatron_core_indexes_are_whole(tmp_path, sequences_per_document):
    prefix = megatron_dataset(tmp_path, "d", sequences_per_document=sequences_per_document)
    assert index_problem(f"{prefix}.idx", Path(f"{prefix}.bin").stat().st_size) is None
    IndexedDatasetWriter(tmp_path / "empty.bin", np.uint16).finalize(tmp_path / "empty.idx")
    assert index_problem(tmp_path / "empty.idx", 0) is None


def test_forty_random_bytes_anywhere_in_the_index_arrays_are_found(tmp_path):
    """The reported case: 40 random bytes written inside the .idx, header intact, size unchanged."""
    prefix = megatron_dataset(tmp_path, "d")
    original, bin_bytes = Path(f"{prefix}.idx").read_bytes(), Path(f"{prefix}.bin").stat().st_size
    rng = np.random.default_rng(40)
    for offset in rng.integers(INDEX_ARRAYS_OFFSET, len(original) - 40, size=300):
        damaged = bytearray(original)
        damaged[offset : offset + 40] = rng.bytes(40)
        Path(f"{prefix}.idx").write_bytes(bytes(damaged))
        assert index_problem(f"{prefix}.idx", bin_bytes) is not None, f"40 bytes at {offset} passed"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda idx: idx.__setitem__(slice(9, 17), (2).to_bytes(8, "little")), "index version 2"),
        (lambda idx: idx.__setitem__(17, 7), "token dtype code 7 is none of"),
        (lambda idx: idx.__setitem__(slice(18, 26), (201).to_bytes(8, "little")), "counts 201 sequences"),
        (lambda idx: idx.__setitem__(slice(34, 38), (-5).to_bytes(4, "little", signed=True)), "length -5"),
        (lambda idx: idx.__setitem__(slice(34 + 800 + 8, 34 + 800 + 16), (3).to_bytes(8, "little")),
         "sequence 1 points at byte 3, but the sequences before it end at byte"),
        (lambda idx: idx.__setitem__(slice(-8, None), (199).to_bytes(8, "little")),
         "document indices must run from 0 to the sequence count 200"),
        (lambda idx: idx.__setitem__(slice(-16, -8), (300).to_bytes(8, "little")),
         r"document index 200 \(200\) is below the one before it \(300\)"),
    ],
)  # fmt: skip
def test_each_inconsistency_is_named(tmp_path, edit, message):
    prefix = megatron_dataset(tmp_path, "d")
    idx = bytearray(Path(f"{prefix}.idx").read_bytes())
    edit(idx)
    Path(f"{prefix}.idx").write_bytes(bytes(idx))
    assert re.search(message, index_problem(f"{prefix}.idx", Path(f"{prefix}.bin").stat().st_size))


def test_a_bin_of_another_size_is_named(tmp_path):
    prefix = megatron_dataset(tmp_path, "d")
    size = Path(f"{prefix}.bin").stat().st_size
    assert f"but the .bin holds {size - 2} bytes" in index_problem(f"{prefix}.idx", size - 2)


def test_checking_a_million_sequence_index_is_fast(tmp_path):
    writer = IndexedDatasetWriter(tmp_path / "big.bin", np.uint16)
    lengths = np.random.default_rng(0).integers(1, 50, size=1_000_000)
    writer.add_documents(np.zeros(int(lengths.sum()), np.uint16), lengths)
    writer.finalize(tmp_path / "big.idx")
    started = time.perf_counter()
    assert index_problem(tmp_path / "big.idx", (tmp_path / "big.bin").stat().st_size) is None
    assert time.perf_counter() - started < 2.0  # vectorised: well under a second on a shared 2-core machine
