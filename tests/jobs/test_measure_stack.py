"""`python -m trainer measure-stack`: the planner's best layouts for a stack, each a job of its queue, measured from
the metrics FSx exports to the checkpoints bucket. Against the moto stack (tests/jobs/conftest.py: Batch, ECR, S3)
and, on EKS, the API server's stand-in (tests/jobs/test_eks.py); the jobs' metrics.jsonl are written to the bucket
here as the export would, each once its job is submitted, with step times that make the planner's second layout
the fastest."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest
import yaml

from trainer.__main__ import main as trainer_main
from trainer.config import load_config
from trainer.contract.catalog import instance_type
from trainer.plan.command import plan_for
from trainer.plan.measure import WARMUP_STEPS
from trainer.plan.performance import Assumptions

from .conftest import DATASET, IMAGE_TAG, TOKENIZER, Stack
from .test_eks import ApiServer, api_server, eks_stack  # noqa: F401  (fixtures)
from .test_one_job_per_run import _job

CONFIG = "trainer/configs/llama3-8b.yaml"
DATA = (f"data.prefixes=[{DATASET}]", f"data.tokenizer_path={TOKENIZER}")
# Median step seconds each layout's job logs after its warm-up, by the planner's rank.
STEP_SECONDS = {1: 2.4, 2: 1.9, 3: 2.1}


def metrics_lines(seconds: float, steps: int = 8) -> str:
    """metrics.jsonl as the trainer logs it: step 0's evaluation, then a line a step with its time (the warm-up's
    slow)."""
    lines = [{"step": 0, "loss": None, "val_loss": 11.2, "step_time_s": None}]
    lines += [
        {"step": s, "loss": 11.0 - s / 10, "step_time_s": 30.0 if s <= WARMUP_STEPS else seconds}
        for s in range(1, steps + 1)
    ]
    return "".join(json.dumps(line) + "\n" for line in lines)


def export_when_submitted(
    stack: Stack, runs: dict[int, str], submitted: Callable[[str], bool]
) -> threading.Thread:
    """Write each run's metrics to the checkpoints bucket once its job is submitted, as FSx's export would."""

    def export() -> None:
        deadline = time.monotonic() + 60
        pending = dict(runs)
        while pending and time.monotonic() < deadline:
            for rank, run in list(pending.items()):
                if submitted(run):
                    time.sleep(1.0)  # the export lags the file: a copy from a second after the submission
                    stack.client("s3").put_object(
                        Bucket="trainstack-test-checkpoints",
                        Key=f"{run}/metrics.jsonl",
                        Body=metrics_lines(STEP_SECONDS[rank]).encode(),
                    )
                    del pending[rank]
            time.sleep(0.1)

    thread = threading.Thread(target=export)
    thread.start()
    return thread


def measure_stack(stack: Stack, capsys, out, *argv: str) -> tuple[int, str, str]:
    sets = [arg for value in DATA for arg in ("--set", value)]
    command = ["measure-stack", "--stack", "test", "--outputs", str(stack.outputs_file), "--config", CONFIG]
    status = trainer_main(
        [*command, *sets, "--image", IMAGE_TAG, "--measure", "3", "--out", str(out), "--poll", "0.1", *argv]
    )
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def value_of(values: dict, key: str):
    for part in key.split("."):
        values = values[part]
    return values


def planned(nodes: int = 4):
    """The planner's ranking for the moto stack's 4 x p5.48xlarge, as measure-stack computes it."""
    return plan_for(CONFIG, list(DATA), instance_type("p5.48xlarge"), nodes, Assumptions())


@pytest.mark.slow
def test_each_of_the_best_layouts_runs_as_a_job_and_the_measured_fastest_is_written(stack, capsys, tmp_path):
    ranked = planned()
    best = [c for c in ranked.candidates if c.fits][:3]
    runs = {rank: f"measure-llama3-8b-{rank}" for rank in (1, 2, 3)}

    def submitted(run: str) -> bool:
        return any(r["jobName"] == run for r in stack.requests("SubmitJob"))

    exporter = export_when_submitted(stack, runs, submitted)
    out = tmp_path / "measured.yaml"
    status, printed, err = measure_stack(stack, capsys, out, "--export-timeout", "30")
    exporter.join()
    assert status == 0, err
    requests = stack.requests("SubmitJob")
    assert [r["jobName"] for r in requests] == list(runs.values())
    for rank, (request, candidate) in enumerate(zip(requests, best, strict=True), 1):
        [node] = request["nodeOverrides"]["nodePropertyOverrides"]
        command = node["containerOverrides"]["command"]
        assert request["nodeOverrides"]["numNodes"] == 4 and request["jobQueue"] == "gpu-queue"
        assert command[:2] == ["train", "--fresh"]  # a measurement starts over
        sets = [command[i + 1] for i, arg in enumerate(command) if arg == "--set"]
        assert f"logging.run_dir=/fsx/checkpoints/{runs[rank]}" in sets
        assert set(candidate.overrides(ranked.free_keys)) <= set(sets)  # the layout
        assert {"schedule.train_iters=20", "logging.log_interval=1", "checkpoint.async_save=false"} <= set(
            sets
        )
    # The second layout was measured fastest: its config is written, and the record holds every error.
    assert "fastest measured: " + best[1].describe() in printed
    written = load_config(out, list(DATA), device="cuda")
    assert best[1].layout == {key: value_of(written.model_dump(), key) for key in best[1].layout}
    record = json.loads((tmp_path / "measured.yaml.measured.json").read_text())
    assert record["machine"] == "4 x p5.48xlarge (stack test)" and record["chosen"] == 2
    assert [layout["measured_s"] for layout in record["layouts"]] == [2.4, 1.9, 2.1]
    assert record["layouts"][1]["error"] == pytest.approx((best[1].step.total_s - 1.9) / 1.9)
    assert f"make train STACK=test CONFIG={CONFIG} ARGS=" in printed
    assert yaml.safe_load(out.read_text())["name"]  # a whole config, not only the layout


@pytest.mark.slow
def test_a_failed_job_is_recorded_and_a_stale_export_is_not_read(stack, capsys, tmp_path):
    """Layout 1's job fails; layout 2's bucket holds only an earlier run's metrics (written before its job was
    submitted), which are not taken for this one's; layout 3 is measured."""
    runs = {3: "measure-llama3-8b-3"}
    s3 = stack.client("s3")
    stale = metrics_lines(0.1)
    s3.put_object(Bucket="trainstack-test-checkpoints", Key="measure-llama3-8b-2/metrics.jsonl", Body=stale)
    time.sleep(1.1)  # S3 LastModified has whole seconds

    def submitted(run: str) -> bool:
        return any(r["jobName"] == run for r in stack.requests("SubmitJob"))

    def fail_the_first() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = stack.client("batch").list_jobs(
                jobQueue="gpu-queue", filters=[{"name": "JOB_NAME", "values": ["measure-llama3-8b-1"]}]
            )["jobSummaryList"]
            if found:
                job = _job(found[0]["jobId"])
                while job.status != "SUCCEEDED" and time.monotonic() < deadline:
                    time.sleep(0.05)
                job.status, job.status_reason = "FAILED", "Essential container in task exited"
                return
            time.sleep(0.05)

    failer = threading.Thread(target=fail_the_first)
    failer.start()
    exporter = export_when_submitted(stack, runs, submitted)
    out = tmp_path / "measured.yaml"
    status, _, err = measure_stack(stack, capsys, out, "--export-timeout", "3")
    failer.join()
    exporter.join()
    assert status == 0, err
    record = json.loads((tmp_path / "measured.yaml.measured.json").read_text())
    first, second, third = record["layouts"]
    assert first["measured_s"] is None and "FAILED" in first["problem"]
    assert second["measured_s"] is None and "no step after the 2 warm-up steps" in second["problem"]
    assert third["measured_s"] == 2.1 and record["chosen"] == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--measure-steps", "2"), "--measure-steps 2: the first 2 are warm-up; give at least 3"),
        (("--nodes", "9"), "NODES=9: stack 'test' allows 1 to 4 nodes"),
        (("--team", "vision"), "TEAM=vision: stack 'test' has no teams"),
        (("--image", "fedcba987654"), "IMAGE=fedcba987654: no such tag"),
    ],
)
def test_bad_measurements_are_refused_before_any_job(stack, capsys, tmp_path, argv, message):
    status, _, err = measure_stack(stack, capsys, tmp_path / "m.yaml", *argv)
    assert status == 2 and message in err, err
    assert stack.requests("SubmitJob") == [] and not (tmp_path / "m.yaml").exists()


@pytest.mark.slow
def test_on_eks_each_layout_is_a_jobset_the_pinned_schema_accepts(eks_stack, api_server, capsys, tmp_path):  # noqa: F811
    runs = {rank: f"measure-llama3-8b-{rank}" for rank in (1, 2, 3)}

    def complete(jobset: dict) -> None:  # the controller: the JobSet's pods ran and it completed
        jobset["status"] = {
            "conditions": [
                {"type": "Completed", "status": "True", "lastTransitionTime": "2026-12-05T12:00:00Z"}
            ]
        }

    api_server.on_create = complete
    exporter = export_when_submitted(
        eks_stack, runs, lambda run: any(j["metadata"]["name"] == run for j in api_server.received)
    )
    status, _, err = measure_stack(eks_stack, capsys, tmp_path / "m.yaml", "--export-timeout", "30")
    exporter.join()
    assert status == 0, err
    assert [j["metadata"]["name"] for j in api_server.received] == list(runs.values())
    assert all(
        j["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] == 4 for j in api_server.received
    )
    record = json.loads((tmp_path / "m.yaml.measured.json").read_text())
    assert record["chosen"] == 2


@pytest.mark.slow
def test_run_again_while_a_layouts_job_runs_it_is_followed_not_submitted_again(stack, capsys, tmp_path):
    """The driver was stopped while layout 1's job ran: run again, that job is found by its name and waited for."""
    batch = stack.client("batch")
    first = batch.submit_job(
        jobName="measure-llama3-8b-1", jobQueue="gpu-queue", jobDefinition=stack.outputs["job_definition"]
    )["jobId"]
    job = _job(first)
    deadline = time.monotonic() + 30
    while job.status != "SUCCEEDED":  # moto ends a job at once: held RUNNING here, then ended while followed
        assert time.monotonic() < deadline, job.status
        time.sleep(0.05)
    job.status, job.job_stopped = "RUNNING", False

    def end_once_followed() -> None:
        deadline = time.monotonic() + 60
        while len(stack.requests("SubmitJob")) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        job.status = "SUCCEEDED"

    ender = threading.Thread(target=end_once_followed)
    ender.start()
    runs = {rank: f"measure-llama3-8b-{rank}" for rank in (1, 2, 3)}

    def submitted(run: str) -> bool:
        return any(r["jobName"] == run for r in stack.requests("SubmitJob"))

    exporter = export_when_submitted(stack, runs, submitted)
    status, printed, err = measure_stack(stack, capsys, tmp_path / "m.yaml", "--export-timeout", "30")
    ender.join()
    exporter.join()
    assert status == 0, err
    assert f"layout 1: following measure-llama3-8b-1 ({first}, RUNNING), submitted before" in printed
    assert [r["jobName"] for r in stack.requests("SubmitJob")] == list(runs.values())  # the first one's own
    assert json.loads((tmp_path / "m.yaml.measured.json").read_text())["chosen"] == 2
