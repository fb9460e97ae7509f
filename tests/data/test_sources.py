"""Input discovery: the stdlib corpus and directory globbing."""

from __future__ import annotations

import itertools
import sysconfig
from pathlib import Path

from tests.data.conftest import write_jsonl
from trainer.data.sources import Piece, find_input_files, read_documents, split_into_pieces, stdlib_sources


def test_stdlib_corpus_is_the_standard_library_sources_without_tests_or_installed_packages():
    root = Path(sysconfig.get_paths()["stdlib"])
    sources = stdlib_sources()

    relative = {path.relative_to(root).as_posix() for path in sources}
    assert {"os.py", "argparse.py", "json/decoder.py", "asyncio/events.py"} <= relative
    assert all(path.suffix == ".py" for path in sources)
    assert not [name for name in relative if {"test", "tests", "site-packages"} & set(name.split("/")[:-1])]
    assert sources == sorted(sources)


def test_directories_are_searched_recursively_by_glob_skipping_hidden_entries(tmp_path):
    for name in ("b.txt", "a/c.md", "a/d.csv", ".git/e.txt", "a/.hidden.txt", "f.jsonl"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")

    assert find_input_files([str(tmp_path)], ["*.txt", "*.md", "*.jsonl"]) == [
        tmp_path / "a/c.md",
        tmp_path / "b.txt",
        tmp_path / "f.jsonl",
    ]
    assert find_input_files([str(tmp_path), str(tmp_path / "a/d.csv")], ["*.csv"]) == [tmp_path / "a/d.csv"]


def test_jsonl_pieces_are_cut_at_line_starts_and_together_hold_every_line(tmp_path, monkeypatch):
    monkeypatch.setattr("trainer.data.sources.PIECE_BYTES", 100)
    texts = [f"document {index} " * (index % 7 + 1) for index in range(40)]
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": text} for text in texts])

    pieces = split_into_pieces([path])

    assert len(pieces) > 5
    assert pieces[0].start == 0 and pieces[-1].end == path.stat().st_size
    assert all(left.end == right.start for left, right in itertools.pairwise(pieces))
    assert [text for piece in pieces for text in read_documents(piece, "text")] == texts
    assert split_into_pieces([path]) == pieces and isinstance(pieces[0], Piece)
