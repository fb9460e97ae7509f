"""Metrics: MFU left null where no peak is meaningful, metrics.jsonl's keys (the FLOPs formula: tests/plan)."""

import pytest

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


def test_a_logged_steps_ledger_reaches_prometheus_and_cloudwatch(tmp_path, capsys):
    """The logger's cost values through the real exporters: a scrape of the endpoint, and an EMF line on stdout."""
    import json
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families
    from rich.console import Console

    from tests.conftest import free_port
    from trainer.contract import metrics as r
    from trainer.cost.ledger import Ledger, Rate
    from trainer.engines.step import StepResult
    from trainer.metrics import MetricsLogger
    from trainer.monitoring import exporters
    from trainer.monitoring.config import MonitoringConfig

    rate = Rate("local", nodes=1, usd_per_node_hour=36.0, source="budget.price_per_hour")
    ledger = Ledger()
    ledger.start_attempt(0.0, rate, retry=False)
    ledger.charge("startup", 30.0, rate)
    ledger.charge("productive", 90.0, rate)  # $0.90 in all, 60 of 90 s productive
    ledger.step_done(1, 8192)
    port = free_port()
    config = MonitoringConfig(
        prometheus="on",
        prometheus_port=port,
        prometheus_address="127.0.0.1",
        cloudwatch="on",
        cloudwatch_interval_seconds=3600,
        final_scrape_timeout_seconds=0.1,
    )
    exporters.start(config, "costly", device_type="cpu")
    logger = MetricsLogger(
        tmp_path, train_iters=2, start_step=0, flops_per_step=1e9, tokens_per_step=8192, world_size=1,
        peak_tflops=None, tensorboard=False, console=Console(quiet=True),
    )  # fmt: skip
    try:
        logger.log(1, StepResult(3.0, 1.0, 1e-3, False), step_time_s=0.5, cost=ledger)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        logger.close()
        exporters.stop(completed=True)  # flushes the CloudWatch buffer
    scraped = {f.name: f.samples[0].value for f in text_string_to_metric_families(text) if f.samples}
    assert scraped[r.COST.full_name] == pytest.approx(0.9)
    assert scraped[r.GOODPUT.full_name] == pytest.approx(60 / 90)
    assert scraped[r.PAID_NODE_TIME.full_name] == pytest.approx(90)
    assert scraped[r.COST_PER_MILLION_TOKENS.full_name] == pytest.approx(0.9 / 8192 * 1e6)
    emf = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    run_line = next(line for line in emf if "CostDollars" in line)
    # EMF's metric members are a number or a list of numbers (the values buffered since the last line).
    assert run_line["CostDollars"] == [pytest.approx(0.9)] and run_line["Goodput"] == [pytest.approx(60 / 90)]
