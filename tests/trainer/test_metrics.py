"""Metrics: MFU left null where no peak is meaningful, metrics.jsonl's keys (the FLOPs formula: tests/plan)."""

from trainer.cost import ledger
from trainer.metrics import JSONL_KEYS, peak_tflops_per_device


def test_cpu_has_no_peak_so_mfu_is_not_invented():
    assert peak_tflops_per_device(None) is None
    assert peak_tflops_per_device(989.0) == 989.0


def test_metrics_jsonl_has_exactly_the_promised_keys(single):
    records = single.records
    assert [r["step"] for r in records] == list(range(0, 21))
    for record in records:
        expected = (
            set(JSONL_KEYS) | set(ledger.JSONL_KEYS) | ({"val_loss"} if record["step"] in (0, 20) else set())
        )
        assert set(record) == expected
    trained = records[1:]
    assert all(r["mfu"] is None and r["tokens_per_s"] > 0 and r["tflops_per_device"] > 0 for r in trained)
    assert records[-1]["val_loss"] < records[0]["val_loss"]
    # No price: the ledger counts node-hours and goodput, and leaves dollars null rather than invent one.
    assert all(r["dollars"] is None and r["node_hours"]["local"] > 0 for r in trained)
    assert all(abs(sum(r["paid_time_shares"].values()) - 1) < 1e-9 for r in trained)
    assert JSONL_KEYS == (
        "step",
        "loss",
        "lr",
        "grad_norm",
        "tokens_per_s",
        "tflops_per_device",
        "mfu",
        "step_time_s",
        "skipped_steps",
    )
