"""`python -m trainer prepare`: what it writes, that it reads back exactly, caching, atomicity and errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from tests.data.conftest import TINY_VOCAB, documents, write_jsonl, write_text_corpus
from tests.support.llama3_export import llama3_style_tokenizer as llama3_tokenizer
from trainer.__main__ import main as trainer_main
from trainer.data import prepare as prepare_module
from trainer.data.manifest import DatasetFiles, read_manifest
from trainer.data.prepare import prepare_dataset
from trainer.data.tokenizer import EOD_TOKEN, read_tokenizer


def read_back(prefix: Path) -> list[list[int]]:
    dataset = IndexedDataset(str(prefix))
    assert list(dataset.document_indices) == list(range(len(dataset) + 1)), "one sequence per document"
    return [dataset[index].tolist() for index in range(len(dataset))]


def decode(prefix: Path, ids: list[int]) -> str:
    return read_tokenizer(f"{prefix}.tokenizer.json").decode(ids, skip_special_tokens=False)


def prepare_cli(*args: str) -> int:
    return trainer_main(["prepare", *map(str, args)])


def train_given_tokenizer(path: Path, texts: list[str], eod: str) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", eod]))
    tokenizer.save(str(path))
    return tokenizer


def test_prepare_round_trips_every_document_with_one_eod_at_its_end(text_corpus, tmp_path):
    corpus, texts = text_corpus
    result = prepare_dataset([str(corpus)], str(tmp_path / "out" / "tiny"), vocab_size=TINY_VOCAB)

    prefix = tmp_path / "out" / "tiny"
    eod = result.manifest.tokenizer.eod_id
    read = read_back(prefix)
    assert [decode(prefix, ids[:-1]) for ids in read] == texts  # files in name order, one document each
    assert all(ids[-1] == eod and eod not in ids[:-1] for ids in read)
    assert result.manifest.documents == len(texts)
    assert result.manifest.tokens == sum(map(len, read))
    assert result.manifest.max_token_id == max(map(max, read)) < result.manifest.tokenizer.vocab_size
    assert result.manifest.dtype == "uint16"
    assert read_tokenizer(f"{prefix}.tokenizer.json").token_to_id(EOD_TOKEN) == eod


def test_jsonl_documents_come_from_the_text_key_one_per_line(tmp_path):
    texts = documents(9, seed=1)
    write_jsonl(
        tmp_path / "a.jsonl", [{"id": index, "content": text} for index, text in enumerate(texts[:5])]
    )
    write_jsonl(
        tmp_path / "b.jsonl", [{"id": index, "content": text} for index, text in enumerate(texts[5:])]
    )
    with (tmp_path / "a.jsonl").open("a") as stream:
        stream.write("\n")  # a blank line is not a document

    assert (
        prepare_cli(tmp_path, "--text-key", "content", "--vocab-size", TINY_VOCAB, "--output", tmp_path / "j")
        == 0
    )

    assert [decode(tmp_path / "j", ids[:-1]) for ids in read_back(tmp_path / "j")] == texts


def test_given_tokenizer_encodes_the_documents_and_is_kept_beside_the_data(text_corpus, tmp_path):
    corpus, texts = text_corpus
    given = train_given_tokenizer(tmp_path / "given.json", texts, eod="</s>")

    result = prepare_dataset([str(corpus)], str(tmp_path / "g"), tokenizer=str(tmp_path / "given.json"))

    eod = given.token_to_id("</s>")
    assert result.manifest.tokenizer.eod_id == eod
    assert read_back(tmp_path / "g") == [[*given.encode(text).ids, eod] for text in texts]
    assert (tmp_path / "g.tokenizer.json").read_bytes() == (tmp_path / "given.json").read_bytes()


def llama3_style_tokenizer(path: Path, texts: list[str]) -> Tokenizer:
    """Llama 3's special tokens and post-processor on a tiny BPE (tests/support/llama3_export.py), saved."""
    tokenizer = llama3_tokenizer(texts, TINY_VOCAB)
    tokenizer.save(str(path))
    return tokenizer


def test_a_llama3_style_tokenizer_gets_its_bos_before_every_document(text_corpus, tmp_path):
    corpus, texts = text_corpus
    given = llama3_style_tokenizer(tmp_path / "llama3.json", texts)
    bos, eod = given.token_to_id("<|begin_of_text|>"), given.token_to_id("<|end_of_text|>")

    result = prepare_dataset([str(corpus)], str(tmp_path / "l"), tokenizer=str(tmp_path / "llama3.json"))

    # What the tokenizer itself gives with its special tokens (BOS + text), then the EOD prepare appends.
    assert read_back(tmp_path / "l") == [[*given.encode(text).ids, eod] for text in texts]
    assert all(ids[0] == bos and ids.count(bos) == 1 for ids in read_back(tmp_path / "l"))
    assert result.manifest.tokens == sum(len(given.encode(text).ids) + 1 for text in texts)
    assert (
        "each document is <|begin_of_text|> TEXT EOD (the tokenizer's post-processor adds "
        in result.summary()
    )


def test_a_tokenizer_without_a_post_processor_gets_only_the_eod(text_corpus, tmp_path):
    corpus, texts = text_corpus
    given = train_given_tokenizer(tmp_path / "plain.json", texts, eod="</s>")

    result = prepare_dataset([str(corpus)], str(tmp_path / "p"), tokenizer=str(tmp_path / "plain.json"))

    assert read_back(tmp_path / "p") == [
        [*given.encode(text).ids, given.token_to_id("</s>")] for text in texts
    ]
    assert "each document is TEXT EOD (its post-processor adds nothing)" in result.summary()


def test_a_template_that_ends_with_the_eod_gets_no_second_one(text_corpus, tmp_path):
    corpus, texts = text_corpus
    given = train_given_tokenizer(tmp_path / "eos.json", texts, eod="</s>")
    eod = given.token_to_id("</s>")
    given.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", eod)])
    given.save(str(tmp_path / "eos.json"))

    prepare_dataset([str(corpus)], str(tmp_path / "s"), tokenizer=str(tmp_path / "eos.json"))

    assert read_back(tmp_path / "s") == [given.encode(text).ids for text in texts]
    assert all(ids.count(eod) == 1 and ids[-1] == eod for ids in read_back(tmp_path / "s"))


def test_eod_text_inside_a_document_is_plain_text_not_a_document_end(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x.txt").write_text(f"first part {EOD_TOKEN} second part\n" * 3)
    write_text_corpus(tmp_path / "c" / "more", documents(4, seed=2))

    result = prepare_dataset([str(tmp_path / "c")], str(tmp_path / "e"), vocab_size=TINY_VOCAB)

    read = read_back(tmp_path / "e")
    assert [ids.count(result.manifest.tokenizer.eod_id) for ids in read] == [1] * 5
    assert decode(tmp_path / "e", read[-1][:-1]) == f"first part {EOD_TOKEN} second part\n" * 3


def test_worker_count_does_not_change_the_output_bytes(tmp_path, monkeypatch):
    write_text_corpus(tmp_path / "c", documents(30, seed=3))
    write_jsonl(tmp_path / "c" / "big.jsonl", [{"text": text} for text in documents(60, seed=4)])
    monkeypatch.setattr(prepare_module, "BATCH_BYTES", 2048)  # many batches, so the workers interleave

    for workers in (1, 2):
        args = [
            tmp_path / "c",
            "--vocab-size",
            TINY_VOCAB,
            "--workers",
            workers,
            "--output",
            tmp_path / f"w{workers}",
        ]
        assert prepare_cli(*args) == 0

    for suffix in (".bin", ".idx", ".tokenizer.json"):
        assert (tmp_path / f"w1{suffix}").read_bytes() == (tmp_path / f"w2{suffix}").read_bytes(), suffix


def test_same_inputs_again_is_cached_and_force_rebuilds(text_corpus, tmp_path, capsys):
    corpus, _ = text_corpus
    args = [corpus, "--vocab-size", TINY_VOCAB, "--output", tmp_path / "c"]
    assert prepare_cli(*args) == 0
    written = {path: path.stat().st_mtime_ns for path in DatasetFiles(str(tmp_path / "c")).all()}
    capsys.readouterr()

    assert prepare_cli(*args) == 0
    assert "cached" in capsys.readouterr().err
    assert {path: path.stat().st_mtime_ns for path in written} == written

    assert prepare_cli(*args, "--force") == 0
    assert "cached" not in capsys.readouterr().err
    assert all(path.stat().st_mtime_ns != mtime for path, mtime in written.items())


def test_an_interrupted_prepare_leaves_no_file_under_the_final_names(text_corpus, tmp_path, monkeypatch):
    corpus, _ = text_corpus
    monkeypatch.setattr(prepare_module, "BATCH_BYTES", 1024)
    original = prepare_module.encode_batch
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(prepare_module, "encode_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset([str(corpus)], str(tmp_path / "out" / "x"), vocab_size=TINY_VOCAB)

    assert len(calls) == 3
    assert list((tmp_path / "out").iterdir()) == []  # no final names, no temporary files either


def test_a_failed_rebuild_keeps_the_previous_dataset_intact(text_corpus, tmp_path, monkeypatch):
    corpus, _ = text_corpus
    prepare_dataset([str(corpus)], str(tmp_path / "x"), vocab_size=TINY_VOCAB)
    files = DatasetFiles(str(tmp_path / "x"))
    before = {path: path.read_bytes() for path in files.all()}

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(prepare_module, "encode_batch", broken)
    with pytest.raises(OSError, match="disk full"):
        prepare_dataset([str(corpus)], str(tmp_path / "x"), vocab_size=TINY_VOCAB + 20, force=True)

    assert {path: path.read_bytes() for path in files.all()} == before
    assert sorted(tmp_path.glob("x.*")) == sorted(files.all())


def test_jsonl_errors_name_the_line_even_past_the_first_piece(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("trainer.data.sources.PIECE_BYTES", 64)  # the bad line lies in a later piece
    records = [{"text": f"line {index} " * 4} for index in range(12)]
    path = write_jsonl(tmp_path / "d.jsonl", records)
    lines = path.read_text().splitlines()
    lines[8] = '{"text": "unterminated'
    path.write_text("\n".join(lines) + "\n")

    assert prepare_cli(path, "--output", tmp_path / "o") == 2

    assert f"{path}:9: not valid JSON" in capsys.readouterr().err
    assert list(tmp_path.glob("o*")) == []


def error_cases(tmp_path: Path) -> dict[str, tuple[list, str]]:
    """name -> (prepare arguments, the message it must print); files are created on demand below."""
    corpus = tmp_path / "corpus"
    return {
        "input missing": ([tmp_path / "nope"], f"input '{tmp_path / 'nope'}' does not exist"),
        "no inputs": ([], "no inputs: give INPUT files or directories, or --stdlib"),
        "no matching files": ([corpus, "--glob", "*.csv"], "has no files matching *.csv"),
        "empty corpus": (
            [tmp_path / "empty"],
            "the inputs hold no text: 2 file(s), 2 document(s), all empty",
        ),
        "text key absent": (
            [tmp_path / "keys.jsonl"],
            f"{tmp_path / 'keys.jsonl'}:1: no 'text' key (keys present: 'id', 'body'); choose one with --text-key",
        ),
        "text not a string": (
            [tmp_path / "num.jsonl"],
            f"{tmp_path / 'num.jsonl'}:2: 'text' is int, expected a string",
        ),
        "jsonl line not an object": (
            [tmp_path / "list.jsonl"],
            f"{tmp_path / 'list.jsonl'}:1: expected a JSON object",
        ),
        "not utf-8": ([tmp_path / "latin1.txt"], f"{tmp_path / 'latin1.txt'}: not UTF-8 text"),
        "tokenizer invalid": (
            [corpus, "--tokenizer", tmp_path / "bad.json"],
            "is not a valid Hugging Face tokenizer.json",
        ),
        "tokenizer missing": ([corpus, "--tokenizer", tmp_path / "none.json"], "does not exist"),
        "tokenizer without eod": (
            [corpus, "--tokenizer", tmp_path / "noeod.json"],
            "has no end-of-document token: expected one of <|endoftext|>, <|end_of_text|>, </s>, <eos>; "
            "its special tokens are: <unk>",
        ),
        "tokenizer that drops text": (
            [corpus, "--tokenizer", tmp_path / "noa.json"],
            "encodes the text 'a' to no tokens; it cannot encode documents",
        ),
        "vocab size with tokenizer": (
            [corpus, "--tokenizer", tmp_path / "given.json", "--vocab-size", "500"],
            "--vocab-size sizes the tokenizer prepare trains",
        ),
        "vocab size too small": (
            [corpus, "--vocab-size", "100"],
            "--vocab-size 100 is too small: at least 257",
        ),
        "output is a file name": ([corpus, "--output", tmp_path / "x.bin"], "is a prefix, not a file name"),
        "workers": ([corpus, "--workers", "0"], "--workers 0: must be at least 1"),
    }


@pytest.mark.parametrize("case", list(error_cases(Path("/")).keys()))
def test_bad_input_fails_before_any_work_with_a_clear_message(case, tmp_path, capsys):
    write_text_corpus(tmp_path / "corpus", documents(3, seed=5))
    write_text_corpus(tmp_path / "empty", ["", ""])
    write_jsonl(tmp_path / "keys.jsonl", [{"id": 1, "body": "x"}])
    write_jsonl(tmp_path / "num.jsonl", [{"text": "fine"}, {"text": 7}])
    write_jsonl(tmp_path / "list.jsonl", [[1, 2]])
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    (tmp_path / "bad.json").write_text('{"model": 1}')
    train_given_tokenizer(tmp_path / "noeod.json", ["a b c"], eod="<unk>")
    train_given_tokenizer(tmp_path / "given.json", ["a b c"], eod="</s>")
    train_given_tokenizer(tmp_path / "noa.json", ["b c"], eod="</s>")  # no "a", and no unknown token
    args, message = error_cases(tmp_path)[case]
    if "--output" not in map(str, args):
        args = [*args, "--output", tmp_path / "out" / "d"]

    assert prepare_cli(*args) == 2

    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_existing_output_from_other_inputs_needs_force(text_corpus, tmp_path, capsys):
    corpus, _ = text_corpus
    assert prepare_cli(corpus, "--vocab-size", TINY_VOCAB, "--output", tmp_path / "d") == 0
    (corpus / "doc000.txt").write_text("changed")
    before = (tmp_path / "d.bin").read_bytes()

    assert prepare_cli(corpus, "--vocab-size", TINY_VOCAB, "--output", tmp_path / "d") == 2

    message = capsys.readouterr().err
    assert (
        f"holds a dataset prepared from other inputs (1 input file(s) changed, e.g. {corpus / 'doc000.txt'})"
        in message
    )
    assert "pass --force to replace it" in message
    assert (tmp_path / "d.bin").read_bytes() == before
    assert read_manifest(DatasetFiles(str(tmp_path / "d"))) is not None


def test_inputs_in_another_order_are_another_dataset(tmp_path, capsys):
    write_text_corpus(tmp_path / "one", documents(2, seed=6))
    write_text_corpus(tmp_path / "two", documents(2, seed=7))
    assert (
        prepare_cli(
            tmp_path / "one", tmp_path / "two", "--vocab-size", TINY_VOCAB, "--output", tmp_path / "d"
        )
        == 0
    )

    assert (
        prepare_cli(
            tmp_path / "two", tmp_path / "one", "--vocab-size", TINY_VOCAB, "--output", tmp_path / "d"
        )
        == 2
    )

    assert "prepared from other inputs (the same input files in another order)" in capsys.readouterr().err


def test_output_not_written_by_prepare_needs_force(text_corpus, tmp_path, capsys):
    corpus, _ = text_corpus
    (tmp_path / "d.bin").write_bytes(b"someone else's")

    assert prepare_cli(corpus, "--vocab-size", TINY_VOCAB, "--output", tmp_path / "d") == 2

    assert "d.bin exists but no d.manifest.json says what it holds" in capsys.readouterr().err
    assert (tmp_path / "d.bin").read_bytes() == b"someone else's"
