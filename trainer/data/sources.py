"""Where documents come from: input files and directories, the Python standard library corpus, and reading
them as documents (a text file is one document, a JSONL line is one document)."""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainer.data import DataError

DEFAULT_GLOBS = ("*.txt", "*.md", "*.rst", "*.jsonl")
# Test suites hold non-UTF-8 fixtures and would double the corpus; installed packages are not the stdlib.
STDLIB_EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
)
# JSONL files are cut into pieces of about this size so one large file still keeps every worker busy.
PIECE_BYTES = 4 << 20


def stdlib_sources() -> list[Path]:
    """The Python standard library's own `.py` sources: real text found on every machine with Python."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(
        path
        for path in root.rglob("*.py")
        if path.is_file() and not STDLIB_EXCLUDED_DIRS.intersection(path.relative_to(root).parts[:-1])
    )


def find_input_files(inputs: Sequence[str], globs: Sequence[str]) -> list[Path]:
    """Expand files and directories (recursively, by `globs`, skipping hidden entries) into a sorted,
    de-duplicated file list, in the order the inputs were given."""
    files: dict[Path, None] = {}
    for given in inputs:
        path = Path(given)
        if not path.exists():
            raise DataError(f"input {given!r} does not exist (give text files, .jsonl files or directories)")
        if path.is_file():
            files[path.resolve()] = None
            continue
        found = sorted(
            {
                match.resolve()
                for pattern in globs
                for match in path.rglob(pattern)
                if match.is_file() and not any(part.startswith(".") for part in match.relative_to(path).parts)
            }
        )
        if not found:
            raise DataError(
                f"input directory {given!r} has no files matching {', '.join(globs)} "
                f"(choose others with --glob, e.g. --glob '*.py')"
            )
        files.update(dict.fromkeys(found))
    return list(files)


def is_jsonl(path: str | Path) -> bool:
    return str(path).endswith(".jsonl")


@dataclass(frozen=True)
class Piece:
    """A byte range of one input file: a whole text file, or whole lines of a JSONL file."""

    path: str
    start: int
    end: int


def split_into_pieces(files: Sequence[Path]) -> list[Piece]:
    """Cut JSONL files at line starts about every PIECE_BYTES; text files stay whole (one document each).
    Depends only on the files, never on the worker count, so the output order is fixed."""
    pieces = []
    for path in files:
        size = path.stat().st_size
        if not is_jsonl(path):
            pieces.append(Piece(str(path), 0, size))
            continue
        start = 0
        with path.open("rb") as stream:
            while start < size:
                stream.seek(min(start + PIECE_BYTES, size))
                stream.readline()  # move the cut to the start of the next line
                end = min(stream.tell(), size)
                pieces.append(Piece(str(path), start, end))
                start = end
    return pieces


class PieceError(Exception):
    """A bad document inside a piece; `line` counts from the piece's first line (1-based), 0 for a text file."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(line, message)
        self.line = line
        self.message = message


@dataclass(frozen=True)
class Record:
    """One record of a piece: its line (1-based within the piece; 0 for a text file), its text when it is a
    well-formed document, and why not otherwise."""

    line: int
    text: str | None
    problem: str = ""


def read_records(piece: Piece, text_key: str) -> Iterator[Record]:
    """Every record of a piece in order, bad ones included (with the reason); blank JSONL lines are no record."""
    with open(piece.path, "rb") as stream:
        stream.seek(piece.start)
        raw = stream.read(piece.end - piece.start)
    if not is_jsonl(piece.path):
        yield _decoded(raw, 0)
        return
    for line, raw_line in enumerate(raw.split(b"\n"), start=1):
        if raw_line.strip():
            yield _json_record(_decoded(raw_line, line), text_key)


def _decoded(raw: bytes, line: int) -> Record:
    try:
        return Record(line, raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        return Record(line, None, f"not UTF-8 text ({error.reason} at byte {error.start})")


def _json_record(decoded: Record, text_key: str) -> Record:
    if decoded.text is None:
        return decoded
    line = decoded.line
    try:
        record = json.loads(decoded.text)
    except json.JSONDecodeError as error:
        return Record(line, None, f"not valid JSON ({error.msg} at column {error.colno})")
    if not isinstance(record, dict):
        return Record(line, None, f"expected a JSON object, got {type(record).__name__}")
    if text_key not in record:
        keys = ", ".join(repr(key) for key in record) or "none"
        return Record(line, None, f"no {text_key!r} key (keys present: {keys}); choose one with --text-key")
    text = record[text_key]
    if not isinstance(text, str):
        return Record(line, None, f"{text_key!r} is {type(text).__name__}, expected a string")
    return Record(line, text)


def read_documents(piece: Piece, text_key: str) -> Iterator[str]:
    """The documents of a piece, in order. Blank JSONL lines are skipped; bad ones raise PieceError."""
    for record in read_records(piece, text_key):
        if record.text is None:
            raise PieceError(record.line, record.problem)
        yield record.text


def count_lines(piece: Piece) -> int:
    """Lines in a JSONL piece, so a line number inside a piece can be turned into one inside the file."""
    with open(piece.path, "rb") as stream:
        stream.seek(piece.start)
        raw = stream.read(piece.end - piece.start)
    return raw.count(b"\n") + (0 if raw.endswith(b"\n") or not raw else 1)
