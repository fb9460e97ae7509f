"""`python -m trainer status|logs|cancel --stack <env> [--job ID]`: follow and stop the stack's training jobs.

On a Batch stack a job is a Batch job; on an EKS stack it is a JobSet (its name is the job id) and the same lines
come from the API server (trainer/jobs/eks.py): states in Batch's words, node rank 0's pod log, and cancel as a
deletion (each pod gets SIGTERM, then the termination grace above the trainer's stop grace). On an EKS stack with
teams, TEAM= says whose namespace to look in (a team's role may read only its own).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from botocore.exceptions import ClientError

from trainer.aws.clients import batch_job_url, client, log_stream_url
from trainer.aws.outputs import StackError, StackOutputs, load_outputs
from trainer.contract.teams import TEAM_TAG, job_team, run_path
from trainer.cost.ledger import LEDGER_FILE, Ledger, cost_report
from trainer.health.report import HEALTH_FILE, summary
from trainer.jobs.teams import team_name_problems

STATUSES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")
TERMINAL = ("SUCCEEDED", "FAILED")


class JobError(RuntimeError):
    """No such job, or nothing to show."""


def _when(epoch_ms: int | None) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if epoch_ms else "-"


def recent_jobs(outputs: StackOutputs, limit: int = 10) -> list[dict[str, Any]]:
    batch = client("batch", outputs.region)
    jobs = []
    for status in STATUSES:  # list_jobs without a status returns RUNNING jobs only
        pages = batch.get_paginator("list_jobs").paginate(jobQueue=outputs["job_queue"], jobStatus=status)
        jobs += [job for page in pages for job in page["jobSummaryList"]]
    return sorted(jobs, key=lambda job: job["createdAt"], reverse=True)[:limit]


def describe(outputs: StackOutputs, job_id: str | None) -> dict[str, Any]:
    """The job, or the newest one in the stack's queue."""
    if job_id is None:
        jobs = recent_jobs(outputs, limit=1)
        if not jobs:
            raise JobError(f"no jobs in queue {outputs['job_queue']!r}; submit one with make train STACK=...")
        job_id = jobs[0]["jobId"]
    found = client("batch", outputs.region).describe_jobs(jobs=[job_id])["jobs"]
    if not found:
        raise JobError(f"job {job_id!r} not found in {outputs.region}")
    return found[0]


def main_node_log_stream(outputs: StackOutputs, job: dict[str, Any]) -> str | None:
    """A multi-node job logs per node (job id#node); the main node's stream is the run's log."""
    main = job.get("nodeProperties", {}).get("mainNode", 0)
    node = client("batch", outputs.region).describe_jobs(jobs=[f"{job['jobId']}#{main}"])["jobs"]
    for candidate in (*node, job):
        stream = candidate.get("container", {}).get("logStreamName")
        if stream:
            return stream
    return None


def print_status(outputs: StackOutputs, job_id: str | None) -> None:
    if job_id is None:
        jobs = recent_jobs(outputs)
        if not jobs:
            print(f"no jobs in queue {outputs['job_queue']!r}")
        for job in jobs:
            print(
                f"{job['jobId']}  {job['status']:<9} {job['jobName']:<32} created {_when(job['createdAt'])}"
            )
        return
    job = describe(outputs, job_id)
    print(f"job {job['jobId']} ({job['jobName']}): {job['status']}")
    if job.get("statusReason"):
        print(f"  reason:   {job['statusReason']}")
    print(f"  nodes:    {job.get('nodeProperties', {}).get('numNodes', 1)}")
    print(f"  created:  {_when(job.get('createdAt'))}  started: {_when(job.get('startedAt'))}", end="")
    print(f"  stopped: {_when(job.get('stoppedAt'))}")
    print(f"  attempts: {len(job.get('attempts', []))}")
    if stream := main_node_log_stream(outputs, job):
        print(f"  log:      {outputs['log_group']} / {stream}")
        print(f"            {log_stream_url(outputs.region, outputs['log_group'], stream)}")
    print(f"  console:  {batch_job_url(outputs.region, job['jobId'])}")
    print(f"  health:   {health_line(outputs, job)}")
    print(f"  cost:     {cost_line(outputs, job)}")


def _run_file(outputs: StackOutputs, job: dict[str, Any], name: str) -> tuple[str, Any]:
    """A JSON file rank 0 writes into the job's run directory, as the checkpoints bucket holds it (submit names the
    job after its run, under its team's prefix when its `team` tag names one): its S3 address, and its contents or
    None while it is not there."""
    bucket = outputs["checkpoints_bucket"]
    key = f"{run_path(job['jobName'], job_team(job.get('tags')))}/{name}"
    try:
        body = client("s3", outputs.region).get_object(Bucket=bucket, Key=key)["Body"]
    except ClientError as error:
        if error.response["Error"]["Code"] in ("NoSuchKey", "404"):
            return f"s3://{bucket}/{key}", None
        raise
    return f"s3://{bucket}/{key}", json.loads(body.read())


def health_line(outputs: StackOutputs, job: dict[str, Any]) -> str:
    """What the run's health checks found (stragglers by rank, host and instance; a hang), from the health.json
    rank 0 writes into the run directory /fsx/checkpoints/<run>, which FSx exports to the checkpoints bucket as
    <run>/health.json (a team's: teams/<team>/<run>/health.json; the data repository association maps /checkpoints to the bucket's root: infra/lustre.py)."""
    where, report = _run_file(outputs, job, HEALTH_FILE)
    return summary(report) if report is not None else f"no health report yet ({where})"


def cost_line(outputs: StackOutputs, job: dict[str, Any]) -> str:
    """The run's ledger as rank 0 last wrote it into its run directory (exported like health.json): dollars,
    node-hours, goodput (trainer/cost/ledger.py)."""
    where, values = _run_file(outputs, job, LEDGER_FILE)
    if values is None:
        return f"no ledger yet ({where})"
    ledger = Ledger.from_dict(values)
    return cost_report(ledger).splitlines()[0].removeprefix("cost: ") + f", goodput {ledger.goodput:.1%}"


def print_logs(outputs: StackOutputs, job_id: str | None, follow: bool, poll_s: float = 5.0) -> None:
    job = describe(outputs, job_id)
    logs = client("logs", outputs.region)
    stream, token = None, None
    while True:
        stream = stream or main_node_log_stream(outputs, job)
        if stream:
            kwargs: dict[str, str] = {"nextToken": token} if token else {}
            page = logs.get_log_events(
                logGroupName=outputs["log_group"], logStreamName=stream, startFromHead=True, **kwargs
            )
            for event in page["events"]:
                print(event["message"])
            fresh = page["nextForwardToken"] != token
            token = page["nextForwardToken"]
            if fresh and page["events"]:
                continue  # drain what is already there before deciding to wait
        if not follow or job["status"] in TERMINAL:
            if not stream:
                print(
                    f"job {job['jobId']} is {job['status']}; its log stream appears when the main node starts"
                )
            return
        time.sleep(poll_s)
        job = describe(outputs, job["jobId"])


def cancel(outputs: StackOutputs, job_id: str) -> str:
    job = describe(outputs, job_id)
    if job["status"] in TERMINAL:
        raise JobError(f"job {job_id} already ended ({job['status']}); nothing to cancel")
    # terminate_job stops RUNNING jobs too (cancel_job only dequeues); Batch sends SIGTERM, so the trainer
    # saves a checkpoint at the next step boundary before it exits.
    client("batch", outputs.region).terminate_job(jobId=job_id, reason="cancelled with `make cancel`")
    return job["status"]


# A job in these states may still start, or runs: it holds, or will hold, its run directory /fsx/checkpoints/<run>.
LIVE = tuple(status for status in STATUSES if status not in TERMINAL)


def run_jobs(
    outputs: StackOutputs, run: str, team: str | None = None, queue: str = "job_queue"
) -> list[tuple[str, str]]:
    """The jobs of `run` (submit names each after its run): (Batch job id or JobSet name, status); on Batch those
    of `team` (or of no team) on the queue the stack output `queue` names, on EKS those in `team`'s namespace, where
    its run of that name would go."""
    if outputs.orchestrator == "eks":
        return [(name, status) for name, status in _jobsets(outputs, team) if name == run]
    return [(j["jobId"], j["status"]) for j in batch_run_jobs(outputs, run, team, queue)]


def batch_run_jobs(
    outputs: StackOutputs, run: str, team: str | None = None, queue: str = "job_queue"
) -> list[dict[str, Any]]:
    """ListJobs' summaries of the Batch jobs named `run` on the queue that are `team`'s (None: no team's)."""
    batch = client("batch", outputs.region)
    # ListJobs with a JOB_NAME filter returns jobs of every status, the name matched case-insensitively (Batch API
    # Reference, ListJobs `filters`): the exact name is kept here.
    pages = batch.get_paginator("list_jobs").paginate(
        jobQueue=outputs[queue], filters=[{"name": "JOB_NAME", "values": [run]}]
    )
    named = [j for page in pages for j in page["jobSummaryList"] if j["jobName"] == run]
    # Two teams' runs may share a name on one queue (each in its own directory: trainer/contract/teams.py): a job is
    # a team's by its `team` tag, which ListJobs' summaries lack and DescribeJobs' details carry (Batch API
    # Reference, JobDetail `tags`; at most 100 jobs a call).
    ids = [j["jobId"] for j in named]
    tags = {
        j["jobId"]: j.get("tags")
        for i in range(0, len(ids), 100)
        for j in batch.describe_jobs(jobs=ids[i : i + 100])["jobs"]
    }
    return [j for j in named if job_team(tags.get(j["jobId"])) == team]


def stop_and_wait(
    outputs: StackOutputs,
    jobs: list[tuple[str, str]],
    reason: str,
    timeout_s: float,
    poll_s: float = 5.0,
    team: str | None = None,
) -> list[tuple[str, str]]:
    """Stop `jobs` and wait until each has ended (Batch) or is gone (EKS, where a JobSet's name stays taken until it
    is deleted, so an ended one is deleted too; in `team`'s namespace); the jobs still there after `timeout_s`."""
    eks = outputs.orchestrator == "eks"
    if eks:
        from trainer.jobs.eks import connect

        cluster = connect(outputs, team=team)
        for name, _ in jobs:
            cluster.delete_jobset(name)  # each pod gets SIGTERM, then its termination grace
    else:
        for job_id, status in jobs:
            if (
                status in LIVE
            ):  # Batch sends SIGTERM: the trainer saves at the next step boundary, then SIGKILL
                client("batch", outputs.region).terminate_job(jobId=job_id, reason=reason)
    ids = [job for job, _ in jobs]
    deadline = time.monotonic() + timeout_s
    while True:
        if eks:
            waiting = [(name, status) for name, status in _jobsets(outputs, team) if name in ids]
        else:
            found = client("batch", outputs.region).describe_jobs(jobs=ids)["jobs"]
            waiting = [(j["jobId"], j["status"]) for j in found if j["status"] not in TERMINAL]
        if not waiting or time.monotonic() >= deadline:
            return waiting
        time.sleep(poll_s)


def _jobsets(outputs: StackOutputs, team: str | None) -> list[tuple[str, str]]:
    from trainer.jobs.eks import connect, jobset_status

    return [(str(js["metadata"]["name"]), jobset_status(js)) for js in connect(outputs, team=team).jobsets()]


def print_jobset_status(outputs: StackOutputs, name: str | None, team: str | None) -> None:
    from trainer.jobs.eks import connect, created_at, jobset_status, status_reason

    cluster = connect(outputs, team=team)
    if name is None:
        jobsets = cluster.jobsets()[:10]
        if not jobsets:
            print(f"no jobs in namespace {cluster.namespace!r}")
        for js in jobsets:
            print(
                f"{js['metadata']['name']}  {jobset_status(js):<9} {js['metadata']['name']:<32} created {created_at(js)}"
            )
        return
    js = cluster.jobset(name)
    print(f"job {name} ({name}): {jobset_status(js)}")
    if reason := status_reason(js):
        print(f"  reason:   {reason}")
    print(f"  nodes:    {js['spec']['replicatedJobs'][0]['template']['spec']['parallelism']}")
    print(f"  created:  {created_at(js)}")
    print(f"  attempts: {js.get('status', {}).get('restarts', 0) + 1}")
    if pod := cluster.leader_pod(js):
        print(
            f"  log:      pod {pod} in namespace {cluster.namespace} (make logs STACK={outputs.stack}"
            f"{f' TEAM={team}' if team else ''} JOB={name})"
        )
    print(f"  cluster:  {outputs['eks_cluster_name']} (queue {outputs['kueue_local_queue']})")
    # The run's files under its team's prefix: the JobSet's `team` label (trainer/jobs/jobset.py).
    print(f"  health:   {health_line(outputs, {'jobName': name, 'tags': {TEAM_TAG: team}})}")


def print_jobset_logs(
    outputs: StackOutputs, name: str | None, follow: bool, team: str | None, poll_s: float = 5.0
) -> None:
    from trainer.jobs.eks import connect, jobset_status

    cluster = connect(outputs, team=team)
    if name is None:
        jobsets = cluster.jobsets()
        if not jobsets:
            raise JobError(
                f"no jobs in namespace {cluster.namespace!r}; submit one with make train STACK=..."
            )
        name = str(jobsets[0]["metadata"]["name"])
    js = cluster.jobset(name)
    while (pod := cluster.leader_pod(js)) is None:
        if not follow or jobset_status(js) in TERMINAL:
            print(f"job {name} is {jobset_status(js)}; its log appears when node rank 0's pod starts")
            return
        time.sleep(poll_s)
        js = cluster.jobset(name)
    for line in cluster.log_lines(pod, follow):
        print(line)


def cancel_jobset(outputs: StackOutputs, name: str, team: str | None) -> str:
    from trainer.jobs.eks import connect, jobset_status

    cluster = connect(outputs, team=team)
    state = jobset_status(cluster.jobset(name))
    if state in TERMINAL:
        raise JobError(f"job {name} already ended ({state}); nothing to cancel")
    cluster.delete_jobset(name)
    return state


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("status", "logs", "cancel"))
    parser.add_argument("--stack", required=True)
    parser.add_argument("--outputs", help="a JSON file of stack outputs instead of `pulumi stack output`")
    parser.add_argument(
        "--job", help="job id (default: the newest job in the stack's queue; cancel needs one)"
    )
    parser.add_argument("--follow", action="store_true", help="logs: keep printing until the job ends")
    parser.add_argument(
        "--team", help="on an EKS stack shared by teams: the team whose namespace holds the job (TEAM=)"
    )


@dataclass(frozen=True)
class _Backend:
    """One orchestrator's status, logs and cancel, and how its jobs are named and stopped."""

    status: Callable[[StackOutputs, str | None], None]
    logs: Callable[[StackOutputs, str | None, bool], None]
    cancel: Callable[[StackOutputs, str], str]
    job: str  # what JOB= is on this orchestrator
    stopping: str  # after a cancel, with {was}
    errors: tuple[type[Exception], ...]  # its client's failures, reported as one line


def _backend(orchestrator: str, team: str | None) -> _Backend:
    """On EKS the jobs of `team` (its namespace: trainer/jobs/teams.py job_namespace); Batch job ids are unique in
    the stack's one queue, whoever's they are."""
    if orchestrator == "eks":
        from trainer.jobs.eks import ClusterError  # the Kubernetes client: only EKS stacks pay its import

        return _Backend(
            partial(print_jobset_status, team=team),
            partial(print_jobset_logs, team=team),
            partial(cancel_jobset, team=team),
            "name",
            "deletion requested (was {was}); each pod gets SIGTERM, then SIGKILL after its termination grace",
            (ClusterError,),
        )
    return _Backend(
        print_status,
        print_logs,
        cancel,
        "id",
        "termination requested (was {was}); Batch sends SIGTERM, then SIGKILL",
        (),
    )


def main(args: argparse.Namespace) -> int:
    try:
        outputs = load_outputs(args.stack, args.outputs)
        # A team's JobSets are in its namespace, so TEAM= is needed on an EKS stack with teams; on Batch it may
        # be given (it must name a team of the stack) and changes nothing.
        if (outputs.orchestrator == "eks" or args.team) and (
            problems := team_name_problems(outputs, args.team)
        ):
            raise StackError("; ".join(problems))
        backend = _backend(outputs.orchestrator, args.team)
    except StackError as error:
        print(f"{args.action}: {error}", file=sys.stderr)
        return 2
    reported: tuple[type[Exception], ...] = (StackError, JobError, *backend.errors)
    try:
        if args.action == "status":
            backend.status(outputs, args.job)
            if "serving_endpoint" in outputs.values:  # the inference pool (docs/serving-stack.md)
                from trainer.deploy.command import clients_for
                from trainer.deploy.endpoint import Pool, status_line

                pool = Pool.from_outputs(outputs.stack, outputs.values)
                print(status_line(clients_for(pool.region), pool))
        elif args.action == "logs":
            backend.logs(outputs, args.job, args.follow)
        else:
            if not args.job:
                raise JobError(
                    f"cancel needs the job: make cancel STACK=<env> JOB=<{backend.job}> (make status lists them)"
                )
            was = backend.cancel(outputs, args.job)
            print(f"job {args.job}: {backend.stopping.format(was=was)}")
    except reported as error:
        print(f"{args.action}: {error}", file=sys.stderr)
        return 2
    return 0
