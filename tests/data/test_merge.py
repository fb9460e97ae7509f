"""`python -m trainer merge`: shards prepared apart and merged with megatron-core's builder are byte for byte the
dataset one `prepare` of the whole corpus writes (a real corpus: Python standard library packages)."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset

from trainer.__main__ import main as trainer_main
from trainer.data import DataError
from trainer.data.manifest import DatasetFiles, read_manifest
from trainer.data.merge import merge_datasets
from trainer.data.prepare import prepare_dataset
from trainer.data.validate import ValidationLimits

STDLIB = Path(sysconfig.get_paths()["stdlib"])
# The corpus below rejects 1 of 28 records (3.6 %); a shard alone may reject more, so shards check nothing (as the
# Batch array's children do) and the corpus's limit applies to the whole and to the merge.
LIMIT = 0.1


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[list[Path], Path]:
    """The `json` and `email` packages' sources (real text, about 300 KB), plus a copy of one file placed in a
    later shard (a repeat across shards), an empty file and a Latin-1 one (rejected); and a tokenizer trained on
    part of them once."""
    root = tmp_path_factory.mktemp("corpus")
    files = sorted((STDLIB / "json").glob("*.py")) + sorted((STDLIB / "email").glob("*.py"))
    repeat = root / "repeat_of_json_decoder.py"
    shutil.copyfile(STDLIB / "json" / "decoder.py", repeat)
    empty = root / "empty.py"
    empty.write_text("")
    latin1 = root / "latin1.py"
    latin1.write_bytes("café = 1\n".encode("latin-1"))
    files = [*files[:10], empty, *files[10:16], latin1, *files[16:], repeat]
    prepare_dataset([str(files[0]), str(files[1])], str(root / "vocab"), vocab_size=1024)
    return files, root / "vocab.tokenizer.json"


def prepare(files: list[Path], prefix: Path, tokenizer: Path, max_reject_rate: float = 1.0):
    return prepare_dataset(
        [str(path) for path in files],
        str(prefix),
        tokenizer=str(tokenizer),
        limits=ValidationLimits(max_reject_rate=max_reject_rate),
    )


def test_merged_shards_equal_one_prepare_of_the_whole_corpus_byte_for_byte(corpus, tmp_path):
    files, tokenizer = corpus
    whole = prepare(files, tmp_path / "whole" / "corpus", tokenizer, max_reject_rate=LIMIT)
    cuts = [0, 7, 15, 23, len(files)]
    shards = [tmp_path / "shards" / f"shard-{k}" for k in range(len(cuts) - 1)]
    for shard, low, high in zip(shards, cuts, cuts[1:], strict=False):
        prepare(files[low:high], shard, tokenizer)

    merged = merge_datasets(
        [str(s) for s in shards], str(tmp_path / "merged" / "corpus"), max_reject_rate=LIMIT
    )

    for suffix in (".bin", ".idx", ".digests", ".tokenizer.json"):
        assert (tmp_path / "merged" / f"corpus{suffix}").read_bytes() == (
            tmp_path / "whole" / f"corpus{suffix}"
        ).read_bytes(), suffix
    assert merged.repeats == 1
    m, w = merged.manifest, whole.manifest
    assert (m.documents, m.tokens, m.max_token_id, m.idx_sha256, m.bin_sampled_sha256) == (
        w.documents,
        w.tokens,
        w.max_token_id,
        w.idx_sha256,
        w.bin_sampled_sha256,
    )
    assert m.validation is not None and w.validation is not None
    assert (m.validation.records, m.validation.kept, m.validation.rejected) == (
        w.validation.records,
        w.validation.kept,
        w.validation.rejected,
    )
    assert m.request.inputs == w.request.inputs
    assert m.merged_from == [read_manifest(DatasetFiles(str(s))).idx_sha256 for s in shards]
    assert len(IndexedDataset(str(tmp_path / "merged" / "corpus"))) == w.documents

    again = merge_datasets(
        [str(s) for s in shards], str(tmp_path / "merged" / "corpus"), max_reject_rate=LIMIT
    )
    assert again.cached
    assert m.request == w.request


def test_the_merge_refuses_shards_that_together_reject_more_than_the_limit(corpus, tmp_path):
    files, tokenizer = corpus
    prepare(files[:12], tmp_path / "a", tokenizer)  # the empty file
    prepare(files[12:], tmp_path / "b", tokenizer)  # the Latin-1 file, and the repeat of a file of the first

    with pytest.raises(DataError) as refused:
        merge_datasets(
            [str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "out" / "m"), max_reject_rate=0.02
        )

    assert "1 of 28 records rejected (1 invalid_utf8): 3.6% of the corpus" in str(refused.value)
    assert "latin1.py: not UTF-8 text" in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_the_cli_merges_and_says_what_it_wrote(corpus, tmp_path, capsys):
    files, tokenizer = corpus
    prepare(files[:5], tmp_path / "a", tokenizer)
    prepare(files[5:9], tmp_path / "b", tokenizer)

    assert (
        trainer_main(["merge", "--output", str(tmp_path / "m"), str(tmp_path / "a"), str(tmp_path / "b")])
        == 0
    )

    assert "merged, 0 repeats across shards left out" in capsys.readouterr().out
    assert (tmp_path / "m.bin").stat().st_size == (tmp_path / "a.bin").stat().st_size + (
        tmp_path / "b.bin"
    ).stat().st_size


def test_shards_of_another_tokenizer_are_refused_before_anything_is_written(corpus, tmp_path):
    files, tokenizer = corpus
    prepare(files[:3], tmp_path / "a", tokenizer)
    prepare_dataset([str(path) for path in files[3:6]], str(tmp_path / "b"), vocab_size=512)

    with pytest.raises(DataError, match=r"shard '.*/b' differs from '.*/a' in its tokenizer SHA-256"):
        merge_datasets([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "out" / "m"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("shards", "message"),
    [
        (["missing"], "shard '{tmp}/missing' has no missing.manifest.json: prepare it first"),
        (["a", "a"], "shard '{tmp}/a' is given twice"),
        ([], "no SHARD_PREFIX given"),
    ],
)
def test_bad_shard_lists_fail_with_a_clear_message(corpus, tmp_path, shards, message):
    files, tokenizer = corpus
    prepare(files[:2], tmp_path / "a", tokenizer)

    with pytest.raises(DataError) as refused:
        merge_datasets([str(tmp_path / s) for s in shards], str(tmp_path / "out" / "m"))
    assert message.format(tmp=tmp_path) in str(refused.value)
    assert not (tmp_path / "out").exists()
