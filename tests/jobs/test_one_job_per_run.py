"""One job per run on a Batch stack (issue 40), against moto: `make train STACK= RUN=` is refused while a job of
that run is queued or running, and REPLACE=1 terminates it, waits until it has ended, then submits."""

from __future__ import annotations

import threading
import time

import pytest
from moto.batch.models import batch_backends

from trainer.jobs import submit

from .conftest import REGION, Stack
from .test_submit import submit_in_process, train


def _job(job_id: str):
    return batch_backends["123456789012"][REGION]._jobs[job_id]


def hold_running(job_id: str):
    """The job made RUNNING: moto's Batch ends a job at once, so it is held there once it has."""
    job = _job(job_id)
    deadline = time.monotonic() + 30
    while job.status != "SUCCEEDED":
        assert time.monotonic() < deadline, job.status
        time.sleep(0.05)
    job.status, job.job_stopped = "RUNNING", False
    return job


def _running(stack: Stack) -> str:
    """The one submitted job, made RUNNING."""
    (job_id,) = [j["jobId"] for j in stack.jobs()]
    hold_running(job_id)
    return job_id


def _ends_when_terminated(job_id: str) -> threading.Thread:
    """What Batch does with a terminated job (moto 5.2.5 only marks it): it fails, its containers stopped."""

    def watch() -> None:
        job = _job(job_id)
        deadline = time.monotonic() + 30
        while not job.stop and time.monotonic() < deadline:
            time.sleep(0.02)
        job.status, job.job_stopped = "FAILED", True

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_make_train_refuses_while_a_job_of_the_run_is_running_and_accepts_once_it_ended(stack, capsys):
    assert submit_in_process(stack, capsys, "--run", "llama-a")[0] == 0
    job_id = _running(stack)
    refused = train(stack, "RUN=llama-a")
    assert refused.returncode == 2, refused.stderr
    assert f"RUN=llama-a: job {job_id} of this run is RUNNING on stack test" in refused.stderr
    assert f"make cancel STACK=test JOB={job_id}" in refused.stderr
    assert "make train STACK=test RUN=llama-a REPLACE=1" in refused.stderr
    assert len(stack.requests("SubmitJob")) == 1 and stack.requests("TerminateJob") == []
    assert (
        submit_in_process(stack, capsys, "--run", "llama-b")[0] == 0
    )  # another run is no business of this one
    _job(job_id).status = "SUCCEEDED"
    assert submit_in_process(stack, capsys, "--run", "llama-a")[0] == 0
    assert len(stack.requests("SubmitJob")) == 3


def test_replace_terminates_the_running_job_waits_for_its_end_then_submits(stack, capsys, monkeypatch):
    monkeypatch.setattr(submit, "REPLACE_POLL_S", 0.05)
    assert submit_in_process(stack, capsys, "--run", "llama-a")[0] == 0
    job_id = _running(stack)
    ended = _ends_when_terminated(job_id)
    status, err = submit_in_process(stack, capsys, "--run", "llama-a", "--replace")
    ended.join()
    assert status == 0, err
    (terminated,) = stack.requests("TerminateJob")
    assert (
        terminated["jobId"] == job_id
        and "replaced by a new submission of run llama-a" in terminated["reason"]
    )
    assert _job(job_id).status == "FAILED" and len(stack.requests("SubmitJob")) == 2


def test_replace_submits_nothing_while_the_old_job_has_not_ended(stack, capsys, monkeypatch):
    from trainer.contract.container import STOP_GRACE_SECONDS

    monkeypatch.setattr(submit, "REPLACE_POLL_S", 0.05)
    monkeypatch.setattr(submit, "REPLACE_SLACK_S", 0.2 - STOP_GRACE_SECONDS)  # wait 0.2 s in all
    assert submit_in_process(stack, capsys, "--run", "llama-a")[0] == 0
    job_id = _running(stack)  # and stays so: a container that ignores SIGTERM until Batch kills it
    status, err = submit_in_process(stack, capsys, "--run", "llama-a", "--replace")
    assert status == 2
    assert f"RUN=llama-a: job {job_id} is still RUNNING 0.2 s after it was told to stop" in err
    assert len(stack.requests("SubmitJob")) == 1


def test_a_dry_run_refuses_as_the_submission_would_and_stops_nothing(stack, capsys):
    assert submit_in_process(stack, capsys, "--run", "llama-a")[0] == 0
    _running(stack)
    assert submit_in_process(stack, capsys, "--run", "llama-a", "--dry-run")[0] == 2
    assert submit_in_process(stack, capsys, "--run", "llama-a", "--dry-run", "--replace")[0] == 0
    assert stack.requests("TerminateJob") == [] and len(stack.requests("SubmitJob")) == 1
