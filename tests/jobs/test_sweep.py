"""`make sweep STACK=<env> TRIALS=32 PARALLEL=4` against the moto stack (tests/jobs/conftest.py): one Batch array job
of sweep workers on the single-node GPU queue, found again by name instead of submitted twice."""

from __future__ import annotations

import json
import threading
import time

import pytest

from trainer.aws.outputs import load_outputs
from trainer.jobs.sweep import follow

from .conftest import IMAGE_TAG, Stack, add_container_queue
from .test_one_job_per_run import _job

TEAMS = {"teams": ["vision", "speech"], "team_gpu_quotas": {"vision": 32, "speech": 32}}


def with_single_node_queue(stack: Stack) -> None:
    """What infra/cluster.py `_spot` adds, in moto: the Spot queue and its single-node GPU job definition; and
    teams."""
    definition = add_container_queue(
        stack,
        "spot-queue",
        "trainstack-test-spot",
        ["train", "--help"],
        {"VCPU": 188, "MEMORY": 1900000, "GPU": 8},
    )
    stack.outputs.update(spot_job_queue="spot-queue", spot_job_definition=definition, **TEAMS)
    stack.outputs_file.write_text(json.dumps(stack.outputs))


def request_job_id(stack: Stack, name: str) -> str:
    found = stack.client("batch").list_jobs(
        jobQueue="spot-queue", filters=[{"name": "JOB_NAME", "values": [name]}]
    )
    return str(found["jobSummaryList"][0]["jobId"])


@pytest.fixture
def sweep_stack(stack):
    with_single_node_queue(stack)
    return stack


def test_make_sweep_submits_one_array_job_of_workers_and_a_rerun_follows_it(sweep_stack):
    args = ("TRIALS=32", "PARALLEL=4", "MAX_DOLLARS=500", "TEAM=vision", f"IMAGE={IMAGE_TAG}", "NAME=lr")
    result = sweep_stack.make("sweep", *args, "ARGS=--no-follow")
    assert result.returncode == 0, result.stderr
    assert "submitted sweep-lr-32" in result.stdout
    [request] = sweep_stack.requests("SubmitJob")
    assert request["jobName"] == "sweep-lr-32"
    assert request["jobQueue"] == "spot-queue"
    assert request["arrayProperties"] == {"size": 4}
    # The single-node definition, at a revision naming the pushed image (trainer/jobs/submit.py job_definition_for).
    [definition] = sweep_stack.client("batch").describe_job_definitions(
        jobDefinitions=[request["jobDefinition"]]
    )["jobDefinitions"]
    assert definition["jobDefinitionName"] == "trainstack-test-spot"
    assert definition["containerProperties"]["image"].endswith(f":{IMAGE_TAG}")
    study = "/fsx/checkpoints/teams/vision/sweeps/lr"
    assert request["containerOverrides"]["command"] == [
        "sweep-worker",
        "--sweep",
        "trainer/configs/local-sweep.yaml",
        "--name",
        "lr",
        "--dir",
        study,
        "--trials",
        "32",
        "--max-dollars",
        "500",
    ]
    environment = {e["name"]: e["value"] for e in request["containerOverrides"]["environment"]}
    assert environment == {"TRAINSTACK_SWEEP": "lr", "TRAINSTACK_IMAGE_TAG": IMAGE_TAG}
    # The team's tag, share and priority, as every job of a team carries (trainer/jobs/teams.py).
    assert request["tags"] == {
        "trainstack:run": "sweep-lr-32",
        "trainstack:stack": "test",
        "team": "vision",
    }
    assert request["shareIdentifier"] == "vision" and request["schedulingPriorityOverride"] == 0
    assert request["propagateTags"] is True

    # The driver interrupted and run again while the workers run: the job is found by its name and followed, not
    # submitted a second time (moto ends a job at once: it is held RUNNING here, then ended while followed).
    job = _job(request_job_id(sweep_stack, "sweep-lr-32"))
    deadline = time.monotonic() + 30
    while job.status != "SUCCEEDED":
        assert time.monotonic() < deadline, job.status
        time.sleep(0.05)
    job.status, job.job_stopped = "RUNNING", False

    def end_once_followed() -> None:  # the follower's first DescribeJobs has seen it RUNNING
        deadline = time.monotonic() + 60
        while not sweep_stack.recorded("describejobs") and time.monotonic() < deadline:
            time.sleep(0.1)
        job.status = "SUCCEEDED"

    ender = threading.Thread(target=end_once_followed)
    ender.start()
    again = sweep_stack.make("sweep", *args, "ARGS=--poll 0.2")
    ender.join()
    assert again.returncode == 0, again.stderr
    assert len(sweep_stack.requests("SubmitJob")) == 1
    assert f"following sweep-lr-32 ({job.job_id}, RUNNING), submitted before" in again.stdout
    assert again.stdout.rstrip().splitlines()[-1] == "sweep-lr-32: SUCCEEDED: 4 succeeded"  # the children too
    # Once it has ended well, the same command reports it and submits nothing.
    done = sweep_stack.make("sweep", *args, "ARGS=--no-follow")
    assert f"sweep-lr-32 ({job.job_id}) already ended: SUCCEEDED" in done.stdout
    assert len(sweep_stack.requests("SubmitJob")) == 1
    # Another TRIALS is another array job on the same study (it resumes there).
    more = sweep_stack.make("sweep", *args[1:], "TRIALS=40", "ARGS=--no-follow")
    assert more.returncode == 0, more.stderr
    assert [r["jobName"] for r in sweep_stack.requests("SubmitJob")] == ["sweep-lr-32", "sweep-lr-40"]


def test_following_prints_the_array_jobs_status_until_it_ends(sweep_stack, capsys):
    result = sweep_stack.make(
        "sweep", "TRIALS=8", "PARALLEL=2", f"IMAGE={IMAGE_TAG}", "TEAM=speech", "ARGS=--no-follow"
    )
    assert result.returncode == 0, result.stderr
    [request] = sweep_stack.requests("SubmitJob")
    outputs = load_outputs("test", sweep_stack.outputs_file)
    status = follow(outputs, request_job_id(sweep_stack, request["jobName"]), poll_s=0.2)
    assert status in ("SUCCEEDED", "FAILED")
    printed = capsys.readouterr().out
    assert printed.rstrip().splitlines()[-1].startswith(f"{request['jobName']}: {status}")


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (("PARALLEL=9", "TRIALS=8"), "PARALLEL=9: give 1 to 8 (at most TRIALS=8)"),
        (("NAME=lr.v2",), "NAME='lr.v2': on a stack use letters, digits, '-' and '_'"),
        (("SWEEP=tests/support/tiny.yaml",), "the image carries trainer/ only"),
        (("TEAM=audio",), "TEAM=audio: not a team of stack 'test'"),
        (
            ("PARALLEL=2", "TEAM=vision", "TRIALS=2", "ARGS=--set schedule.train_iters=0"),
            "schedule.train_iters",
        ),
    ],
)
def test_bad_sweeps_are_refused_before_anything_is_submitted(sweep_stack, variables, message):
    result = sweep_stack.make("sweep", f"IMAGE={IMAGE_TAG}", "TEAM=vision", *variables)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert sweep_stack.requests("SubmitJob") == []


def test_a_stack_without_a_single_node_queue_is_refused(stack):
    stack.outputs_file.write_text(json.dumps(stack.outputs))
    result = stack.make("sweep", f"IMAGE={IMAGE_TAG}", "PARALLEL=2")
    assert result.returncode == 2
    assert "has no single-node GPU queue (spot_job_queue, spot_job_definition)" in result.stderr
    assert stack.requests("SubmitJob") == []
