"""Model version records: hashes that follow the data and the config and nothing else, written once, evaluations
added beside them without a rewrite."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.training import sealed_checkpoint
from trainer.checkpoint.version import (
    RECORD,
    Lineage,
    RecordError,
    add_evaluation,
    read_evaluations,
    read_record,
    write_record,
)
from trainer.config import load_config
from trainer.data.prepare import prepare_dataset

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def prepared(directory: Path, text: str, *, tokenizer: str | None = None) -> str:
    """A dataset prepared from one text file (a trained 300-token BPE, or the given tokenizer); its prefix."""
    source = directory / "source"
    source.mkdir(parents=True, exist_ok=True)
    (source / "corpus.txt").write_text(text)
    prefix = str(directory / "corpus")
    if tokenizer:
        prepare_dataset([str(source)], prefix, tokenizer=tokenizer, workers=1, force=True)
    else:
        prepare_dataset([str(source)], prefix, vocab_size=300, workers=1, force=True)
    return prefix


@pytest.fixture
def data(tmp_path) -> str:
    return prepared(tmp_path / "a", TEXT)


def config(prefix: str, tokenizer: str, *overrides: str) -> dict:
    """The tests' tiny config on this dataset, resolved, as the checkpointer hands it to the record."""
    tiny = Path(__file__).parents[1] / "support" / "tiny.yaml"
    sets = [f"data.prefixes=[{prefix}]", f"data.tokenizer_path={tokenizer}", *overrides]
    return load_config(tiny, sets, device="cpu").model_dump(mode="json")


def test_equal_config_and_data_give_equal_hashes_even_after_the_inputs_are_prepared_again(data, tmp_path):
    first = Lineage(config(data, data + ".tokenizer.json"), environ={})
    # Prepared again from the same text (a new mtime in the manifest's request): the same content.
    os.utime(tmp_path / "a" / "source" / "corpus.txt", (1, 1))
    again = prepared(tmp_path / "a", TEXT, tokenizer=data + ".tokenizer.json")
    second = Lineage(config(again, data + ".tokenizer.json"), environ={})
    assert [d.sha256 for d in first.datasets] == [d.sha256 for d in second.datasets]
    assert (first.config_sha256, first.lineage_sha256) == (second.config_sha256, second.lineage_sha256)


def test_changed_data_changes_the_dataset_and_lineage_hashes_not_the_config_hash(data, tmp_path):
    before = Lineage(config(data, data + ".tokenizer.json"), environ={})
    prepared(tmp_path / "a", TEXT + "a new sentence at the end.", tokenizer=data + ".tokenizer.json")
    after = Lineage(config(data, data + ".tokenizer.json"), environ={})
    assert before.datasets[0].sha256 != after.datasets[0].sha256
    assert before.lineage_sha256 != after.lineage_sha256
    assert before.config_sha256 == after.config_sha256
    assert before.tokenizer_sha256 == after.tokenizer_sha256


def test_changed_config_changes_the_config_and_lineage_hashes_not_the_data_hash(data):
    tokenizer = data + ".tokenizer.json"
    before = Lineage(config(data, tokenizer), environ={})
    after = Lineage(config(data, tokenizer, "optimizer.lr=2.0e-3"), environ={})
    assert before.config_sha256 != after.config_sha256
    assert before.lineage_sha256 != after.lineage_sha256
    assert [d.sha256 for d in before.datasets] == [d.sha256 for d in after.datasets]
    assert after.config["optimizer"]["lr"] == 2.0e-3


def test_a_record_is_written_once_and_never_overwritten(data, tmp_path):
    lineage = Lineage(config(data, data + ".tokenizer.json"), environ={})
    checkpoint = sealed_checkpoint(tmp_path / "run" / "checkpoints" / "iter_0000005", val_loss=2.5)
    path = write_record(checkpoint, lineage.record(checkpoint, 5, {"val_loss": 2.5}))
    written = path.read_bytes()
    with pytest.raises(RecordError, match="written once, never replaced"):
        write_record(checkpoint, lineage.record(checkpoint, 5, {"val_loss": 1.0}))
    assert path.read_bytes() == written
    assert sorted(p.name for p in checkpoint.iterdir()) == ["common.pt", "manifest.json", RECORD]
    record = read_record(checkpoint)
    assert record.version.startswith("tiny-s5-") and record.metrics == {"val_loss": 2.5}
    assert record.datasets[0].prefix == data and record.tokenizer_sha256 == lineage.tokenizer_sha256


def test_only_a_published_checkpoint_gets_a_record(data, tmp_path):
    lineage = Lineage(config(data, data + ".tokenizer.json"), environ={})
    unsealed = tmp_path / "iter_0000005.tmp"
    unsealed.mkdir()
    with pytest.raises(RecordError, match=r"no manifest\.json"):
        lineage.record(unsealed, 5, {})


def test_a_fine_tune_names_its_parent_and_a_job_its_image(data, tmp_path):
    tokenizer = data + ".tokenizer.json"
    base = sealed_checkpoint(tmp_path / "base" / "iter_0000010")
    (base.parent / "latest").write_text("iter_0000010\n")
    write_record(base, Lineage(config(data, tokenizer), environ={}).record(base, 10, {}))
    environ = {"TRAINSTACK_IMAGE_TAG": "0123456789ab", "TRAINSTACK_IMAGE_DIGEST": "sha256:" + "a" * 64}
    tuned = Lineage(
        config(data, tokenizer, f"checkpoint.load={base.parent}", "checkpoint.finetune=true"), environ
    )
    assert tuned.parent is not None
    assert tuned.parent.checkpoint == str(base) and tuned.parent.version == read_record(base).version
    assert tuned.image is not None and tuned.image.digest == environ["TRAINSTACK_IMAGE_DIGEST"]
    assert Lineage(config(data, tokenizer), environ={}).image is None


def test_evaluations_are_added_beside_the_record_without_rewriting_it(data, tmp_path):
    checkpoint = sealed_checkpoint(tmp_path / "iter_0000005")
    with pytest.raises(RecordError, match="registered model version"):
        add_evaluation(checkpoint, "heldout", {"perplexity": 12.0})
    write_record(
        checkpoint, Lineage(config(data, data + ".tokenizer.json"), environ={}).record(checkpoint, 5, {})
    )
    record = (checkpoint / RECORD).read_bytes()
    add_evaluation(checkpoint, "heldout", {"perplexity": 12.0})
    add_evaluation(checkpoint, "qa-exact-match", {"exact_match": 0.5, "ci95": [0.3, 0.7]})
    with pytest.raises(RecordError, match="written once"):
        add_evaluation(checkpoint, "heldout", {"perplexity": 1.0})
    with pytest.raises(RecordError, match="evaluation name 'bad/name'"):
        add_evaluation(checkpoint, "bad/name", {})
    assert (checkpoint / RECORD).read_bytes() == record
    assert [(e["name"], e["results"]) for e in read_evaluations(checkpoint)] == [
        ("heldout", {"perplexity": 12.0}),
        ("qa-exact-match", {"ci95": [0.3, 0.7], "exact_match": 0.5}),
    ]


def test_a_damaged_record_is_named_with_its_problem(tmp_path):
    checkpoint = sealed_checkpoint(tmp_path / "iter_0000005")
    (checkpoint / RECORD).write_text(json.dumps({"version": "x"}))
    with pytest.raises(RecordError, match=r"model_version.json is not a model version record \(\d+ problem"):
        read_record(checkpoint)
