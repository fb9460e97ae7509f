"""Megatron's indexed dataset files (`PREFIX.bin` / `PREFIX.idx`), written with numpy alone.

`prepare` writes one sequence per document, which is all of the format it needs, without importing megatron-core
(about 7 CPU-seconds with torch, more than the whole tokenizing on a small corpus). The layout is megatron-core
0.16.1's `IndexedDatasetBuilder` / `_IndexWriter` (megatron/core/datasets/indexed_dataset.py, tag core_v0.16.1);
tests/data/test_indexed.py holds both writers to byte-identical files, so a format change in a megatron-core
bump fails there. The trainer reads the files with megatron-core's own `IndexedDataset`.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

# indexed_dataset.py core_v0.16.1: `_INDEX_HEADER`, then version 1 as <Q, then the `DType` code as <B.
INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
DTYPE_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.uint16: 8}


def token_dtype(vocab_size: int) -> type[np.integer]:
    """`DType.optimal_dtype` (core_v0.16.1): uint16 below 65,500 entries, else int32."""
    return np.uint16 if vocab_size < 65500 else np.int32


class IndexedDatasetWriter:
    """Append documents (one sequence each) to PREFIX.bin; `finalize` writes the index to PREFIX.idx."""

    def __init__(self, bin_path: str | Path, dtype: type[np.integer]) -> None:
        if dtype not in DTYPE_CODES:
            raise ValueError(f"token dtype {dtype.__name__} has no code in megatron's index format")
        self.dtype = dtype
        self._bin: BinaryIO = open(bin_path, "wb")  # noqa: SIM115  closed by finalize
        self._lengths: list[np.ndarray] = []

    def add_documents(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Documents laid end to end in `tokens` (already of the writer's dtype), `lengths` tokens each."""
        self._bin.write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        self._lengths.append(np.asarray(lengths, dtype=np.int32))

    def finalize(self, idx_path: str | Path) -> None:
        self._bin.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, dtype=np.int32)
        itemsize = np.dtype(self.dtype).itemsize
        # Byte offset of each sequence; each document holds one sequence, so document i ends after sequence i.
        pointers = np.zeros(lengths.size, dtype=np.int64)
        np.cumsum(lengths[:-1].astype(np.int64) * itemsize, out=pointers[1:])
        document_indices = np.arange(lengths.size + 1, dtype=np.int64)
        with open(idx_path, "wb") as idx:
            idx.write(INDEX_HEADER)
            idx.write(struct.pack("<Q", INDEX_VERSION))
            idx.write(struct.pack("<B", DTYPE_CODES[self.dtype]))
            idx.write(struct.pack("<Q", lengths.size))  # sequences
            idx.write(struct.pack("<Q", document_indices.size))  # document boundaries, 0 included
            idx.write(lengths.tobytes())
            idx.write(pointers.tobytes())
            idx.write(document_indices.tobytes())


# Header bytes before the arrays: 9 header + 8 version + 1 dtype code + 8 sequence count + 8 document count
# (indexed_dataset.py core_v0.16.1, _IndexReader: "offset = 34").
INDEX_ARRAYS_OFFSET = 34
CODE_DTYPES = {code: np.dtype(dtype) for dtype, code in DTYPE_CODES.items()}


def index_problem(idx_path: str | Path, bin_bytes: int) -> str | None:
    """What is inconsistent in a Megatron index against its .bin of `bin_bytes`, or None when it is whole.

    Checks every field megatron-core's `_IndexReader` reads (core_v0.16.1) and what `_IndexWriter` guarantees:
    the file is exactly as long as its counts say, lengths are non-negative, each sequence's pointer is where the
    one before it ends (`_sequence_pointers`: a running sum of length x itemsize from 0), the last one ends at the
    .bin's size, and document indices run from 0 to the sequence count without going back. Vectorised: one read
    of the index and a few numpy passes."""
    raw = Path(idx_path).read_bytes()
    if len(raw) < INDEX_ARRAYS_OFFSET or raw[: len(INDEX_HEADER)] != INDEX_HEADER:
        return "not a Megatron index (bad header)"
    version, code, sequences, boundaries = struct.unpack_from("<QBQQ", raw, len(INDEX_HEADER))
    if version != INDEX_VERSION:
        return f"index version {version}, megatron-core reads version {INDEX_VERSION}"
    if code not in CODE_DTYPES:
        known = ", ".join(f"{c} ({d.name})" for c, d in sorted(CODE_DTYPES.items()))
        return f"token dtype code {code} is none of {known}"
    expected = INDEX_ARRAYS_OFFSET + sequences * (4 + 8) + boundaries * 8
    if expected != len(raw):
        return (
            f"its header counts {sequences} sequences and {boundaries} document boundaries, which take "
            f"{expected} bytes, but the file has {len(raw)}"
        )
    itemsize = CODE_DTYPES[code].itemsize
    offset = INDEX_ARRAYS_OFFSET
    lengths = np.frombuffer(raw, np.int32, sequences, offset).astype(np.int64)
    pointers = np.frombuffer(raw, np.int64, sequences, offset + 4 * sequences)
    documents = np.frombuffer(raw, np.int64, boundaries, offset + 12 * sequences)
    if sequences:
        if (bad := np.flatnonzero(lengths < 0)).size:
            return f"sequence {bad[0]} has length {lengths[bad[0]]}"
        ends = np.cumsum(lengths * itemsize)
        starts = np.concatenate(([0], ends[:-1]))
        if (bad := np.flatnonzero(pointers != starts)).size:
            i = bad[0]
            return f"sequence {i} points at byte {pointers[i]}, but the sequences before it end at byte {starts[i]}"
        if ends[-1] != bin_bytes:
            return (
                f"its sequences end at byte {ends[-1]}, but the .bin holds {bin_bytes} bytes (truncated, or the "
                "two files are of different datasets)"
            )
    elif bin_bytes:
        return f"it lists no sequence, but the .bin holds {bin_bytes} bytes"
    if boundaries == 0 or documents[0] != 0 or documents[-1] != sequences:
        first_last = f"{documents[0]}..{documents[-1]}" if boundaries else "none"
        return f"document indices must run from 0 to the sequence count {sequences}, found {first_last}"
    # Compared, not subtracted: a difference of two damaged int64 values can overflow and look positive.
    if (bad := np.flatnonzero(documents[1:] < documents[:-1])).size:
        i = bad[0] + 1
        return f"document index {i} ({documents[i]}) is below the one before it ({documents[i - 1]})"
    return None
