"""`make status|logs|cancel STACK=<env>` against a moto server."""

from __future__ import annotations

import json
import time

from moto.batch.models import batch_backends

from .conftest import DATASET, IMAGE_TAG, REGION, TOKENIZER, Stack


def submitted_job(stack: Stack) -> str:
    args = f"ARGS=--set data.prefixes=[{DATASET}] --set data.tokenizer_path={TOKENIZER}"
    result = stack.make(
        "train", "CONFIG=trainer/configs/llama3-8b.yaml", f"IMAGE={IMAGE_TAG}", "RUN=watch-me", args
    )
    assert result.returncode == 0, result.stderr
    return stack.jobs()[0]["jobId"]


def test_status_lists_recent_jobs_and_details_one(stack):
    job_id = submitted_job(stack)
    listing = stack.make("status")
    assert listing.returncode == 0, listing.stderr
    assert job_id in listing.stdout and "watch-me" in listing.stdout
    detail = stack.make("status", f"JOB={job_id}")
    assert detail.returncode == 0, detail.stderr
    assert f"job {job_id} (watch-me): SUCCEEDED" in detail.stdout
    assert "log:      /trainstack/test/train / " in detail.stdout


def test_status_names_a_straggler_from_the_runs_health_report(stack):
    job_id = submitted_job(stack)
    detail = stack.make("status", f"JOB={job_id}")
    assert (
        "health:   no health report yet (s3://trainstack-test-checkpoints/watch-me/health.json)"
        in detail.stdout
    )
    # What rank 0 writes into /fsx/checkpoints/watch-me and FSx exports (trainer/health/report.py's format).
    ranks = [{"rank": 3, "host": "ip-10-0-1-7", "instance_id": "i-0abc", "compute_s": 2.4, "median_s": 1.0,
              "ratio": 2.4, "windows": 3}]  # fmt: skip
    health = {"stragglers": {"step": 60, "interval": 20, "median_s": 1.0, "ranks": ranks}}
    stack.client("s3").put_object(
        Bucket="trainstack-test-checkpoints", Key="watch-me/health.json", Body=json.dumps(health)
    )
    detail = stack.make("status", f"JOB={job_id}")
    assert detail.returncode == 0, detail.stderr
    assert (
        "health:   stragglers at step 60: rank 3 on ip-10-0-1-7 (i-0abc) 2.4x the median step compute time "
        "for 3 windows"
    ) in detail.stdout


def test_status_shows_what_the_run_has_spent_from_its_ledger(stack):
    from trainer.cost.ledger import Ledger, Rate

    job_id = submitted_job(stack)
    assert "cost:     no ledger yet (s3://trainstack-test-checkpoints/watch-me/ledger.json)" in (
        stack.make("status", f"JOB={job_id}").stdout
    )
    rate = Rate("on-demand", nodes=2, usd_per_node_hour=30.0, source="budget.price_per_hour")
    ledger = Ledger()  # what rank 0 writes into /fsx/checkpoints/watch-me, one hour: 45 min productive
    ledger.start_attempt(0.0, rate, retry=False)
    ledger.charge("startup", 900.0, rate)
    ledger.charge("productive", 3600.0, rate)
    ledger.step_done(100, 4096)
    stack.client("s3").put_object(
        Bucket="trainstack-test-checkpoints", Key="watch-me/ledger.json", Body=json.dumps(ledger.to_dict())
    )
    detail = stack.make("status", f"JOB={job_id}")
    assert detail.returncode == 0, detail.stderr
    assert (
        "cost:     $60.00 for 1.000 h of paid time over 1 attempt(s), 4,096 tokens trained to step 100, "
        "goodput 75.0%"
    ) in detail.stdout


def test_logs_print_the_main_node_stream(stack):
    job_id = submitted_job(stack)
    (job,) = stack.client("batch").describe_jobs(jobs=[job_id])["jobs"]
    stream = job["container"]["logStreamName"]
    logs = stack.client("logs")
    logs.create_log_stream(logGroupName="/trainstack/test/train", logStreamName=stream)
    lines = [f"step {i} loss {10 - i}.0" for i in range(3)]
    now_ms = int(time.time() * 1000)  # CloudWatch refuses events older than 14 days
    events = [{"timestamp": now_ms + i, "message": m} for i, m in enumerate(lines)]
    logs.put_log_events(logGroupName="/trainstack/test/train", logStreamName=stream, logEvents=events)
    result = stack.make("logs", f"JOB={job_id}", "FOLLOW=1")  # the job has ended, so follow returns
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-3:] == lines


def test_cancel_terminates_a_running_job(stack):
    job_id = submitted_job(stack)
    job = batch_backends["123456789012"][REGION]._jobs[job_id]
    job.status, job.job_stopped = "RUNNING", False  # moto ends jobs at once; make this one still be running
    result = stack.make("cancel", f"JOB={job_id}")
    assert result.returncode == 0, result.stderr
    (terminated,) = stack.requests("TerminateJob")
    assert terminated["jobId"] == job_id
    assert "termination requested (was RUNNING)" in result.stdout


def test_cancel_refuses_an_ended_job_or_no_job(stack):
    job_id = submitted_job(stack)
    ended = stack.make("cancel", f"JOB={job_id}")
    assert ended.returncode != 0 and "already ended (SUCCEEDED)" in ended.stderr
    missing = stack.make("cancel")
    assert missing.returncode != 0 and "cancel needs the job" in missing.stderr
    assert stack.requests("TerminateJob") == []
