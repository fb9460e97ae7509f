"""The trainer's view of prepared data: megatron-core GPT datasets, blends, sample order, resume positions, and
the tokenizer check."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from tests.data.conftest import TINY_VOCAB, documents, write_jsonl, write_text_corpus
from trainer.data import DataError
from trainer.data.datasets import build_gpt_datasets, check_tokenizer_matches_dataset
from trainer.data.manifest import sampled_sha256
from trainer.data.prepare import prepare_dataset
from trainer.data.sampler import FIELDS, sample_batches
from trainer.data.tokenizer import load_tokenizer

SEQ = 16


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict[str, str]:
    """Two datasets with one tokenizer: "a" (text files) trains it, "b" (JSONL, other text) reuses it."""
    root = tmp_path_factory.mktemp("prepared")
    write_text_corpus(root / "a", documents(40, seed=10))
    write_jsonl(root / "b.jsonl", [{"text": text.upper()} for text in documents(60, seed=11)])
    prepare_dataset([str(root / "a")], str(root / "a"), vocab_size=TINY_VOCAB)
    prepare_dataset([str(root / "b.jsonl")], str(root / "b"), tokenizer=str(root / "a.tokenizer.json"))
    return {"a": str(root / "a"), "b": str(root / "b"), "tokenizer": str(root / "a.tokenizer.json")}


def build(prepared, **overrides):
    arguments = {
        "prefixes": [prepared["a"]],
        "weights": None,
        "split": "90,10,0",
        "seq_length": SEQ,
        "seed": 1234,
        "num_samples": (200, 20, 0),
        "tokenizer_path": prepared["tokenizer"],
        "cache_dir": None,
    }
    return build_gpt_datasets(**{**arguments, **overrides})


def tokens_of(dataset, count: int) -> list[list[int]]:
    return [dataset[index]["tokens"].tolist() for index in range(count)]


def test_samples_are_next_token_pairs_over_eod_separated_documents(prepared):
    train, valid, test = build(prepared)

    assert len(train) >= 200 and len(valid) >= 20 and test is None
    sample = train[0]
    assert set(FIELDS) <= sample.keys() and "attention_mask" not in sample
    assert sample["tokens"].shape == (SEQ,) and sample["tokens"].dtype == torch.int64
    assert sample["tokens"][1:].tolist() == sample["labels"][:-1].tolist()
    assert sample["position_ids"].tolist() == list(range(SEQ))
    assert sample["loss_mask"].tolist() == [1.0] * SEQ
    eod = load_tokenizer(prepared["tokenizer"]).eod
    assert any(eod in train[index]["tokens"].tolist() for index in range(len(train)))


def test_blend_draws_each_dataset_in_proportion_to_its_weight(prepared):
    train, _, _ = build(
        prepared, prefixes=[prepared["a"], prepared["b"]], weights=[1.0, 3.0], num_samples=(400, 40, 0)
    )

    drawn = Counter(int(train[index]["dataset_id"]) for index in range(len(train)))

    assert len(train) >= 400
    assert drawn[0] / len(train) == pytest.approx(0.25, abs=0.02)
    assert drawn[1] / len(train) == pytest.approx(0.75, abs=0.02)


def test_sample_order_is_fixed_by_the_seed_and_changes_with_it(prepared):
    first = tokens_of(build(prepared, seed=7)[0], 50)

    assert tokens_of(build(prepared, seed=7)[0], 50) == first
    assert tokens_of(build(prepared, seed=8)[0], 50) != first


def test_resuming_at_consumed_samples_gives_the_tail_of_the_uninterrupted_run(prepared):
    train, _, _ = build(prepared)
    global_batch, micro_batch = 8, 2

    straight = list(sample_batches(train, 0, global_batch, micro_batch, 0, 1))
    resumed = list(sample_batches(train, 3 * global_batch, global_batch, micro_batch, 0, 1))

    micro_batches_per_step = global_batch // micro_batch
    assert len(straight) == len(train) // global_batch * micro_batches_per_step
    assert len(resumed) == len(straight) - 3 * micro_batches_per_step
    for expected, got in zip(straight[3 * micro_batches_per_step :], resumed, strict=True):
        assert all(torch.equal(expected[field], got[field]) for field in FIELDS)
    assert straight[0]["tokens"].shape == (micro_batch, SEQ)


def test_data_parallel_ranks_split_each_global_batch_between_them(prepared):
    train, _, _ = build(prepared)

    single = list(sample_batches(train, 16, 8, 2, 0, 1))
    rank0 = list(sample_batches(train, 16, 8, 2, 0, 2))
    rank1 = list(sample_batches(train, 16, 8, 2, 1, 2))

    step = torch.cat([batch["tokens"] for batch in single[:4]])
    together = torch.cat(
        [torch.cat([a["tokens"], b["tokens"]]) for a, b in zip(rank0[:2], rank1[:2], strict=True)]
    )
    assert torch.equal(step, together)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            (0, 6, 4, 0, 1),
            "global_batch_size 6 must be a positive multiple of micro_batch_size x data_parallel_size",
        ),
        ((0, 8, 2, 2, 2), "data_parallel_rank 2: must be in 0..1"),
        ((10**6, 8, 2, 0, 1), "consumed_samples 1000000: must be in 0.."),
        ((0, 8, 0, 0, 1), "micro_batch_size 0 and data_parallel_size 1 must be at least 1"),
    ],
)
def test_sample_batches_rejects_an_impossible_layout(prepared, arguments, message):
    train, _, _ = build(prepared)
    with pytest.raises(DataError, match=re.escape(message)):
        sample_batches(train, *arguments)


@pytest.fixture
def single_process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_cache_dir_keeps_the_sample_indices_for_the_next_run(prepared, tmp_path, single_process_group):
    cache = tmp_path / "index-cache"
    first = tokens_of(
        build(prepared, prefixes=[prepared["a"], prepared["b"]], weights=[1, 1], cache_dir=str(cache))[0], 30
    )
    written = sorted(path.name for path in cache.iterdir())

    again = build(prepared, prefixes=[prepared["a"], prepared["b"]], weights=[1, 1], cache_dir=str(cache))[0]

    assert any(name.endswith("shuffle_index.npy") for name in written)
    assert any(name.endswith("dataset_index.npy") for name in written)
    assert sorted(path.name for path in cache.iterdir()) == written
    assert tokens_of(again, 30) == first
    assert tokens_of(build(prepared, prefixes=[prepared["a"], prepared["b"]], weights=[1, 1])[0], 30) == first


def test_cache_dir_without_a_process_group_is_refused(prepared, tmp_path):
    with pytest.raises(DataError, match=r"cache_dir .* needs torch.distributed initialized"):
        build(prepared, cache_dir=str(tmp_path / "cache"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"prefixes": []}, "give at least one prepared dataset prefix"),
        ({"weights": [1.0, 2.0]}, r"data weights \[1.0, 2.0\]: one weight per prefix"),
        ({"prefixes": ["A", "B"], "weights": [1.0, 0.0]}, "every weight must be above 0"),
        ({"split": "90,10"}, "split '90,10': give three non-negative weights for train,valid,test"),
        ({"split": "0,1,1"}, "the train weight must be above 0"),
        ({"seq_length": 0}, "seq_length 0: must be at least 1"),
        ({"num_samples": (10, -1, 0)}, "three non-negative counts"),
        ({"prefixes": ["/nowhere/x"]}, "dataset '/nowhere/x' not found: no /nowhere/x.bin or /nowhere/x.idx"),
        (
            {"split": "98,1,1"},
            r"split '98,1,1' leaves the test split of dataset .* \(40 documents\) no document",
        ),
    ],
)
def test_bad_dataset_arguments_fail_with_the_value_and_what_would_be_valid(prepared, overrides, message):
    with pytest.raises(DataError, match=message):
        build(prepared, **overrides)


def test_a_dataset_refuses_a_tokenizer_it_was_not_made_with(prepared, tmp_path):
    write_text_corpus(tmp_path / "other", documents(5, seed=12))
    prepare_dataset([str(tmp_path / "other")], str(tmp_path / "other"), vocab_size=TINY_VOCAB + 40)

    with pytest.raises(DataError) as error:
        check_tokenizer_matches_dataset(prepared["a"], load_tokenizer(tmp_path / "other.tokenizer.json"))

    assert (
        f"dataset {prepared['a']!r} was tokenized with {prepared['a']}.tokenizer.json (vocab {TINY_VOCAB}"
        in str(error.value)
    )
    assert f"(vocab {TINY_VOCAB + 40}" in str(error.value)
    check_tokenizer_matches_dataset(prepared["b"], load_tokenizer(prepared["tokenizer"]))


def test_a_dataset_changed_after_prepare_is_refused(prepared, tmp_path):
    for suffix in (".bin", ".idx", ".manifest.json", ".tokenizer.json"):
        (tmp_path / f"c{suffix}").write_bytes(Path(prepared["a"] + suffix).read_bytes())
    with (tmp_path / "c.bin").open("ab") as stream:
        stream.write(b"\0\0")

    with pytest.raises(DataError, match=r"is incomplete or changed since prepare: .*c\.bin is \d+ bytes"):
        check_tokenizer_matches_dataset(str(tmp_path / "c"), load_tokenizer(tmp_path / "c.tokenizer.json"))
    (tmp_path / "c.bin").write_bytes(Path(prepared["a"] + ".bin").read_bytes())
    (tmp_path / "c.tokenizer.json").write_text((tmp_path / "c.tokenizer.json").read_text() + " ")
    with pytest.raises(DataError, match=r"c\.tokenizer\.json is not the tokenizer its manifest records"):
        check_tokenizer_matches_dataset(str(tmp_path / "c"), load_tokenizer(prepared["tokenizer"]))


def test_a_dataset_from_another_tool_is_checked_by_its_largest_token_id(prepared, tmp_path):
    tokenizer = load_tokenizer(prepared["tokenizer"])
    for name, top in (("fits", tokenizer.vocab_size - 1), ("beyond", tokenizer.vocab_size + 5)):
        builder = IndexedDatasetBuilder(str(tmp_path / f"{name}.bin"), dtype=np.uint16)
        builder.add_document(np.array([1, top, tokenizer.eod]), [3])
        builder.finalize(str(tmp_path / f"{name}.idx"))

    check_tokenizer_matches_dataset(str(tmp_path / "fits"), tokenizer)
    with pytest.raises(DataError, match=f"holds token id {tokenizer.vocab_size + 5}, beyond tokenizer"):
        check_tokenizer_matches_dataset(str(tmp_path / "beyond"), tokenizer)


def test_tokenizer_speaks_megatrons_interface(prepared):
    tokenizer = load_tokenizer(prepared["tokenizer"])
    manifest = json.loads(Path(prepared["a"] + ".manifest.json").read_text())

    assert (tokenizer.vocab_size, tokenizer.eod) == (TINY_VOCAB, manifest["tokenizer"]["eod_id"])
    assert tokenizer.unique_identifiers["sha256"] == manifest["tokenizer"]["sha256"]
    text = "def step(model):\n    return loss  # naïve ✓"
    assert tokenizer.detokenize(tokenizer.tokenize(text)) == text
    assert tokenizer.decode(tokenizer.encode("<|endoftext|>")) == "<|endoftext|>"
    assert tokenizer.eod not in tokenizer.tokenize("<|endoftext|>")


def copy_prepared(prepared, tmp_path, name="c") -> str:
    for suffix in (".bin", ".idx", ".manifest.json", ".tokenizer.json"):
        (tmp_path / f"{name}{suffix}").write_bytes(Path(prepared["a"] + suffix).read_bytes())
    return str(tmp_path / name)


def test_a_same_size_change_to_the_bin_or_idx_is_caught_by_the_manifest_hashes(prepared, tmp_path):
    prefix = copy_prepared(prepared, tmp_path)
    tokenizer = load_tokenizer(prepared["tokenizer"])
    check_tokenizer_matches_dataset(prefix, tokenizer)
    for suffix in (".bin", ".idx"):
        path = Path(prefix + suffix)
        original = path.read_bytes()
        flipped = bytearray(original)
        flipped[len(flipped) // 2] ^= 0x01  # one bit, size unchanged
        path.write_bytes(bytes(flipped))
        with pytest.raises(DataError, match=rf"c\{suffix} has the recorded size but other contents"):
            check_tokenizer_matches_dataset(prefix, tokenizer)
        path.write_bytes(original)


def test_forty_random_bytes_in_the_idx_of_a_dataset_without_manifest_are_refused(prepared, tmp_path):
    prefix = copy_prepared(prepared, tmp_path)
    Path(prefix + ".manifest.json").unlink()
    idx = bytearray(Path(prefix + ".idx").read_bytes())
    idx[60:100] = np.random.default_rng(0).bytes(40)
    Path(prefix + ".idx").write_bytes(bytes(idx))
    with pytest.raises(DataError, match=r"c\.idx is damaged or not .*c\.bin's index: sequence \d+ "):
        check_tokenizer_matches_dataset(prefix, load_tokenizer(prepared["tokenizer"]))


def test_the_sampled_bin_hash_reads_spread_blocks_of_a_large_file(tmp_path):
    path = tmp_path / "large.bin"
    path.write_bytes(np.random.default_rng(1).bytes(1 << 20))
    before = sampled_sha256(path, blocks=4, block_bytes=4096)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # the last block is always sampled
    path.write_bytes(bytes(data))
    assert sampled_sha256(path, blocks=4, block_bytes=4096) != before
    data[-1] ^= 0xFF
    data[1000 * 1024] ^= 0xFF  # between the blocks at 0, ~340 KiB, ~680 KiB and the end: not read
    path.write_bytes(bytes(data))
    assert sampled_sha256(path, blocks=4, block_bytes=4096) == before
    assert sampled_sha256(path) != before  # a file under 64 MiB is hashed whole
