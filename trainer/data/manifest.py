"""The manifest beside a prepared dataset (`PREFIX.manifest.json`): what it was made from and what it holds.

It is written last, after the `.bin`/`.idx`/tokenizer files are in place, so it marks a complete dataset;
re-running `prepare` with the same request finds it and does nothing.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from trainer.data import DataError
from trainer.data.indexed import index_problem
from trainer.data.tokenizer import file_sha256
from trainer.data.validate import ValidationLimits, ValidationReport


@dataclass(frozen=True)
class DatasetFiles:
    """Every file a prepared dataset PREFIX consists of."""

    prefix: str

    @property
    def bin(self) -> Path:
        return Path(self.prefix + ".bin")

    @property
    def idx(self) -> Path:
        return Path(self.prefix + ".idx")

    @property
    def tokenizer(self) -> Path:
        return Path(self.prefix + ".tokenizer.json")

    @property
    def manifest(self) -> Path:
        return Path(self.prefix + ".manifest.json")

    @property
    def digests(self) -> Path:
        """Each kept document's digest, in order (trainer/data/validate.py): how `merge` finds repeats."""
        return Path(self.prefix + ".digests")

    def all(self) -> tuple[Path, ...]:
        return (self.bin, self.idx, self.tokenizer, self.digests, self.manifest)


# The .bin is hashed in SAMPLE_BLOCKS blocks of SAMPLE_BLOCK_BYTES spread evenly from its first byte to its last
# (the whole file when it is smaller): a re-tokenized or swapped .bin of the same size differs in nearly every
# block, and the check reads 64 MiB however large the dataset is (docs/data.md has the measured cost).
SAMPLE_BLOCKS = 64
SAMPLE_BLOCK_BYTES = 1 << 20


def sampled_sha256(path: Path, *, blocks: int = SAMPLE_BLOCKS, block_bytes: int = SAMPLE_BLOCK_BYTES) -> str:
    """sha256 over the file's size and `blocks` blocks at evenly spaced offsets (the whole file if it is small)."""
    size = path.stat().st_size
    digest = hashlib.sha256(size.to_bytes(8, "little"))
    with path.open("rb") as stream:
        if size <= blocks * block_bytes:
            while chunk := stream.read(block_bytes):
                digest.update(chunk)
        else:
            for k in range(blocks):
                stream.seek(k * (size - block_bytes) // (blocks - 1))
                digest.update(stream.read(block_bytes))
    return digest.hexdigest()


def written_files(bin_path: Path, idx_path: Path) -> dict[str, int | str]:
    """What a manifest records of a dataset's .bin and .idx as written (the fields `Manifest.check_files` checks):
    their sizes, the whole index's sha256 and the .bin's sampled sha256."""
    return {
        "bin_bytes": bin_path.stat().st_size,
        "idx_bytes": idx_path.stat().st_size,
        "idx_sha256": file_sha256(idx_path),
        "bin_sampled_sha256": sampled_sha256(bin_path),
    }


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputFile(_Strict):
    path: str
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> InputFile:
        stat = path.stat()
        return cls(path=str(path), size=stat.st_size, mtime_ns=stat.st_mtime_ns)


class Request(_Strict):
    """What decides the output: equal requests give equal datasets."""

    inputs: list[InputFile]
    text_key: str
    tokenizer_sha256: str | None  # the given tokenizer; None when prepare trains one
    vocab_size: int | None  # the vocabulary to train; None when a tokenizer is given
    limits: ValidationLimits = ValidationLimits()  # which records are kept (trainer/data/validate.py)

    def differences(self, other: Request) -> list[str]:
        """Human-readable reasons why `other` (an earlier request) does not match this one."""
        reasons = []
        before = {item.path: item for item in other.inputs}
        now = {item.path: item for item in self.inputs}
        added, removed = now.keys() - before.keys(), before.keys() - now.keys()
        changed = sorted(path for path in now.keys() & before.keys() if now[path] != before[path])
        for label, paths in (("new", added), ("gone", removed), ("changed", changed)):
            if paths:
                reasons.append(f"{len(paths)} input file(s) {label}, e.g. {sorted(paths)[0]}")
        if self.text_key != other.text_key:
            reasons.append(f"--text-key {self.text_key!r} (was {other.text_key!r})")
        if (self.tokenizer_sha256, self.vocab_size) != (other.tokenizer_sha256, other.vocab_size):
            reasons.append("a different tokenizer or --vocab-size")
        if self.limits != other.limits:
            reasons.append("other --min-chars, --max-chars or --max-reject-rate")
        return reasons or ["the same input files in another order"]


class TokenizerRecord(_Strict):
    file: str  # the tokenizer's file name, beside the manifest
    sha256: str
    vocab_size: int
    eod_id: int


class Manifest(_Strict):
    version: Literal[1] = 1
    request: Request
    tokenizer: TokenizerRecord
    dtype: str
    documents: int
    tokens: int
    max_token_id: int
    bin_bytes: int
    idx_bytes: int
    # Content hashes (None in manifests written before they were recorded: sizes alone are checked then).
    idx_sha256: str | None = None  # the whole index
    bin_sampled_sha256: str | None = None  # sampled_sha256 of the .bin
    # What was read and left out (None in manifests written before prepare validated its records).
    validation: ValidationReport | None = None
    # A merged dataset (trainer/data/merge.py): each shard's index hash, in merge order.
    merged_from: list[str] | None = None

    def check_files(self, files: DatasetFiles) -> None:
        """Raise unless the dataset's files are the ones this manifest describes (sizes, then the index's hash and
        the .bin's sampled hash, and the tokenizer's hash)."""
        found = {path: path.stat().st_size if path.exists() else None for path in (files.bin, files.idx)}
        problems = [
            f"{path} is {'missing' if size is None else f'{size} bytes'}, its manifest says {expected} bytes"
            for (path, size), expected in zip(found.items(), (self.bin_bytes, self.idx_bytes), strict=True)
            if size != expected
        ]
        if not problems:
            for path, recorded, digest in (
                (files.idx, self.idx_sha256, file_sha256),
                (files.bin, self.bin_sampled_sha256, sampled_sha256),
            ):
                if recorded is not None and digest(path) != recorded:
                    damage = index_problem(path, self.bin_bytes) if path == files.idx else None
                    problems.append(
                        f"{path} has the recorded size but other contents (its hash differs"
                        + (f"; {damage})" if damage else ")")
                    )
        if not files.tokenizer.exists():
            problems.append(f"{files.tokenizer} is missing")
        elif file_sha256(files.tokenizer) != self.tokenizer.sha256:
            problems.append(f"{files.tokenizer} is not the tokenizer its manifest records")
        if problems:
            raise DataError(
                f"dataset {files.prefix!r} is incomplete or changed since prepare: {'; '.join(problems)}; "
                f"re-run `python -m trainer prepare ... --force`"
            )


def read_manifest(files: DatasetFiles) -> Manifest | None:
    if not files.manifest.exists():
        return None
    try:
        return Manifest.model_validate_json(files.manifest.read_bytes())
    except ValidationError as error:
        raise DataError(
            f"manifest {files.manifest} is unreadable ({error.error_count()} problem(s), first: "
            f"{error.errors()[0]['msg']}); re-run `python -m trainer prepare ... --force`"
        ) from None


def write_manifest(files: DatasetFiles, manifest: Manifest) -> None:
    temporary = files.manifest.with_name(f"{files.manifest.name}.tmp-{os.getpid()}")
    temporary.write_text(manifest.model_dump_json(indent=2) + "\n")
    temporary.replace(files.manifest)


def publish_dataset(files: DatasetFiles, temporary: dict[Path, Path], manifest: Manifest) -> None:
    """Rename a dataset written under temporary names into place, its manifest last: the old dataset stops counting
    as complete before any of its files change, and the new one counts only once every file is in place."""
    files.manifest.unlink(missing_ok=True)
    for final in (files.tokenizer, files.bin, files.idx, files.digests):
        temporary[final].replace(final)
    write_manifest(files, manifest)
