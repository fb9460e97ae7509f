"""A real Prometheus server scrapes a real CPU training run (`python -m trainer train`, the local recipe made
short) and its HTTP API returns the training series: the target was up, loss and steps came from rank 0, step time
and pipeline idle time from every rank with its pipeline stage."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.monitoring.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
TRAIN_ITERS = 40


@pytest.mark.slow
def test_prometheus_scrapes_a_training_run(prometheus_server, tiny_corpus, tmp_path):
    corpus = tiny_corpus
    port = free_port()
    server = prometheus_server([f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"])  # one endpoint per local rank
    overrides = {
        "parallel.tensor_model_parallel_size": 1,
        "parallel.pipeline_model_parallel_size": 2,
        "data.prefixes": f"[{corpus}]",
        "data.tokenizer_path": f"{corpus}.tokenizer.json",
        "data.split": "80,20,0",
        "schedule.train_iters": TRAIN_ITERS,
        "schedule.eval_interval": 1000,
        "schedule.eval_iters": 1,
        "checkpoint.save_interval": TRAIN_ITERS,
        "logging.run_dir": str(tmp_path / "run"),
        "logging.tensorboard": "false",
        "monitoring.prometheus": "on",
        "monitoring.prometheus_port": port,
        "monitoring.prometheus_address": "127.0.0.1",
    }
    command = [sys.executable, "-m", "trainer", "train", "--config", "trainer/configs/local.yaml"]
    command += [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    env = {k: v for k, v in os.environ.items() if k != "AWS_BATCH_JOB_ID"}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    def query(expr: str) -> list[dict]:
        return server.api("query", query=expr)["result"]

    up = {r["metric"]["instance"]: float(r["value"][1]) for r in query("max_over_time(up[10m])")}
    assert up == {f"127.0.0.1:{port}": 1.0, f"127.0.0.1:{port + 1}": 1.0}
    [loss] = query("last_over_time(trainstack_training_loss[10m])")
    assert loss["metric"]["run"] == "local" and loss["metric"]["job_id"] == "local"
    assert 0 < float(loss["value"][1]) < 10
    [steps] = query("max_over_time(trainstack_steps_total[10m])")
    assert 0 < float(steps["value"][1]) <= TRAIN_ITERS
    step_times = query("last_over_time(trainstack_step_duration_seconds[10m])")
    assert sorted((r["metric"]["rank"], r["metric"]["stage"]) for r in step_times) == [("0", "0"), ("1", "1")]
    assert all(float(r["value"][1]) > 0 for r in step_times)
    # Each stage's wait on its neighbour, a part of its step (PP=2: both stages send and receive every step).
    idle = {
        r["metric"]["stage"]: r
        for r in query("last_over_time(trainstack_pipeline_idle_duration_seconds[10m])")
    }
    assert sorted(idle) == ["0", "1"]
    steps_by_stage = {r["metric"]["stage"]: float(r["value"][1]) for r in step_times}
    assert all(0 < float(r["value"][1]) < steps_by_stage[stage] for stage, r in idle.items())
    [memory] = query("last_over_time(trainstack_host_memory_used_bytes[10m])")  # node metrics: local rank 0
    assert memory["metric"]["instance"] == f"127.0.0.1:{port}"
