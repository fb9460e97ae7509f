"""The metric registry's names, the Prometheus endpoint's exposition, and the monitor the training loop calls."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import boto3
import pytest
from moto import mock_aws
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import free_port
from tests.monitoring.fixtures import efa_sysfs, emf_to_cloudwatch, fake_nvml, h100
from trainer.contract import metrics as r
from trainer.engines.step import StepResult
from trainer.monitoring import exporters
from trainer.monitoring.cloudwatch import EmfWriter
from trainer.monitoring.config import MonitoringConfig
from trainer.monitoring.node import Gpus, NodeReaders
from trainer.monitoring.prometheus import PrometheusExporter

LABELS = {"run": "local", "job_id": "local", "node": "laptop", "rank": "0", "stage": "1"}
# Prometheus data model: metric and label names match [a-zA-Z_:][a-zA-Z0-9_:]* / [a-zA-Z_][a-zA-Z0-9_]*.
NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def test_names_follow_prometheus_conventions():
    for metric in r.METRICS:
        assert NAME.match(metric.full_name) and metric.full_name.startswith("trainstack_")
        assert (metric.kind == "counter") == metric.full_name.endswith("_total"), metric.name
        assert not re.search(r"_(milliseconds|ms|kib|mib|gib|percent)(_|$)", metric.name), metric.name
        assert set(metric.labels) >= {"run", "job_id"}
    assert len({m.full_name for m in r.METRICS}) == len(r.METRICS)


def test_a_counter_without_total_is_refused():
    with pytest.raises(ValueError, match="must end in _total"):
        r.Metric("steps", "counter", "steps", r.RUN_LABELS)


def scrape(port: int) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_endpoint_serves_loop_values_and_node_samples_in_exposition_format(tmp_path):
    node = NodeReaders(
        Gpus(fake_nvml(h100())), efa_sysfs(tmp_path, {"rdmap16s27": ("efa", {"tx_bytes": 123})})
    )
    exporter = PrometheusExporter(LABELS, node)
    port = free_port()
    exporter.serve(port, "127.0.0.1")
    try:
        exporter.record(r.TRAINING_LOSS, 3.25)
        exporter.record(r.STEPS, 1)
        exporter.record(r.STEPS, 1)
        exporter.record(r.STEP_TIME, 0.5)
        families = scrape(port)
    finally:
        exporter.close()
    [loss] = families["trainstack_training_loss"].samples
    assert (loss.labels, loss.value) == ({"run": "local", "job_id": "local"}, 3.25)
    # The parser gives a counter's family name without _total; its sample keeps it.
    [steps] = families["trainstack_steps"].samples
    assert (steps.name, steps.value, families["trainstack_steps"].type) == (
        "trainstack_steps_total",
        2,
        "counter",
    )
    [step_time] = families["trainstack_step_duration_seconds"].samples
    assert step_time.labels == LABELS
    [gpu_power] = families["trainstack_gpu_power_watts"].samples
    assert gpu_power.labels == {"run": "local", "job_id": "local", "node": "laptop", "gpu": "0"}
    [efa] = families["trainstack_efa_transmitted_bytes"].samples
    assert (efa.labels["device"], efa.value) == ("rdmap16s27", 123)
    assert not any(name.endswith("_created") for name in families)


def test_monitor_times_a_step_and_its_parts():
    out = io.StringIO()
    cloudwatch = EmfWriter(
        {"JobQueue": "q", "Run": "r", "Rank": "0", "Node": "n"}, interval_s=3600, stream=out
    )
    watch = exporters.Monitor(LABELS, cloudwatch=cloudwatch)
    watch.begin_step()
    watch.add_phase(r.DATA_WAIT_TIME, 0.25)
    watch.add_phase(r.DATA_WAIT_TIME, 0.25)  # two micro-batches
    watch.add_phase(r.FORWARD_BACKWARD_TIME, 1.5)
    watch.end_step(2.0)
    watch.record({r.TRAINING_LOSS: float("nan"), r.GRADIENT_NORM: None, r.TOKENS_PER_SECOND: 10.0})
    watch.close(completed=True)
    documents = [json.loads(line) for line in out.getvalue().splitlines()]
    rank = next(d for d in documents if "StepSeconds" in d)
    assert (rank["StepSeconds"], rank["ForwardBackwardSeconds"], rank["OptimizerSeconds"]) == (
        [2.0],
        [1.5],
        [0.5],
    )
    assert rank["DataWaitSeconds"] == [0.5]
    run = next(d for d in documents if "Steps" in d)
    assert run["Steps"] == 1 and run["TokensPerSecond"] == [10.0] and "TrainingLoss" not in run


def test_without_a_started_monitor_the_loop_calls_do_nothing():
    exporters.stop(completed=False)
    exporters.begin_step()
    with exporters.timed(r.FORWARD_BACKWARD_TIME):
        pass
    exporters.end_step(1.0)
    exporters.record({r.TRAINING_LOSS: 1.0})
    assert exporters.active() is None


def test_cpu_run_has_no_endpoint_and_no_cloudwatch_unless_asked(monkeypatch):
    monkeypatch.delenv("AWS_BATCH_JOB_ID", raising=False)
    started = exporters.start(MonitoringConfig(), "r", stage=0, device_type="cpu")
    try:
        assert started.prometheus is None and started.cloudwatch is None
    finally:
        exporters.stop(completed=True)


@mock_aws
def test_cloudwatch_sum_of_restarts_equals_the_restarts(monkeypatch):
    """Four processes of one Batch job: the first, two torchrun restarts, then Batch's second attempt (torchrun's
    count starts again in the new container): three restarts, and CloudWatch's Sum says 3 (cumulative counts
    written as deltas summed to 0 + 1 + 2 + 1 = 4)."""
    monkeypatch.setenv("AWS_BATCH_JOB_ID", "job-1")
    monkeypatch.setenv("AWS_BATCH_JQ_NAME", "trainstack-prod-gpu")
    lines: list[str] = []
    for attempt, torchrun_restarts in (("1", "0"), ("1", "1"), ("1", "2"), ("2", "0")):
        out = io.StringIO()
        monkeypatch.setattr("sys.stdout", out)
        monkeypatch.setenv("AWS_BATCH_JOB_ATTEMPT", attempt)
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", torchrun_restarts)
        started = exporters.start(MonitoringConfig(), "r", stage=0, device_type="cpu")
        assert started.labels["job_id"] == "job-1" and started.cloudwatch is not None
        exporters.stop(completed=False)
        lines += out.getvalue().splitlines()
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    emf_to_cloudwatch(cloudwatch, lines)
    [datapoint] = cloudwatch.get_metric_statistics(
        Namespace="trainstack",
        MetricName=r.RESTARTS.cloudwatch,
        # The run's own series (moto, unlike CloudWatch, also matches the queue's series on a subset).
        Dimensions=[{"Name": "JobQueue", "Value": "trainstack-prod-gpu"}, {"Name": "Run", "Value": "r"}],
        StartTime=datetime.now(UTC) - timedelta(hours=1),
        EndTime=datetime.now(UTC) + timedelta(hours=1),
        Period=7200,
        Statistics=["Sum"],
    )["Datapoints"]
    assert datapoint["Sum"] == 3


def test_a_jobset_pod_on_eks_writes_emf_under_the_stacks_local_queue(monkeypatch):
    """What the rendered JobSet sets in its pods (trainer/jobs/jobset.py): CloudWatch on, JobQueue = the Kueue
    LocalQueue the EKS stack's alarms watch."""
    from tests.jobs.test_jobset import render

    monkeypatch.delenv("AWS_BATCH_JOB_ID", raising=False)
    monkeypatch.delenv("AWS_BATCH_JQ_NAME", raising=False)
    pod = render()["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    for variable in pod["containers"][0]["env"]:
        if "value" in variable:
            monkeypatch.setenv(variable["name"], variable["value"])
    monkeypatch.setenv("JOBSET_NAME", "llama-8b")  # the fieldRef's value in the pod
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    started = exporters.start(MonitoringConfig(), "r", stage=0, device_type="cpu")
    try:
        assert started.cloudwatch is not None and started.labels["job_id"] == "llama-8b"
        assert started.cloudwatch.dimensions["JobQueue"] == "training"
    finally:
        exporters.stop(completed=True)


def test_a_resumed_run_exports_only_its_own_skipped_steps(tmp_path):
    """SkippedSteps after a resume: the 3 skips restored from the checkpoint were counted by the earlier process."""
    from rich.console import Console

    from trainer.metrics import MetricsLogger

    out = io.StringIO()
    writer = EmfWriter({"JobQueue": "q", "Run": "r", "Rank": "0", "Node": "n"}, interval_s=3600, stream=out)
    exporters._active = exporters.Monitor(LABELS, cloudwatch=writer)
    try:
        logger = MetricsLogger(
            tmp_path, train_iters=10, start_step=5, flops_per_step=1.0, tokens_per_step=1, world_size=1,
            peak_tflops=None, tensorboard=False, console=Console(file=io.StringIO()), skipped_steps=3,
        )  # fmt: skip
        logger.log(6, StepResult(float("nan"), float("nan"), 1e-3, True), step_time_s=1.0, skipped_steps=4)
        logger.close()
    finally:
        exporters.stop(completed=False)
    [run] = [json.loads(line) for line in out.getvalue().splitlines() if "SkippedSteps" in line]
    assert run["SkippedSteps"] == 1


def test_a_nan_loss_reaches_prometheus_but_not_cloudwatch():
    exporter = PrometheusExporter(LABELS, None)
    out = io.StringIO()
    writer = EmfWriter({"JobQueue": "q", "Run": "r", "Rank": "0", "Node": "n"}, interval_s=3600, stream=out)
    watch = exporters.Monitor(LABELS, prometheus=exporter, cloudwatch=writer)
    port = free_port()
    exporter.serve(port, "127.0.0.1")
    try:
        watch.record({r.TRAINING_LOSS: float("nan"), r.SKIPPED_STEPS: float("nan")})
        families = scrape(port)
    finally:
        watch.close(completed=False)
    [loss] = families["trainstack_training_loss"].samples
    assert math.isnan(loss.value)
    assert "trainstack_skipped_steps" not in families or not families["trainstack_skipped_steps"].samples
    assert "TrainingLoss" not in out.getvalue()  # JSON has no NaN


def test_a_clean_end_is_served_until_a_scrape_has_read_it():
    """The completion time must reach Prometheus: close() keeps serving until a scrape that began after it was
    answered, about one scrape interval here (0.3 s), far below the timeout."""
    exporter = PrometheusExporter(LABELS, None)
    watch = exporters.Monitor(LABELS, prometheus=exporter)
    port = free_port()
    exporter.serve(port, "127.0.0.1")
    scrapes: list[dict] = []
    stop = threading.Event()

    def prometheus() -> None:  # scrapes every 0.3 s until the endpoint is gone
        while not stop.is_set():
            try:
                scrapes.append(scrape(port))
            except OSError:
                return
            time.sleep(0.3)

    scraper = threading.Thread(target=prometheus)
    scraper.start()
    try:
        while len(scrapes) < 2:
            time.sleep(0.05)
        started = time.monotonic()
        watch.close(completed=True, final_scrape_timeout_s=30)
        waited = time.monotonic() - started
    finally:
        stop.set()
        scraper.join()
    completed = [s for s in scrapes if s.get("trainstack_process_completed_timestamp_seconds")]
    assert completed and completed[-1]["trainstack_process_completed_timestamp_seconds"].samples[0].value > 0
    assert waited < 5


def test_a_clean_end_nobody_scrapes_closes_at_once():
    exporter = PrometheusExporter(LABELS, None)
    watch = exporters.Monitor(LABELS, prometheus=exporter)
    exporter.serve(free_port(), "127.0.0.1")
    started = time.monotonic()
    watch.close(completed=True, final_scrape_timeout_s=30)
    assert time.monotonic() - started < 1


def test_the_heartbeat_reports_time_since_the_last_step_while_the_loop_is_silent():
    out = io.StringIO()
    now = [1000.0]
    writer = EmfWriter({"JobQueue": "q", "Run": "r", "Rank": "0", "Node": "n"}, interval_s=60, stream=out,
                       clock=lambda: now[0])  # fmt: skip
    watch = exporters.Monitor(LABELS, cloudwatch=writer)
    watch.begin_step()
    watch.end_step(1.0)
    watch.last_step -= 600  # the last step ended ten minutes ago
    now[0] += 60
    watch.heartbeat()
    [line] = [json.loads(line) for line in out.getvalue().splitlines() if "SecondsSinceLastStep" in line]
    assert line["SecondsSinceLastStep"][0] == pytest.approx(600, abs=5)
    assert line["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == r.RUN_DIMENSIONS


def test_a_busy_port_names_the_key_to_change(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = MonitoringConfig(prometheus="on", prometheus_port=port, prometheus_address="127.0.0.1")
        with pytest.raises(OSError, match=r"monitoring.prometheus_port.*--set monitoring.prometheus_port=N"):
            exporters.start(config, "r", stage=0, device_type="cpu")


@contextlib.contextmanager
def _free_then_taken_port() -> Iterator[int]:
    """Two adjacent loopback ports held for the whole test, so that no other process takes either: `port - 1`
    bound with SO_REUSEADDR and not listening (the check's own SO_REUSEADDR bind still succeeds there: Linux
    refuses such a bind only beside a listening socket, socket(7)), `port` bound and listening (taken)."""
    for _ in range(50):
        with socket.socket() as free, socket.socket() as busy:
            free.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1] + 1
            try:
                busy.bind(("127.0.0.1", port))
            except OSError:
                continue  # the next port is someone else's: try another pair
            busy.listen()
            yield port
            return
    raise AssertionError("no two adjacent free loopback ports in 50 tries")


def test_a_taken_port_is_refused_before_any_work(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with _free_then_taken_port() as port:
        config = MonitoringConfig(prometheus="on", prometheus_port=port - 1, prometheus_address="127.0.0.1")
        [problem] = exporters.listen_problems(config, "cpu", world_size=2)  # ranks 0 and 1: port - 1 and port
        assert problem.startswith(
            f"monitoring.prometheus_port = {port - 1}: local rank 1 needs 127.0.0.1:{port}"
        )
        assert "--set monitoring.prometheus_port=N" in problem
        monkeypatch.setenv("LOCAL_RANK", "0")  # a torchrun worker checks only its own port
        assert exporters.listen_problems(config, "cpu", world_size=2) == []
    assert exporters.listen_problems(MonitoringConfig(), "cpu", world_size=2) == []  # off on CPU by default
