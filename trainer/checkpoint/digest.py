"""Every byte of a checkpoint hashed: as the writer writes it (no extra read), and checked on load in parallel.

The digest is XXH3-128 (xxhash), a non-cryptographic checksum: it catches torn copies, truncation and flipped bits
at several GB/s a core, not tampering (the buckets' versioning and KMS keys are for that). megatron-core 0.16.1
writes each rank's tensor files in `FileSystemWriterAsync.write_preloaded_data` (strategies/filesystem_async.py)
through the module-level name `open`; `install()` gives that module an `open` whose binary write streams hash
what passes through them and, when closed, leave `<file>.xxh3` beside the file. The store seals a checkpoint's
manifest from those digests (files nobody hashed while writing, such as the small metadata and DeepSpeed's files,
are read and hashed then), and drops the side files.
"""

from __future__ import annotations

import builtins
import io
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import xxhash

ALGORITHM = "xxh3_128"
SIDE_SUFFIX = ".xxh3"  # beside a file its writer hashed: {"bytes": N, "xxh3_128": hex}
_CHUNK = 8 * 2**20


def streaming_hash() -> xxhash.xxh3_128:
    """The digest every checkpoint file gets, fed as its bytes go by (`update`)."""
    return xxhash.xxh3_128()


class HashingWriter(io.RawIOBase):
    """A binary file opened for writing that hashes every byte written, in order; a seek that moves away from the
    end (a writer patching bytes already written) makes the streamed digest void, and nothing is left beside it."""

    def __init__(self, path: str | os.PathLike, mode: str) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self._file: IO[bytes] = builtins.open(path, mode)  # noqa: SIM115 (closed by close())
        self._hash = streaming_hash()
        self._bytes = 0
        self._valid = True

    @property
    def name(self) -> str:
        return self.path

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self._file.tell() != self._bytes:
            self._valid = False
        written = self._file.write(view)
        self._hash.update(view[:written])
        self._bytes += written
        return written

    def tell(self) -> int:
        return self._file.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        position = self._file.seek(offset, whence)
        if position != self._bytes:
            self._valid = False
        return position

    def flush(self) -> None:
        if not self._file.closed:  # RawIOBase.close() flushes after close() has closed the file
            self._file.flush()

    def fileno(self) -> int:
        return self._file.fileno()

    def close(self) -> None:
        if self.closed:
            return
        self._file.close()
        if self._valid:
            side = {"bytes": self._bytes, ALGORITHM: self._hash.hexdigest()}
            Path(self.path + SIDE_SUFFIX).write_text(json.dumps(side))
        super().close()


def hashing_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
    """`open`, except that a binary file opened only for writing hashes what is written into it."""
    if mode in ("wb", "xb") and not args and not kwargs:
        return HashingWriter(file, mode)
    return builtins.open(file, mode, *args, **kwargs)


def install() -> None:
    """Hash megatron-core's checkpoint files as its writers write them (idempotent; forked writers inherit it)."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    filesystem_async.open = hashing_open  # shadows the builtin in that module alone


def file_digest(path: Path) -> str:
    """A file's XXH3-128, read in chunks."""
    digest = streaming_hash()
    with builtins.open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def streamed(path: Path) -> dict | None:
    """What the writer recorded for `path` while writing it, if it did and the size still agrees."""
    side = path.with_name(path.name + SIDE_SUFFIX)
    try:
        record = json.loads(side.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("bytes") != path.stat().st_size:
        return None
    return {"bytes": record["bytes"], ALGORITHM: record[ALGORITHM]}


def record(path: Path) -> dict:
    """A file's manifest entry: its size and digest, streamed by its writer where it was, else read now."""
    return streamed(path) or {"bytes": path.stat().st_size, ALGORITHM: file_digest(path)}


def side_files(paths: Iterable[Path]) -> list[Path]:
    return [path for path in paths if path.name.endswith(SIDE_SUFFIX)]
