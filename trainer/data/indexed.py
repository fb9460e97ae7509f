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
