"""`prepare` checks every record as it reads: counts by reason in the manifest, repeats dropped, and a corpus over
the reject rate refused with its first offending records named (trainer/data/validate.py)."""

from __future__ import annotations

import json

import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset

from tests.data.conftest import TINY_VOCAB, documents, write_text_corpus
from trainer.__main__ import main as trainer_main
from trainer.data import DataError
from trainer.data.manifest import DatasetFiles
from trainer.data.prepare import prepare_dataset
from trainer.data.tokenizer import read_tokenizer
from trainer.data.validate import ValidationLimits, read_digests


def write_lines(path, lines: list[bytes]):
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def mixed_corpus(tmp_path):
    """One record of each kind, in a known order; the good texts are what the dataset must hold."""
    good = documents(6, seed=3)
    lines = [
        json.dumps({"text": good[0]}).encode(),
        b'{"text": "caf\xe9"}',  # line 2: Latin-1, not UTF-8
        b'{"text": "unterminated',  # line 3
        json.dumps({"body": "no text key"}).encode(),  # line 4
        json.dumps({"text": ""}).encode(),  # line 5
        json.dumps({"text": good[1]}).encode(),
        json.dumps({"text": good[0]}).encode(),  # line 7: an exact repeat of line 1
        json.dumps({"text": "x" * 5000}).encode(),  # line 8: longer than --max-chars 4000
        json.dumps({"text": "hi"}).encode(),  # line 9: shorter than --min-chars 3
        json.dumps({"text": good[2]}).encode(),
    ]
    return write_lines(tmp_path / "mixed.jsonl", lines), [good[0], good[1], good[2]]


def test_each_kind_of_bad_record_is_counted_left_out_and_named(tmp_path):
    path, kept = mixed_corpus(tmp_path)
    limits = ValidationLimits(min_chars=3, max_chars=4000, max_reject_rate=1.0)

    result = prepare_dataset([str(path)], str(tmp_path / "d"), vocab_size=TINY_VOCAB, limits=limits)

    report = result.manifest.validation
    assert report is not None
    assert (report.records, report.kept) == (10, 3)
    assert report.rejected == {
        "invalid_utf8": 1,
        "malformed": 2,
        "empty": 1,
        "too_short": 1,
        "too_long": 1,
        "duplicate": 1,
    }
    # The bad records are named; the empty one (line 5) and the repeat (line 7) are only counted.
    assert [entry.split(": ")[0] for entry in report.first_rejected] == [
        f"{path}:{line}" for line in (2, 3, 4, 8, 9)
    ]
    assert (
        "not UTF-8 text" in report.first_rejected[0] and "more than --max-chars" in report.first_rejected[3]
    )
    assert (report.rejected_total, report.reject_rate) == (5, 0.5)
    dataset = IndexedDataset(str(tmp_path / "d"))
    tokenizer = read_tokenizer(str(tmp_path / "d.tokenizer.json"))
    assert [tokenizer.decode(dataset[i].tolist()[:-1]) for i in range(len(dataset))] == kept
    assert len(read_digests(str(DatasetFiles(str(tmp_path / "d")).digests))) == 3


def test_a_corpus_over_the_reject_rate_is_refused_naming_its_first_records(tmp_path):
    path, _ = mixed_corpus(tmp_path)
    limits = ValidationLimits(min_chars=3, max_chars=4000, max_reject_rate=0.4)

    with pytest.raises(DataError) as refused:
        prepare_dataset([str(path)], str(tmp_path / "out" / "d"), vocab_size=TINY_VOCAB, limits=limits)

    message = str(refused.value)
    assert "5 of 10 records rejected (1 invalid_utf8, 2 malformed, 1 too_short, 1 too_long)" in message
    assert "50.0% of the corpus" in message and "--max-reject-rate 0.4" in message
    assert f"{path}:2: not UTF-8 text" in message and f"{path}:3: not valid JSON" in message
    assert not (tmp_path / "out").exists()


def test_a_corpus_under_the_reject_rate_is_prepared(tmp_path):
    texts = documents(40, seed=9)
    lines = [json.dumps({"text": text}).encode() for text in texts] + [b"{broken"]
    path = write_lines(tmp_path / "c.jsonl", lines)

    result = prepare_dataset(
        [str(path)], str(tmp_path / "d"), vocab_size=TINY_VOCAB, limits=ValidationLimits(max_reject_rate=0.05)
    )

    assert result.manifest.validation is not None
    assert result.manifest.validation.rejected["malformed"] == 1
    assert result.manifest.documents == len(set(texts)) == 40


def test_empty_documents_and_repeats_are_left_out_but_never_refuse_a_corpus(tmp_path):
    texts = documents(5, seed=6)
    write_text_corpus(tmp_path / "corpus", ["", *texts, texts[0], texts[1], ""])  # 4 of 9 left out

    result = prepare_dataset([str(tmp_path / "corpus")], str(tmp_path / "d"), vocab_size=TINY_VOCAB)

    report = result.manifest.validation
    assert report is not None
    assert (report.rejected["empty"], report.rejected["duplicate"], report.rejected_total) == (2, 2, 0)
    assert result.manifest.documents == 5 and report.first_rejected == []


def test_repeats_are_found_across_pieces_and_workers_alike(tmp_path, monkeypatch):
    monkeypatch.setattr("trainer.data.sources.PIECE_BYTES", 256)  # many pieces and batches
    monkeypatch.setattr("trainer.data.prepare.BATCH_BYTES", 512)
    texts = documents(30, seed=4)
    records = texts + texts[3:9]  # six repeats, each in a later batch than its first
    write_lines(tmp_path / "c.jsonl", [json.dumps({"text": text}).encode() for text in records])
    options = {"vocab_size": TINY_VOCAB}

    one = prepare_dataset([str(tmp_path / "c.jsonl")], str(tmp_path / "one"), workers=1, **options)
    prepare_dataset([str(tmp_path / "c.jsonl")], str(tmp_path / "two"), workers=2, **options)

    assert one.manifest.validation is not None
    assert one.manifest.validation.rejected["duplicate"] == 6
    assert one.manifest.documents == 30
    for suffix in (".bin", ".idx", ".digests"):
        assert (tmp_path / f"one{suffix}").read_bytes() == (tmp_path / f"two{suffix}").read_bytes()


def test_other_limits_are_another_dataset(tmp_path):
    write_text_corpus(tmp_path / "corpus", documents(4, seed=2))
    prepare_dataset([str(tmp_path / "corpus")], str(tmp_path / "d"), vocab_size=TINY_VOCAB)

    with pytest.raises(DataError, match="other --min-chars, --max-chars or --max-reject-rate"):
        prepare_dataset(
            [str(tmp_path / "corpus")],
            str(tmp_path / "d"),
            vocab_size=TINY_VOCAB,
            limits=ValidationLimits(max_reject_rate=0.5),
        )


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--max-reject-rate", "1.5"], "--max-reject-rate 1.5: must be a fraction from 0 to 1"),
        (["--min-chars", "0"], "--min-chars 0: must be at least 1"),
        (["--min-chars", "50", "--max-chars", "10"], "--max-chars 10: must be at least --min-chars (50)"),
    ],
)
def test_bad_limits_fail_before_any_work(option, message, tmp_path, capsys):
    write_text_corpus(tmp_path / "corpus", documents(2, seed=1))

    assert (
        trainer_main(["prepare", str(tmp_path / "corpus"), "--output", str(tmp_path / "o" / "d"), *option])
        == 2
    )

    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
