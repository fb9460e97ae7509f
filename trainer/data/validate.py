"""What `prepare` checks as it reads: each record is kept or rejected for one reason, counted into the manifest.

A record is a text file or a non-blank JSONL line. Left out, in this order: not UTF-8, not a JSON object with a
string under the text key ("malformed"), empty, shorter than `min_chars` or longer than `max_chars` (length
outliers), and an exact repeat of a document kept earlier (compared by a 16-byte BLAKE2b digest of its UTF-8
text). Every reason is counted; the bad ones (`BAD`: not UTF-8, malformed, length outliers) are "rejected", and a
corpus whose rejected share exceeds `max_reject_rate` is refused with its first rejected records named
(file:line). Empty files and repeats are normal in real corpora (an empty `__init__.py`, a page crawled twice):
they are left out and counted, never a reason to refuse. The digests of the kept documents are written beside
the dataset (PREFIX.digests), so `merge` drops a shard's document that an earlier shard already holds, exactly as
one `prepare` of the whole corpus would.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from trainer.data import DataError
from trainer.data.sources import Piece, Record, count_lines, read_records

Rejection = Literal["invalid_utf8", "malformed", "empty", "too_short", "too_long", "duplicate"]
REJECTIONS: tuple[Rejection, ...] = (
    "invalid_utf8",
    "malformed",
    "empty",
    "too_short",
    "too_long",
    "duplicate",
)
# The reasons that make a record bad, rather than merely left out: they count against --max-reject-rate.
BAD: tuple[Rejection, ...] = ("invalid_utf8", "malformed", "too_short", "too_long")
DIGEST_BYTES = 16
# How many offending records a refusal and the manifest name.
EXAMPLES = 10
# A 10-million-character document is a dump or a concatenation, not one document; --max-chars changes it.
DEFAULT_MAX_CHARS = 10_000_000
# A few bad lines in a large crawl are normal; a tenth of a corpus is a broken export or a wrong --text-key.
DEFAULT_MAX_REJECT_RATE = 0.01


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ValidationLimits(_Strict):
    """The settings that decide which records are kept (part of the request: other limits, another dataset)."""

    min_chars: int = Field(default=1, ge=1)
    max_chars: int = Field(default=DEFAULT_MAX_CHARS, ge=1)
    max_reject_rate: float = Field(default=DEFAULT_MAX_REJECT_RATE, ge=0, le=1)


def check_limits(min_chars: int, max_chars: int, max_reject_rate: float) -> ValidationLimits:
    """The limits from the command line, refused with the option's name before any file is read."""
    if min_chars < 1:
        raise DataError(f"--min-chars {min_chars}: must be at least 1 (empty documents are always rejected)")
    if max_chars < min_chars:
        raise DataError(f"--max-chars {max_chars}: must be at least --min-chars ({min_chars})")
    if not 0 <= max_reject_rate <= 1:
        raise DataError(f"--max-reject-rate {max_reject_rate}: must be a fraction from 0 to 1, e.g. 0.01")
    return ValidationLimits(min_chars=min_chars, max_chars=max_chars, max_reject_rate=max_reject_rate)


class ValidationReport(_Strict):
    """The manifest's account of what was read: records, kept documents, records left out by reason, and the first
    rejected (bad) ones."""

    records: int = 0
    kept: int = 0
    rejected: dict[Rejection, int] = Field(default_factory=lambda: dict.fromkeys(REJECTIONS, 0))
    first_rejected: list[str] = []  # "file:line: reason" of the first bad records, in input order

    @property
    def rejected_total(self) -> int:
        """The bad records (BAD): what --max-reject-rate limits."""
        return sum(self.rejected[reason] for reason in BAD)

    @property
    def reject_rate(self) -> float:
        return self.rejected_total / self.records if self.records else 0.0

    def summary(self) -> str:
        reasons = ", ".join(f"{self.rejected[reason]:,} {reason}" for reason in BAD if self.rejected[reason])
        return f"{self.rejected_total:,} of {self.records:,} records rejected ({reasons or 'none'})"


def document_digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=DIGEST_BYTES).digest()


@dataclass(frozen=True)
class Verdict:
    """A record's outcome as a worker sees it (duplicates across batches are decided later, in order)."""

    piece: int  # index of the piece within its batch
    line: int
    rejection: Rejection | None
    problem: str = ""
    digest: bytes = b""


def check_record(record: Record, limits: ValidationLimits) -> tuple[Rejection | None, str]:
    if record.text is None:
        kind: Rejection = "invalid_utf8" if record.problem.startswith("not UTF-8") else "malformed"
        return kind, record.problem
    length = len(record.text)
    if length == 0:
        return "empty", "empty document"
    if length < limits.min_chars:
        return "too_short", f"{length:,} characters, fewer than --min-chars {limits.min_chars:,}"
    if length > limits.max_chars:
        return "too_long", f"{length:,} characters, more than --max-chars {limits.max_chars:,}"
    return None, ""


def validate_pieces(pieces: Sequence[Piece], text_key: str, limits: ValidationLimits) -> list[Verdict]:
    """Each record's verdict (a worker's share: no cross-batch state, so it runs in any process)."""
    verdicts = []
    for index, piece in enumerate(pieces):
        for record in read_records(piece, text_key):
            rejection, problem = check_record(record, limits)
            digest = document_digest(record.text) if rejection is None and record.text is not None else b""
            verdicts.append(Verdict(index, record.line, rejection, problem, digest))
    return verdicts


@dataclass
class Validation:
    """The running tally over batches in input order: counts, the first offenders, the digests kept so far.

    `admit` returns, for one batch, the ordinals of its records to leave out (rejected or already seen)."""

    limits: ValidationLimits
    all_pieces: Sequence[Piece]
    report: ValidationReport = field(default_factory=ValidationReport)
    digests: list[bytes] = field(default_factory=list)
    _seen: set[bytes] = field(default_factory=set)
    _counts: dict[Rejection, int] = field(default_factory=lambda: dict.fromkeys(REJECTIONS, 0))
    _examples: list[str] = field(default_factory=list)
    _records: int = 0

    def admit(self, batch: Sequence[Piece], verdicts: Sequence[Verdict]) -> frozenset[int]:
        dropped = set()
        for ordinal, verdict in enumerate(verdicts):
            self._records += 1
            rejection, problem = verdict.rejection, verdict.problem
            if rejection is None and verdict.digest in self._seen:
                rejection, problem = "duplicate", "an exact repeat of an earlier document"
            if rejection is None:
                self._seen.add(verdict.digest)
                self.digests.append(verdict.digest)
                continue
            dropped.add(ordinal)
            self._counts[rejection] += 1
            if rejection in BAD and len(self._examples) < EXAMPLES:
                self._examples.append(f"{self._where(batch[verdict.piece], verdict.line)}: {problem}")
        return frozenset(dropped)

    def _where(self, piece: Piece, line: int) -> str:
        if not line:
            return piece.path
        earlier = sum(
            count_lines(each)
            for each in self.all_pieces[: self.all_pieces.index(piece)]
            if each.path == piece.path
        )
        return f"{piece.path}:{earlier + line}"

    def finish(self) -> ValidationReport:
        """The report; refuses a corpus with nothing kept or with more rejected than the limit allows."""
        self.report = ValidationReport(
            records=self._records,
            kept=len(self.digests),
            rejected=dict(self._counts),
            first_rejected=list(self._examples),
        )
        check_reject_rate(self.report, self.limits, files=len({piece.path for piece in self.all_pieces}))
        return self.report


def check_reject_rate(report: ValidationReport, limits: ValidationLimits, files: int | None = None) -> None:
    if report.kept == 0 and report.rejected_total == 0:
        where = f"{files} file(s), " if files is not None else ""
        raise DataError(f"the inputs hold no text: {where}{report.records} document(s), all empty")
    if report.kept == 0 or report.reject_rate > limits.max_reject_rate:
        raise DataError(
            f"{report.summary()}: {report.reject_rate:.1%} of the corpus, above --max-reject-rate "
            f"{limits.max_reject_rate:g}; first: {'; '.join(report.first_rejected)}. Fix or drop those records, "
            f"or allow more with --max-reject-rate"
        )


def read_digests(path: str) -> list[bytes]:
    raw = open(path, "rb").read()  # noqa: SIM115  small: 16 bytes a document
    if len(raw) % DIGEST_BYTES:
        raise DataError(f"{path} is {len(raw)} bytes, not a whole number of {DIGEST_BYTES}-byte digests")
    return [raw[offset : offset + DIGEST_BYTES] for offset in range(0, len(raw), DIGEST_BYTES)]


def write_digests(path: str, digests: Sequence[bytes]) -> None:
    with open(path, "wb") as stream:
        stream.write(b"".join(digests))
