"""Metrics: Megatron's model-FLOPs formula, MFU left null where no peak is meaningful, metrics.jsonl's keys."""

import pytest

from trainer.config import ModelConfig
from trainer.metrics import JSONL_KEYS, model_flops_per_sequence, peak_tflops_per_device


def test_model_flops_count_every_matmul_three_times_with_causal_attention_halved():
    m = ModelConfig(
        num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32, num_query_groups=8
    )
    s, h, head_dim, vocab = 8192, 4096, 128, 128256
    qkv = 2 * s * h * (32 + 2 * 8) * head_dim
    attention = 2 * (2 * s * s * h) / 2  # scores and weighted values, half of them masked
    projection = 2 * s * h * h
    mlp = 3 * 2 * s * h * 14336  # gate, up, down
    per_layer = qkv + attention + projection + mlp
    logits = 2 * s * h * vocab
    forward = 32 * per_layer + logits
    assert model_flops_per_sequence(m, s, vocab) == pytest.approx(3 * forward, rel=1e-12)


def test_cpu_has_no_peak_so_mfu_is_not_invented():
    assert peak_tflops_per_device(None) is None
    assert peak_tflops_per_device(989.0) == 989.0


def test_metrics_jsonl_has_exactly_the_promised_keys(single):
    records = single.records
    assert [r["step"] for r in records] == list(range(0, 21))
    for record in records:
        expected = set(JSONL_KEYS) | ({"val_loss"} if record["step"] in (0, 20) else set())
        assert set(record) == expected
    trained = records[1:]
    assert all(r["mfu"] is None and r["tokens_per_s"] > 0 and r["tflops_per_device"] > 0 for r in trained)
    assert records[-1]["val_loss"] < records[0]["val_loss"]
    assert JSONL_KEYS == (
        "step",
        "loss",
        "lr",
        "grad_norm",
        "tokens_per_s",
        "tflops_per_device",
        "mfu",
        "step_time_s",
    )
