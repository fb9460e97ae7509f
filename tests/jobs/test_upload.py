"""Uploading a prepared dataset to the stack's datasets bucket: SSE-KMS with the stack key, byte-identical."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from boto3.s3.transfer import TransferConfig
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from trainer.aws.outputs import load_outputs
from trainer.jobs import upload as upload_module

from .conftest import ROOT, Stack


def write_dataset(prefix, documents: int, tokens_per_document: int) -> None:
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    rng = np.random.default_rng(0)
    for _ in range(documents):
        builder.add_document(
            rng.integers(0, 8192, tokens_per_document, dtype=np.int64), [tokens_per_document]
        )
    builder.finalize(f"{prefix}.idx")
    prefix.with_name(prefix.name + ".tokenizer.json").write_text('{"model": {}}')


def test_upload_cli_writes_every_dataset_file_encrypted_with_the_stack_key(stack: Stack, tmp_path):
    prefix = tmp_path / "corpus"
    write_dataset(prefix, documents=20, tokens_per_document=100)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "upload",
            "--stack",
            "test",
            "--outputs",
            str(stack.outputs_file),
            "--prefix",
            str(prefix),
            "--name",
            "corpus-v2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "--set data.prefixes=[/fsx/datasets/corpus-v2/corpus]" in result.stdout
    assert "--set data.tokenizer_path=/fsx/datasets/corpus-v2/corpus.tokenizer.json" in result.stdout
    s3 = stack.client("s3")
    for name in ("corpus.bin", "corpus.idx", "corpus.tokenizer.json"):
        stored = s3.get_object(Bucket="trainstack-test-datasets", Key=f"corpus-v2/{name}")
        assert stored["Body"].read() == (tmp_path / name).read_bytes()
        assert stored["ServerSideEncryption"] == "aws:kms"
        assert stored["SSEKMSKeyId"] == stack.outputs["kms_key_arn"]


def test_a_chat_dataset_goes_up_with_its_loss_mask(stack: Stack, tmp_path):
    prefix = tmp_path / "chat"
    write_dataset(prefix, documents=4, tokens_per_document=50)
    (tmp_path / "chat.chat.json").write_text("{}")  # prepare --format chat marks its mask complete with it
    with pytest.raises(upload_module.UploadError, match=r"chat-mask\.bin and .*chat-mask\.idx not found"):
        upload_module.dataset_files(prefix)
    write_dataset(tmp_path / "chat-mask", documents=4, tokens_per_document=50)
    keys = upload_module.upload(load_outputs("test", stack.outputs_file), prefix, "chat-v1")
    assert sorted(keys) == [
        f"chat-v1/{name}"
        for name in (
            "chat-mask.bin",
            "chat-mask.idx",
            "chat.bin",
            "chat.chat.json",
            "chat.idx",
            "chat.tokenizer.json",
        )
    ]
    stored = stack.client("s3").get_object(Bucket="trainstack-test-datasets", Key="chat-v1/chat-mask.bin")
    assert stored["Body"].read() == (tmp_path / "chat-mask.bin").read_bytes()


def test_large_shards_go_up_in_parts(stack: Stack, tmp_path, monkeypatch):
    prefix = tmp_path / "big"
    write_dataset(prefix, documents=60, tokens_per_document=100_000)  # 12 MB of uint16 tokens
    # One part at a time: moto's request recorder interleaves lines written by concurrent requests.
    small_parts = TransferConfig(
        multipart_threshold=5 * 2**20, multipart_chunksize=5 * 2**20, max_concurrency=1
    )
    monkeypatch.setattr(upload_module, "TRANSFER", small_parts)
    keys = upload_module.upload(load_outputs("test", stack.outputs_file), prefix, "big")
    assert keys == ["big/big.bin", "big/big.idx", "big/big.tokenizer.json"]
    parts = [entry for entry in stack.recorded("partNumber=") if "big.bin" in entry["url"]]
    assert len(parts) == 3, "12 MB in 5 MiB parts"
    stored = (
        stack.client("s3").get_object(Bucket="trainstack-test-datasets", Key="big/big.bin")["Body"].read()
    )
    assert stored == (tmp_path / "big.bin").read_bytes()


def test_upload_without_a_prepared_dataset_says_so(tmp_path):
    with pytest.raises(
        upload_module.UploadError, match=r"nothing\.bin and .*nothing\.idx not found; prepare"
    ):
        upload_module.dataset_files(tmp_path / "nothing")
