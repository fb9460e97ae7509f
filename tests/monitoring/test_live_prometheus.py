"""A real Prometheus server, loaded with the project's alert rules (windows shortened to seconds), scrapes a real
CPU training run (`python -m trainer train`, the local recipe made short):

1. the run ends cleanly: the API returns the training series (loss and steps from rank 0, step time and pipeline
   idle time from every rank with its stage), every process's completion was scraped before its endpoint closed,
   and no alert fires or is pending one scrape interval later, nor after the stall window;
2. the same run is resumed (same run name and job id, more steps) and killed with SIGKILL mid-training: the
   target-down and stall alerts fire; the series Prometheus scraped are then replayed in promtool with two more
   hours of the targets down, and both alerts still fire.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import ROOT, free_ports
from trainer.contract import metrics as r
from trainer.monitoring.rules import alert_rules

TRAIN_ITERS = 40
STALL_S, TARGET_DOWN_S = 15, 5
RULES = alert_rules(stall_minutes=STALL_S / 60, start_minutes=3, target_down_minutes=TARGET_DOWN_S / 60)
PAGES = ("TrainingStalled", "TrainingNeverStarted", "TrainingTargetDown")


def train_command(corpus, port: int, run_dir: Path, train_iters: int) -> list[str]:
    overrides = {
        "parallel.tensor_model_parallel_size": 1,
        "parallel.pipeline_model_parallel_size": 2,
        "data.prefixes": f"[{corpus}]",
        "data.tokenizer_path": f"{corpus}.tokenizer.json",
        "data.split": "80,20,0",
        "schedule.train_iters": train_iters,
        "schedule.eval_interval": 1000,
        "schedule.eval_iters": 1,
        "checkpoint.save_interval": TRAIN_ITERS,
        "logging.run_dir": str(run_dir),
        "logging.tensorboard": "false",
        "monitoring.prometheus": "on",
        "monitoring.prometheus_port": port,
        "monitoring.prometheus_address": "127.0.0.1",
    }
    command = [sys.executable, "-m", "trainer", "train", "--config", "trainer/configs/local.yaml"]
    if train_iters > TRAIN_ITERS:
        command.append("--allow-schedule-change")  # a longer run resumed from the first one's checkpoint
    return command + [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]


def firing(server, state: str = "firing") -> set[tuple[str, str]]:
    return {
        (a["metric"]["alertname"], a["metric"].get("instance", a["metric"].get("run")))
        for a in server.api("query", query=f'ALERTS{{alertstate="{state}"}}')["result"]
    }


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.5)
    raise AssertionError(f"{what} not seen in {timeout_s} s")


@pytest.mark.slow
def test_prometheus_watches_a_clean_end_then_a_killed_resume(
    prometheus_server, tiny_corpus, tmp_path, promtool
):
    port = free_ports(2)
    targets = [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"]  # one endpoint per local rank
    server = prometheus_server(targets, RULES)
    env = {k: v for k, v in os.environ.items() if k != "AWS_BATCH_JOB_ID"}
    run_dir = tmp_path / "run"
    began = time.time()
    result = subprocess.run(
        train_command(tiny_corpus, port, run_dir, TRAIN_ITERS),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ended = time.monotonic()

    def query(expr: str) -> list[dict]:
        return server.api("query", query=expr)["result"]

    up = {r["metric"]["instance"]: float(r["value"][1]) for r in query("max_over_time(up[10m])")}
    assert up == {targets[0]: 1.0, targets[1]: 1.0}
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
    assert memory["metric"]["instance"] == targets[0]
    # The clean end reached Prometheus from both processes before their endpoints closed.
    completed = query(f"last_over_time({r.PROCESS_COMPLETED.full_name}[10m])")
    assert sorted(c["metric"]["instance"] for c in completed) == targets
    assert all(float(c["value"][1]) > began for c in completed)

    time.sleep(1.5)  # one scrape interval (and one rule evaluation) later
    assert not {a for a in firing(server) | firing(server, "pending") if a[0] in PAGES}
    time.sleep(max(0.0, STALL_S + 5 - (time.monotonic() - ended)))  # past the stall window
    assert not {a for a in firing(server) | firing(server, "pending") if a[0] in PAGES}

    # The same run resumed for more steps, then killed: processes gone without a word.
    resumed = subprocess.Popen(
        train_command(tiny_corpus, port, run_dir, 5 * TRAIN_ITERS),
        cwd=ROOT,
        env=env,
        stdout=(tmp_path / "resumed.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: any(float(s["value"][1]) >= 3 for s in query(r.STEPS.full_name)),
            300,
            "three steps of the resumed run",
        )
    except AssertionError as error:
        raise AssertionError(f"{error}: {(tmp_path / 'resumed.log').read_text()[-3000:]}") from None
    finally:
        # SIGKILL to the launcher and every process under it: torchrun starts each worker in its own session
        # (torch/distributed/elastic/multiprocessing/subprocess_handler), so a process-group kill misses them.
        processes = [psutil.Process(resumed.pid), *psutil.Process(resumed.pid).children(recursive=True)]
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(processes, timeout=60)
    wanted = {
        ("TrainingTargetDown", targets[0]),
        ("TrainingTargetDown", targets[1]),
        ("TrainingStalled", "local"),
    }
    try:
        wait_for(lambda: wanted <= firing(server), STALL_S + 60, f"firing {sorted(wanted)}")
    except AssertionError as error:
        states = {name: query(name) for name in ("up", "ALERTS", "trainstack:run_start_timestamp_seconds",
                                                 "trainstack:run_last_step_timestamp_seconds")}  # fmt: skip
        raise AssertionError(f"{error}; Prometheus has {states}") from None

    # Two hours later, in promtool's time: the scraped series from the first start to now, then the targets down.
    replay_two_hours_later(server, promtool, tmp_path, since=began - 5, until=time.time())


def replay_two_hours_later(server, promtool, tmp_path, *, since: float, until: float) -> None:
    """The raw series Prometheus holds (1-second steps), shifted so that `since` is promtool's time 0 (timestamps
    inside values shifted too), then 7200 more seconds of `up` 0; the alerts must still fire at the end."""
    names = (r.PROCESS_START.full_name, r.LAST_STEP_TIME.full_name, r.PROCESS_COMPLETED.full_name, "up")
    steps = int(until - since)
    series = []
    for name in names:
        for item in server.api("query_range", query=name, start=str(since), end=str(since + steps), step="1")[
            "result"
        ]:
            by_second = {round(float(t) - since): float(v) for t, v in item["values"]}
            shift = since if name != "up" else 0
            values = [f"{by_second[i] - shift:g}" if i in by_second else "_" for i in range(steps + 1)]
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(item["metric"].items()) if k != "__name__")
            line = " ".join(values) + (" 0x7200" if name == "up" else "")
            series.append({"series": f"{name}{{{labels}}}", "values": line})
    rules = yaml.safe_load(yaml.safe_dump(RULES))
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop(
                "annotations", None
            )  # the values they quote depend on the run's timing; labels are the test
    (tmp_path / "replay-rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    target = {"job": "trainstack", "run": "local", "job_id": "local", "severity": "page"}
    eval_time = f"{steps + 7200}s"
    test = {
        "rule_files": ["replay-rules.yml"],
        "evaluation_interval": "10s",
        "tests": [
            {
                "interval": "1s",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": eval_time,
                        "alertname": "TrainingTargetDown",
                        "exp_alerts": [
                            {"exp_labels": {**target, "instance": i}}
                            for i in sorted({s["series"].split('instance="')[1].split('"')[0] for s in series
                                             if s["series"].startswith("up")})
                        ],
                    },
                    {
                        "eval_time": eval_time,
                        "alertname": "TrainingStalled",
                        "exp_alerts": [{"exp_labels": {"run": "local", "job_id": "local", "severity": "page"}}],
                    },
                ],
            }
        ],
    }  # fmt: skip
    (tmp_path / "replay.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", "replay.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
