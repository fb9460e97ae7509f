"""`python -m trainer smoke --stack <env>` (`make smoke STACK=<env>`): prove a new stack with a two-node job.

The job runs `trainer preflight` on two nodes (submitted the way `make train` submits: trainer/jobs/submit.py): on
each node the GPUs and their NVML health, the EFA devices, the NCCL bootstrap interface, /fsx on Lustre; across
them an all-reduce over EFA (provider efa on every NIC) against the catalog's bus bandwidth floor, with a pairwise
test below it; and a token each node writes under /fsx/checkpoints/<run>/preflight that the other node reads.
Then, here: the preflight's line per node and check from the main node's log, and the tokens exported to
s3://<checkpoints bucket>/<run>/preflight/ by the FSx data repository association (auto-export is asynchronous,
so it waits up to --export-timeout-s). One line per node and check, then one verdict.

On an EKS stack the job is a JobSet (trainer/jobs/jobset.py) and the report comes from node rank 0's pod log; the
lines printed are the same.

On a stack shared by teams (docs/security.md#teams) TEAM= is required, as for `make train`: the job goes to the
team's fair-share share (Batch refuses a job without one on such a queue: Batch API Reference, SubmitJob
`shareIdentifier`) or the team's namespace on EKS, within its GPU quota, and its tokens live under the team's prefix
(/fsx/checkpoints/teams/<team>/<run>/preflight), which the team's role may read back from the bucket.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime

from botocore.exceptions import ClientError

from trainer.aws.clients import batch_job_url, client
from trainer.aws.outputs import StackError, StackOutputs, load_outputs
from trainer.contract.container import CHECKPOINTS_DIR
from trainer.contract.teams import run_path
from trainer.jobs.job import TERMINAL, JobError, describe, main_node_log_stream
from trainer.jobs.jobset import RenderError
from trainer.jobs.submit import (
    RUN_NAME,
    Submission,
    SubmitError,
    git_commit,
    image_problems,
    orchestrator_problems,
    submit,
)
from trainer.jobs.teams import job_namespace, team_name_problems, team_problems

NODES = 2


def plan(outputs: StackOutputs, tag: str, run: str | None, team: str | None = None) -> Submission:
    problems = team_problems(outputs, team, NODES)
    if outputs.node_count < NODES:
        problems.append(
            f"stack {outputs.stack!r} allows {outputs.node_count} node(s); the smoke test needs {NODES} "
            "(raise trainstack:nodeCount)"
        )
    run = run or f"smoke-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    if not RUN_NAME.match(run):
        problems.append(
            f"RUN={run!r}: use letters, digits, '-' and '_' (at most 100, starting with a letter or digit)"
        )
    if problems:
        raise SubmitError(problems)
    shared = f"{CHECKPOINTS_DIR}/{run_path(run, team)}/preflight"
    return Submission(
        run=run,
        nodes=NODES,
        gpus_per_node=outputs.gpus_per_node,
        image=f"{outputs['ecr_repository_url']}:{tag}",
        # The entrypoint runs `trainer launch <command>`: the preflight is the verb, not launch's own first step.
        command=["--skip-preflight", "preflight", "--shared-dir", shared],
        environment={"TRAINSTACK_RUN": run, "TRAINSTACK_IMAGE_TAG": tag},
        team=team,
    )


def describe_any(outputs: StackOutputs, job_id: str, team: str | None = None) -> dict:
    """The job as Batch describes it; on EKS its JobSet (in `team`'s namespace), under the same `jobId` and
    `status` keys."""
    if outputs.orchestrator != "eks":
        return describe(outputs, job_id)
    from trainer.jobs.eks import connect, jobset_status

    jobset = connect(outputs, team=team).jobset(job_id)
    return {"jobId": job_id, "status": jobset_status(jobset), "jobset": jobset}


def wait(
    outputs: StackOutputs, job_id: str, timeout_s: float, poll_s: float, team: str | None = None
) -> dict:
    deadline = time.monotonic() + timeout_s
    job = describe_any(outputs, job_id, team)
    while job["status"] not in TERMINAL:
        if time.monotonic() > deadline:
            raise JobError(f"job {job_id} is still {job['status']} after {timeout_s:.0f} s")
        time.sleep(poll_s)
        job = describe_any(outputs, job_id, team)
    return job


def preflight_lines(outputs: StackOutputs, job: dict, team: str | None = None) -> list[str]:
    """The preflight's report in the main node's log stream (rank 0 prints every node's lines)."""
    if "jobset" in job:
        from trainer.jobs.eks import connect

        cluster = connect(outputs, team=team)
        pod = cluster.leader_pod(job["jobset"])
        return [line for line in cluster.log_lines(pod) if line.startswith("preflight")] if pod else []
    stream = main_node_log_stream(outputs, job)
    if stream is None:
        return []
    logs, token, lines = client("logs", outputs.region), None, []
    while True:
        kwargs: dict[str, str] = {"nextToken": token} if token else {}
        page = logs.get_log_events(
            logGroupName=outputs["log_group"], logStreamName=stream, startFromHead=True, **kwargs
        )
        lines += [e["message"] for e in page["events"] if e["message"].startswith("preflight")]
        if page["nextForwardToken"] == token or not page["events"]:
            return lines
        token = page["nextForwardToken"]


def exported_tokens(outputs: StackOutputs, run: str, timeout_s: float, poll_s: float) -> list[str]:
    """The nodes whose token is missing in S3 (the FSx auto-export of /fsx/checkpoints), after waiting; `run` is
    the run's path below the bucket's root (a team's under teams/<team>/)."""
    s3, bucket = client("s3", outputs.region), outputs["checkpoints_bucket"]
    deadline = time.monotonic() + timeout_s
    while True:
        missing = []
        for node in range(NODES):
            key = f"{run}/preflight/node-{node}.token"
            try:
                s3.head_object(Bucket=bucket, Key=key)
            except ClientError as error:
                if error.response["Error"]["Code"] not in ("404", "NoSuchKey", "NotFound"):
                    raise
                missing.append(f"s3://{bucket}/{key}")
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(poll_s)


def report(
    outputs: StackOutputs,
    job: dict,
    run: str,
    export_timeout_s: float,
    poll_s: float,
    team: str | None = None,
) -> bool:
    lines = preflight_lines(outputs, job, team)
    for line in lines:
        print(line)
    passed = job["status"] == "SUCCEEDED" and "preflight: passed" in lines
    if not lines:
        print(
            f"smoke  FAILED  job {job['jobId']} {job['status']}: no preflight report in the main node's log"
        )
    path = run_path(run, team)
    missing = exported_tokens(outputs, path, export_timeout_s, poll_s)
    bucket = outputs["checkpoints_bucket"]
    if missing:
        print(
            f"smoke  FAILED  s3 export: {', '.join(missing)} not there after {export_timeout_s:.0f} s: check the "
            f"FSx data repository association of /checkpoints (auto-export) with s3://{bucket}"
        )
    else:
        print(f"smoke      ok  s3 export: every node's token is in s3://{bucket}/{path}/preflight/")
    ok = passed and not missing
    print(f"smoke: {'passed' if ok else 'FAILED'} (job {job['jobId']} {job['status']})")
    return ok


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True, help="the stack to prove (dev, staging, prod)")
    parser.add_argument("--outputs", help="a JSON file of stack outputs instead of `pulumi stack output`")
    parser.add_argument("--image", help="image tag in the stack's ECR repository (default: this git commit)")
    parser.add_argument(
        "--run", help="run name: tokens under /fsx/checkpoints/<run>/preflight (default: smoke-<time>)"
    )
    parser.add_argument(
        "--team", help="on a stack shared by teams: the team whose share, quota and prefix the job uses"
    )
    parser.add_argument("--job", help="report on this smoke job instead of submitting one (give --run too)")
    parser.add_argument("--no-wait", action="store_true", help="submit and print the job id only")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="how long to wait for the job")
    parser.add_argument("--export-timeout-s", type=float, default=600.0, help="how long to wait for S3")
    parser.add_argument("--poll-s", type=float, default=15.0, help="seconds between polls")


def main(args: argparse.Namespace) -> int:
    try:
        outputs = load_outputs(args.stack, args.outputs)
        if args.job:
            problems = team_name_problems(outputs, args.team)
            if not args.run:
                problems.append("--job needs --run (the smoke job's run name, printed when it was submitted)")
            if problems:
                raise SubmitError(problems)
            job_id, run = args.job, args.run
        else:
            tag = args.image or git_commit()
            if not tag:
                raise SubmitError(["IMAGE is not given and this is not a git checkout; give IMAGE=<tag>"])
            submission = plan(outputs, tag, args.run, args.team)
            if problems := orchestrator_problems(outputs) + image_problems(outputs, tag):
                raise SubmitError(problems)
            job_id, run = submit(submission, outputs), submission.run
            print(
                f"smoke job {job_id} (run {run}): {NODES} x {outputs['instance_type']} ({submission.image})"
            )
            if outputs.orchestrator == "eks":
                namespace = job_namespace(outputs, args.team)
                print(f"  cluster:  {outputs['eks_cluster_name']} namespace {namespace}")
            else:
                print(f"  console:  {batch_job_url(outputs.region, job_id)}")
            if args.no_wait:
                team = f" TEAM={args.team}" if args.team else ""
                print(f"report later: make smoke STACK={outputs.stack}{team} JOB={job_id} RUN={run}")
                return 0
        job = wait(outputs, job_id, args.timeout_s, args.poll_s, args.team)
        return 0 if report(outputs, job, run, args.export_timeout_s, args.poll_s, args.team) else 1
    except (StackError, SubmitError, JobError, RenderError) as error:
        print(f"smoke: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # the EKS API server refused or could not be reached (trainer/jobs/eks.py)
        print(f"smoke: {error}", file=sys.stderr)
        return 1
