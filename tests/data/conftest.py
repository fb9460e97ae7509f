"""Small corpora written into tmp_path, so data tests tokenize a few kilobytes, not a real corpus."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

SENTENCE = (
    "the model reads tokens and predicts the next one while gradients flow back through every layer of the "
    "network so that loss falls step by step across shards nodes and devices def return class import"
)
# Small enough to train in milliseconds, large enough for real merges.
TINY_VOCAB = 300


def documents(count: int, seed: int) -> list[str]:
    """Deterministic text documents of varied length, with newlines, indentation and non-ASCII text."""
    rng = random.Random(seed)
    return [
        "\n".join(
            "    " * rng.randrange(3)
            + " ".join(rng.choice(SENTENCE.split()) for _ in range(rng.randrange(3, 12)))
            for _ in range(rng.randrange(2, 12))
        )
        + ("\nnaïve café ünïcode ✓" if index % 5 == 0 else "")
        for index in range(count)
    ]


def write_text_corpus(directory: Path, texts: list[str]) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, text in enumerate(texts):
        path = directory / f"doc{index:03d}.txt"
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


@pytest.fixture
def text_corpus(tmp_path: Path) -> tuple[Path, list[str]]:
    texts = documents(12, seed=0)
    write_text_corpus(tmp_path / "corpus", texts)
    return tmp_path / "corpus", texts
