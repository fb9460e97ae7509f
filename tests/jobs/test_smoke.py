"""`make smoke STACK=<env>` against a moto server: the two-node preflight job it submits (through submit.py's
path), what it refuses before submitting, and its report from the main node's log and the S3 export."""

from __future__ import annotations

import json
import time

from .conftest import IMAGE_TAG, Stack

PASSED_REPORT = [
    "preflight      ok  node 0 ip-10-0-1-17         nccl network     AWS Libfabric, provider efa, fabric efa-direct, 32 nics",
    "preflight      ok  node 1 ip-10-0-1-18         shared storage   read the tokens of all 1 other nodes in /fsx/x",
    "preflight: passed",
]


def smoke(stack: Stack, *variables: str):
    return stack.make("smoke", *variables, "POLL=0.2", "EXPORT_TIMEOUT=0")


def submitted(stack: Stack, run: str = "smoke-a") -> str:
    result = smoke(stack, f"IMAGE={IMAGE_TAG}", f"RUN={run}", "NOWAIT=1")
    assert result.returncode == 0, result.stderr
    assert f"report later: make smoke STACK=test JOB={stack.jobs()[0]['jobId']} RUN={run}" in result.stdout
    return stack.jobs()[0]["jobId"]


def log_report(stack: Stack, job_id: str, lines: list[str]) -> None:
    (job,) = stack.client("batch").describe_jobs(jobs=[job_id])["jobs"]
    stream = job["container"]["logStreamName"]
    logs = stack.client("logs")
    logs.create_log_stream(logGroupName="/trainstack/test/train", logStreamName=stream)
    now_ms = int(time.time() * 1000)
    events = [{"timestamp": now_ms + i, "message": m} for i, m in enumerate(["torchrun noise", *lines])]
    logs.put_log_events(logGroupName="/trainstack/test/train", logStreamName=stream, logEvents=events)


def export_tokens(stack: Stack, run: str, nodes=(0, 1)) -> None:
    for node in nodes:
        stack.client("s3").put_object(
            Bucket="trainstack-test-checkpoints", Key=f"{run}/preflight/node-{node}.token", Body=b"t"
        )


def test_smoke_submits_a_two_node_preflight_job_like_train_does(stack):
    submitted(stack)
    (request,) = stack.requests("SubmitJob")
    assert request["jobName"] == "smoke-a" and request["jobQueue"] == "gpu-queue"
    assert request["nodeOverrides"]["numNodes"] == 2
    (node_range,) = request["nodeOverrides"]["nodePropertyOverrides"]
    assert node_range["containerOverrides"]["command"] == [
        "--skip-preflight",
        "preflight",
        "--shared-dir",
        "/fsx/checkpoints/smoke-a/preflight",
    ]
    assert request["tags"] == {"trainstack:run": "smoke-a", "trainstack:stack": "test", "team": "_stack"}
    (registered,) = stack.requests("RegisterJobDefinition")  # the image, as `make train` sets it
    image = f"{stack.outputs['ecr_repository_url']}:{IMAGE_TAG}"
    assert [r["container"]["image"] for r in registered["nodeProperties"]["nodeRangeProperties"]] == [image]


def test_report_prints_each_node_and_check_and_checks_the_s3_export(stack):
    job_id = submitted(stack)
    log_report(stack, job_id, PASSED_REPORT)
    export_tokens(stack, "smoke-a")
    result = smoke(stack, f"JOB={job_id}", "RUN=smoke-a")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("preflight")] == PASSED_REPORT
    assert "torchrun noise" not in result.stdout, "only the preflight's lines are printed"
    assert (
        "smoke      ok  s3 export: every node's token is in s3://trainstack-test-checkpoints/smoke-a/preflight/"
        in lines
    )
    assert lines[-1] == f"smoke: passed (job {job_id} SUCCEEDED)"


def test_a_missing_export_fails_and_names_the_object(stack):
    job_id = submitted(stack)
    log_report(stack, job_id, PASSED_REPORT)
    export_tokens(stack, "smoke-a", nodes=(0,))
    result = smoke(stack, f"JOB={job_id}", "RUN=smoke-a")
    assert result.returncode != 0  # make exits 2 whatever the failed command returned
    assert (
        "s3://trainstack-test-checkpoints/smoke-a/preflight/node-1.token not there after 0 s" in result.stdout
    )
    assert result.stdout.splitlines()[-1] == f"smoke: FAILED (job {job_id} SUCCEEDED)"


def test_a_failed_preflight_fails_the_smoke(stack):
    job_id = submitted(stack)
    log_report(
        stack,
        job_id,
        [
            "preflight  failed  node 1 ip-10-0-1-18 gpu health GPU 3: row remapping failed",
            "preflight: FAILED: node fault, exit 75 (retry)",
        ],
    )
    export_tokens(stack, "smoke-a")
    result = smoke(stack, f"JOB={job_id}", "RUN=smoke-a")
    assert result.returncode != 0 and "row remapping failed" in result.stdout
    assert result.stdout.splitlines()[-1] == f"smoke: FAILED (job {job_id} SUCCEEDED)"


def test_refused_before_submitting(stack, tmp_path):
    missing_image = smoke(stack, "IMAGE=feedbeef0000", "NOWAIT=1")
    assert missing_image.returncode == 2
    assert "IMAGE=feedbeef0000: no such tag" in missing_image.stderr
    one_node = tmp_path / "one-node.json"
    one_node.write_text(json.dumps({**stack.outputs, "node_count": 1}))
    small = stack.make("smoke", f"IMAGE={IMAGE_TAG}", f"OUTPUTS={one_node}", "NOWAIT=1")
    assert small.returncode == 2 and "allows 1 node(s); the smoke test needs 2" in small.stderr
    assert not stack.requests("SubmitJob")


# A stack shared by teams (infra/teams.py): its GPU queue has a fair-share policy, where Batch refuses a job without a
# share identifier (Batch API Reference, SubmitJob `shareIdentifier`: "If the job queue has a fair-share scheduling
# policy, then this parameter must be specified"), so the smoke job, like `make train`'s, is a team's.
TEAMS = {"teams": ["vision", "speech"], "team_gpu_quotas": {"vision": 16, "speech": 8}}


def shared_by_teams(stack: Stack) -> None:
    stack.outputs_file.write_text(json.dumps({**stack.outputs, **TEAMS}))


def test_on_a_stack_shared_by_teams_the_smoke_job_is_a_teams_under_its_share_and_prefix(stack):
    shared_by_teams(stack)
    result = smoke(stack, f"IMAGE={IMAGE_TAG}", "RUN=smoke-v", "TEAM=vision", "NOWAIT=1")
    assert result.returncode == 0, result.stderr
    (request,) = stack.requests("SubmitJob")
    assert request["shareIdentifier"] == "vision" and request["schedulingPriorityOverride"] == 0
    assert request["tags"] == {"trainstack:run": "smoke-v", "trainstack:stack": "test", "team": "vision"}
    (node_range,) = request["nodeOverrides"]["nodePropertyOverrides"]
    assert (
        node_range["containerOverrides"]["command"][-1] == "/fsx/checkpoints/teams/vision/smoke-v/preflight"
    )
    job_id = stack.jobs()[0]["jobId"]
    assert f"report later: make smoke STACK=test TEAM=vision JOB={job_id} RUN=smoke-v" in result.stdout
    log_report(stack, job_id, PASSED_REPORT)
    export_tokens(stack, "teams/vision/smoke-v")
    result = smoke(stack, f"JOB={job_id}", "RUN=smoke-v", "TEAM=vision")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "every node's token is in s3://trainstack-test-checkpoints/teams/vision/smoke-v/preflight/"
        in result.stdout
    )
    assert result.stdout.splitlines()[-1] == f"smoke: passed (job {job_id} SUCCEEDED)"


def test_on_a_stack_shared_by_teams_a_missing_unknown_or_over_quota_team_is_refused(stack):
    shared_by_teams(stack)
    for variables, message in (
        ((), "stack 'test' is shared by teams vision, speech: say which with TEAM=<name>"),
        (("TEAM=nlp",), "TEAM=nlp: not a team of stack 'test'; its teams are vision, speech"),
        (("TEAM=speech",), "NODES=2: 16 GPUs is over team 'speech''s quota of 8"),
    ):
        result = smoke(stack, f"IMAGE={IMAGE_TAG}", "NOWAIT=1", *variables)
        assert result.returncode == 2 and message in result.stderr, result.stderr
    report = smoke(stack, "JOB=some-id", "RUN=smoke-v")
    assert report.returncode == 2 and "say which with TEAM=<name>" in report.stderr
    assert not stack.requests("SubmitJob")
    stack.outputs_file.write_text(json.dumps(stack.outputs))
    result = smoke(stack, f"IMAGE={IMAGE_TAG}", "NOWAIT=1", "TEAM=vision")
    assert result.returncode == 2 and "TEAM=vision: stack 'test' has no teams" in result.stderr
