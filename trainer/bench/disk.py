"""The disk's sequential write speed: what a checkpoint writer could at best reach on the same file system."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

BLOCK = 16 << 20


def sequential_write_gbytes_per_s(directory: Path, size: int = 512 << 20) -> float:
    """Write `size` bytes of incompressible data to a new file in 16 MiB blocks, fsync it (checkpoints are
    synced too), and delete it; GB/s (10^9 bytes)."""
    directory.mkdir(parents=True, exist_ok=True)
    block = np.random.default_rng(0).bytes(BLOCK)
    path = directory / f".disk-bench-{os.getpid()}"
    try:
        started = time.perf_counter()
        with path.open("wb") as stream:
            for _ in range(max(1, size // BLOCK)):
                stream.write(block)
            stream.flush()
            os.fsync(stream.fileno())
        seconds = time.perf_counter() - started
    finally:
        path.unlink(missing_ok=True)
    return max(1, size // BLOCK) * BLOCK / seconds / 1e9
