"""`python -m trainer measure-stack --stack <env> --config C --measure N --out FILE`: layouts chosen by measurement
on a stack's nodes (on this machine's processes: `trainer plan --measure N`, trainer/plan/measure.py).

The planner ranks the config's layouts for the stack's nodes (its instance type and node count, or --nodes) as
`make train` would plan them; its N best that fit each run as one job of the stack's queue: `make train`'s job
(the same checks, image, command, team and, on EKS, JobSet), named `<name>-<rank>`, with `--fresh` and the layout's
keys, a few steps (--measure-steps, the first WARMUP_STEPS not timed), no save before the end and a log line every
step. The jobs queue one after another, each on the measurement's nodes. Once each has ended, its metrics.jsonl is
read from the checkpoints bucket, where FSx for Lustre exports the run directory (/fsx/checkpoints/<run> ->
s3://<bucket>/<run>; only a copy written after the job was submitted counts, since the export lags the file), and
its median step time after the warm-up is the measurement. Predicted against measured is printed, the
measured-fastest written as the config (--out), and each layout's prediction error to <out>.measured.json.

Running it again while its jobs are queued or running follows them (found by name) instead of submitting again; a
layout whose job has ended runs again, fresh.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError
from rich.console import Console
from rich.markup import escape

from trainer.arguments import positive_float, positive_int
from trainer.aws.clients import client
from trainer.aws.outputs import StackError, StackOutputs, load_outputs
from trainer.config import ConfigError
from trainer.contract.catalog import instance_type
from trainer.jobs.job import LIVE, TERMINAL, run_jobs
from trainer.jobs.jobset import RenderError
from trainer.jobs.request import Submission
from trainer.jobs.submit import (
    SubmitError,
    aws_problems,
    eks_problems,
    image_tag,
    make_way,
    node_problems,
    plan,
    submit,
)
from trainer.plan import measure
from trainer.plan.command import plan_for, write_config
from trainer.plan.performance import Assumptions
from trainer.plan.search import Candidate

METRICS = "metrics.jsonl"


@dataclass(frozen=True)
class Layout:
    rank: int  # the planner's (1: predicted fastest)
    candidate: Candidate
    submission: Submission
    overrides: tuple[str, ...]  # the layout's --set values


@dataclass(frozen=True)
class Ended:
    status: str  # in Batch's words (SUCCEEDED, FAILED)
    submitted_at: float  # seconds since the epoch: a metrics copy older than this is an earlier run's
    reason: str | None


def layouts(args: argparse.Namespace, outputs: StackOutputs, tag: str) -> list[Layout]:
    """The N best layouts that fit, each as the job that measures it, with every check `make train` makes."""
    if args.measure_steps <= measure.WARMUP_STEPS:
        raise SubmitError(
            [
                f"--measure-steps {args.measure_steps}: the first {measure.WARMUP_STEPS} are warm-up; give at "
                f"least {measure.WARMUP_STEPS + 1}"
            ]
        )
    nodes = args.nodes or outputs.node_count
    if problems := node_problems(outputs, nodes):
        raise SubmitError(problems)
    instance = instance_type(outputs["instance_type"])
    try:
        ranked = plan_for(args.config, args.overrides, instance, nodes, Assumptions())
    except ConfigError as error:
        raise SubmitError(error.problems) from None
    best = [c for c in ranked.candidates if c.fits][: args.measure]
    if not best:
        raise SubmitError(
            [f"no layout of {args.config} fits {nodes} x {instance.name}: python -m trainer plan says why"]
        )
    name = args.name or f"measure-{Path(args.config).stem}"
    found = []
    for rank, candidate in enumerate(best, 1):
        keys = measure.measured_run_overrides(candidate, ranked.free_keys, args.measure_steps)
        submission, cfg = plan(
            args.config, [*args.overrides, *keys], outputs, nodes, tag, f"{name}-{rank}", args.team
        )
        # A fresh run each time: the trainer drops the run directory's checkpoints and metrics first.
        submission = dataclasses.replace(
            submission, command=[submission.command[0], "--fresh", *submission.command[1:]]
        )
        if problems := eks_problems(submission, outputs):
            raise SubmitError(problems)
        if rank == 1 and (problems := aws_problems(submission, cfg, outputs, tag)):
            raise SubmitError(problems)  # the image, queue or cluster, and data: the same for every layout
        layout_keys = tuple(candidate.overrides(ranked.free_keys))
        found.append(Layout(rank, candidate, submission, layout_keys))
    return found


def start(layout: Layout, outputs: StackOutputs, console: Console) -> str:
    """The layout's job: the live one of its run, followed, or a new one (an ended JobSet of its name deleted
    first, trainer/jobs/submit.py make_way); its id (the JobSet's name on EKS)."""
    run, team = layout.submission.run, layout.submission.team
    for job_id, status in run_jobs(outputs, run, team):
        if status in LIVE:
            console.print(f"layout {layout.rank}: following {run} ({job_id}, {status}), submitted before")
            return job_id
    make_way(layout.submission, outputs, replace=True, dry_run=False)
    job_id = submit(layout.submission, outputs)
    console.print(f"layout {layout.rank}: submitted {run} ({job_id}): {escape(layout.candidate.describe())}")
    return job_id


def job_reader(outputs: StackOutputs, team: str | None) -> Callable[[str], Ended | None]:
    """How a job is read: None while it is queued or running."""
    if outputs.orchestrator == "eks":
        from trainer.jobs.eks import connect, jobset_status, status_reason  # the client for EKS stacks only

        cluster = connect(outputs, team=team)

        def read_jobset(name: str) -> Ended | None:
            js = cluster.jobset(name)
            status = jobset_status(js)
            created = js["metadata"].get("creationTimestamp", "1970-01-01T00:00:00Z")
            since = datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()
            return Ended(status, since, status_reason(js)) if status in TERMINAL else None

        return read_jobset
    batch = client("batch", outputs.region)

    def read_job(job_id: str) -> Ended | None:
        job = batch.describe_jobs(jobs=[job_id])["jobs"][0]
        if job["status"] not in TERMINAL:
            return None
        return Ended(job["status"], job["createdAt"] / 1000, job.get("statusReason"))

    return read_job


def exported_metrics(s3: Any, bucket: str, run_key: str, since: float) -> list[str] | None:
    """The run's metrics.jsonl as FSx exported it to the checkpoints bucket, if a copy written at or after `since`
    is there (S3 LastModified has whole seconds)."""
    try:
        got = s3.get_object(Bucket=bucket, Key=f"{run_key}/{METRICS}")
    except ClientError as error:
        if error.response["Error"]["Code"] in ("NoSuchKey", "404"):
            return None
        raise
    if got["LastModified"].timestamp() < int(since):
        return None
    return got["Body"].read().decode().splitlines()


def measure_on_stack(
    found: list[Layout],
    job_ids: dict[int, str],
    outputs: StackOutputs,
    console: Console,
    *,
    poll_s: float,
    export_timeout_s: float,
) -> list[measure.Measurement]:
    """Wait for every layout's job to end and its metrics to be exported; a measurement each."""
    read = job_reader(outputs, found[0].submission.team)
    s3, bucket = client("s3", outputs.region), outputs["checkpoints_bucket"]
    ended: dict[int, Ended] = {}
    measured: dict[int, measure.Measurement] = {}
    export_deadline: dict[int, float] = {}
    while len(measured) < len(found):
        for layout in found:
            rank = layout.rank
            if rank in measured:
                continue
            if rank not in ended:
                if (job := read(job_ids[rank])) is None:
                    continue
                ended[rank] = job
                export_deadline[rank] = time.monotonic() + export_timeout_s
                console.print(f"layout {rank}: {layout.submission.run} {job.status}")
            job = ended[rank]
            if job.status != "SUCCEEDED":
                why = f"job {job_ids[rank]} {job.status}" + (f": {job.reason}" if job.reason else "")
                measured[rank] = measure.Measurement(rank, layout.candidate, layout.overrides, None, why)
                continue
            lines = exported_metrics(s3, bucket, layout.submission.run_key, job.submitted_at)
            seconds = None if lines is None else measure.median_step_seconds(lines)
            if seconds is not None:
                measured[rank] = measure.Measurement(rank, layout.candidate, layout.overrides, seconds)
            elif time.monotonic() >= export_deadline[rank]:
                where = f"s3://{outputs['checkpoints_bucket']}/{layout.submission.run_key}/{METRICS}"
                why = (
                    f"no step after the {measure.WARMUP_STEPS} warm-up steps in {where} {export_timeout_s:g} s "
                    "after the job ended (FSx exports the run directory; give more --measure-steps)"
                )
                measured[rank] = measure.Measurement(rank, layout.candidate, layout.overrides, None, why)
        if len(measured) < len(found):
            time.sleep(poll_s)
    return [measured[layout.rank] for layout in found]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True)
    parser.add_argument("--outputs", help="a JSON file of stack outputs instead of `pulumi stack output`")
    parser.add_argument("--config", required=True, type=Path, help="the config, under trainer/configs/")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--measure", required=True, type=positive_int, metavar="N", help="layouts to measure")
    parser.add_argument(
        "--measure-steps",
        type=positive_int,
        default=20,
        help=f"steps per layout, the first {measure.WARMUP_STEPS} not timed (default %(default)s)",
    )
    parser.add_argument("--out", required=True, type=Path, help="the measured-fastest layout's config")
    parser.add_argument(
        "--nodes", type=positive_int, help="nodes per layout (default: the stack's node count)"
    )
    parser.add_argument(
        "--name", help="the jobs' run names are <name>-<rank> (default: measure-<config stem>)"
    )
    parser.add_argument("--team", help="on a stack shared by teams: the team whose share the jobs use")
    parser.add_argument("--image", help="image tag in the stack's ECR repository (default: this git commit)")
    parser.add_argument(
        "--export-timeout",
        type=positive_float,
        default=600.0,
        metavar="S",
        help="seconds to wait, once a job has ended, for its metrics in the checkpoints bucket (default %(default)s)",
    )
    parser.add_argument("--poll", type=float, default=30.0, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    console = Console(highlight=False, soft_wrap=True)
    try:
        outputs = load_outputs(args.stack, args.outputs)
        found = layouts(args, outputs, image_tag(args.image))
        nodes = found[0].submission.nodes
        console.print(
            f"measuring the planner's {len(found)} best layouts on {nodes} x {outputs['instance_type']} of stack "
            f"{outputs.stack}, {args.measure_steps} steps each (the first {measure.WARMUP_STEPS} not timed)"
        )
        job_ids = {layout.rank: start(layout, outputs, console) for layout in found}
    except (StackError, SubmitError, RenderError) as error:
        print(f"measure-stack: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # the API server refused or could not be reached (trainer/jobs/eks.py)
        print(f"measure-stack: {error}", file=sys.stderr)
        return 1
    try:
        measurements = measure_on_stack(
            found, job_ids, outputs, console, poll_s=args.poll, export_timeout_s=args.export_timeout
        )
    except KeyboardInterrupt:
        console.print("\nstopped waiting; the jobs run on: the same command follows them again")
        return 130
    chosen = measure.fastest(measurements)
    measure.print_measurements(console, measurements, chosen)
    record = measure.record_path(args.out)
    machine = f"{nodes} x {outputs['instance_type']} (stack {outputs.stack})"
    assumptions = dataclasses.asdict(Assumptions())
    measure.write_record(record, args.config, args.measure_steps, measurements, machine, assumptions)
    console.print(f"prediction errors: {record}")
    if chosen is None:
        console.print("[bold red]no layout's job succeeded[/]")
        return 1
    console.print(
        f"fastest measured: {escape(chosen.candidate.describe())} ({chosen.measured_s:.4f} s a step)"
    )
    write_config(chosen.candidate, args.out, str(args.config))
    sets = " ".join(f"--set {value}" for value in chosen.overrides)
    console.print(
        f"wrote {args.out}; on the stack, its layout over {args.config} (the image carries trainer/ only):\n"
        f'  make train STACK={outputs.stack} CONFIG={args.config} ARGS="{sets}"'
    )
    return 0
