"""`python -m trainer sweep-stack` (`make sweep STACK=<env> TRIALS=32 PARALLEL=4`): a sweep on a Batch stack.

Its trials run as one array job of PARALLEL children on the stack's single-node GPU queue (the Spot queue,
infra/cluster.py `_spot`: the main queue's definition is multi-node, one job across nodes, while each trial here
is one node's trainer). Every child runs `python -m trainer sweep-worker` (trainer/sweep/worker.py): it asks the
shared study for a trial, trains it, reports it, and repeats until the sweep's TRIALS are in the study or its one
dollar cap is reached. The study lives on FSx for Lustre, which every node mounts:
/fsx/checkpoints/sweeps/<name>/ (a team's: /fsx/checkpoints/teams/<team>/sweeps/<name>/), an Optuna journal file
(trainer/sweep/study.py says why its lock holds on Lustre as mounted here), with each trial's run directory beside
it, exported to the checkpoints bucket like any run's.

The driver only submits and follows: the array job is named `sweep-<name>-<trials>`, so running the command again
finds it by name (trainer/jobs/job.py run_jobs) and follows it instead of submitting another; an ended one that
succeeded is reported, one that failed is submitted again (the study resumes where its workers left it).
EKS stacks: not built (an indexed Job of PARALLEL completions would carry the same worker); refused with that.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.aws.clients import client
from trainer.aws.outputs import StackError, StackOutputs, load_outputs
from trainer.config import ConfigError
from trainer.contract.container import CHECKPOINTS_DIR, IMAGE_TAG_ENV
from trainer.contract.teams import RUN_TAG, STACK_TAG, run_path
from trainer.jobs.data import MAX_ARRAY_SIZE  # PARALLEL=1: a plain job, not an array
from trainer.jobs.job import LIVE, TERMINAL, run_jobs
from trainer.jobs.submit import ROOT, SubmitError, image_tag, job_definition_for
from trainer.jobs.teams import team_problems, team_submit_arguments
from trainer.sweep.space import load_sweep

QUEUE, DEFINITION = "spot_job_queue", "spot_job_definition"
# Batch SubmitJob jobName: up to 128 letters, numbers, hyphens and underscores, starting with a letter or number
# (Batch API Reference, SubmitJob); `sweep-` and `-<trials>` take at most 12 of them.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
SWEEP_ENV = "TRAINSTACK_SWEEP"


@dataclass(frozen=True)
class StackSweep:
    sweep: Path  # relative to the repository root: the image carries trainer/
    name: str
    trials: int
    parallel: int
    max_dollars: float | None
    team: str | None
    tag: str
    overrides: tuple[str, ...] = ()

    @property
    def job_name(self) -> str:
        return f"sweep-{self.name}-{self.trials}"

    @property
    def directory(self) -> str:
        """The shared study's directory on FSx, under the team's prefix for a team's sweep."""
        return f"{CHECKPOINTS_DIR}/{run_path('sweeps', self.team)}/{self.name}"

    def worker_command(self) -> list[str]:
        command = ["sweep-worker", "--sweep", str(self.sweep), "--name", self.name, "--dir", self.directory]
        command += ["--trials", str(self.trials)]
        if self.max_dollars is not None:
            command += ["--max-dollars", f"{self.max_dollars:g}"]
        return command + [arg for override in self.overrides for arg in ("--set", override)]


def plan_sweep(
    sweep: Path,
    name: str | None,
    trials: int | None,
    parallel: int,
    max_dollars: float | None,
    team: str | None,
    tag: str,
    overrides: tuple[str, ...],
    outputs: StackOutputs,
) -> StackSweep:
    """The sweep to submit, with every check that needs no AWS call; SubmitError lists what is wrong."""
    problems: list[str] = []
    path = sweep.resolve()
    if not path.is_relative_to(ROOT / "trainer"):
        problems.append(
            f"SWEEP={sweep}: the image carries trainer/ only; put the sweep YAML beside its recipe under "
            "trainer/configs/ and rebuild the image (make image && make push)"
        )
    try:
        loaded = load_sweep(path, overrides)
    except ConfigError as error:
        raise SubmitError(problems + error.problems) from None
    name = name or sweep.stem
    if not NAME.match(name):
        problems.append(
            f"NAME={name!r}: on a stack use letters, digits, '-' and '_' (at most 64, starting with a letter or "
            "digit): the array job is named after it"
        )
    trials = trials or loaded.spec.trials
    if not 1 <= parallel <= min(MAX_ARRAY_SIZE, trials):
        problems.append(
            f"PARALLEL={parallel}: give 1 to {min(MAX_ARRAY_SIZE, trials)} (at most TRIALS={trials})"
        )
    if outputs.orchestrator == "eks":
        problems.append(
            f"stack {outputs.stack!r} runs on EKS: sweeps on a stack are built for Batch only (docs/automl.md)"
        )
    elif QUEUE not in outputs.values or DEFINITION not in outputs.values:
        problems.append(
            f"stack {outputs.stack!r} has no single-node GPU queue ({QUEUE}, {DEFINITION}): a sweep's workers are "
            "one node each; turn on trainstack:spot (docs/infra.md) and make up"
        )
    problems += team_problems(outputs, team, parallel)
    if problems:
        raise SubmitError(problems)
    relative = path.relative_to(ROOT)
    return StackSweep(relative, name, trials, parallel, max_dollars, team, tag, overrides)


def sweep_request(plan: StackSweep, outputs: StackOutputs, job_definition: str) -> dict[str, Any]:
    """Batch SubmitJob's keyword arguments: the array job whose children are the sweep's workers."""
    environment = {SWEEP_ENV: plan.name, IMAGE_TAG_ENV: plan.tag}
    team = team_submit_arguments(plan.team)
    request: dict[str, Any] = {
        "jobName": plan.job_name,
        "jobQueue": outputs[QUEUE],
        "jobDefinition": job_definition,
        "containerOverrides": {
            "command": plan.worker_command(),
            "environment": [{"name": k, "value": v} for k, v in environment.items()],
        },
        "tags": {RUN_TAG: plan.job_name, STACK_TAG: outputs.stack, **team.pop("tags", {})},
        "propagateTags": True,
        **team,
    }
    if plan.parallel > 1:
        request["arrayProperties"] = {"size": plan.parallel}
    return request


def start(plan: StackSweep, outputs: StackOutputs) -> tuple[str, str]:
    """The sweep's array job, found by its name or submitted: (job id, what happened)."""
    found = run_jobs(outputs, plan.job_name, queue=QUEUE)
    for job_id, status in found:
        if status in LIVE:
            return job_id, f"following {plan.job_name} ({job_id}, {status}), submitted before"
    for job_id, status in found:
        if status == "SUCCEEDED":
            return job_id, f"{plan.job_name} ({job_id}) already ended: SUCCEEDED"
    definition = job_definition_for(f"{outputs['ecr_repository_url']}:{plan.tag}", outputs, DEFINITION)
    job_id = client("batch", outputs.region).submit_job(**sweep_request(plan, outputs, definition))["jobId"]
    again = " again (the last one failed; the study resumes)" if found else ""
    return (
        job_id,
        f"submitted {plan.job_name} ({job_id}){again}: {plan.parallel} workers, {plan.trials} trials",
    )


def follow(outputs: StackOutputs, job_id: str, poll_s: float = 30.0) -> str:
    """Print the array job's status and its children's counts as they change, until it ends; its last status."""
    batch = client("batch", outputs.region)
    shown = None
    while True:
        job = batch.describe_jobs(jobs=[job_id])["jobs"][0]
        counts = job.get("arrayProperties", {}).get("statusSummary", {})
        line = f"{job['status']}" + (
            ": " + ", ".join(f"{n} {s.lower()}" for s, n in counts.items() if n) if counts else ""
        )
        if line != shown:
            print(f"{job['jobName']}: {line}", flush=True)
            shown = line
        if job["status"] in TERMINAL:
            return str(job["status"])
        time.sleep(poll_s)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True)
    parser.add_argument("--outputs", help="a JSON file of stack outputs instead of `pulumi stack output`")
    parser.add_argument("--sweep", required=True, type=Path, help="the sweep YAML, under trainer/configs/")
    parser.add_argument("--name", help="the study's name (default: the YAML's stem)")
    parser.add_argument("--trials", type=int, help="trials the sweep runs in all (default: the YAML's)")
    parser.add_argument("--parallel", type=int, default=1, help="workers, one node each (the array's size)")
    parser.add_argument("--max-dollars", type=float, help="the sweep's one dollar cap across its trials")
    parser.add_argument("--team", help="on a stack shared by teams: the team whose share the workers use")
    parser.add_argument("--image", help="image tag in the stack's ECR repository (default: this git commit)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--no-follow", action="store_true", help="submit (or find) and return")
    parser.add_argument("--poll", type=float, default=30.0, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    try:
        outputs = load_outputs(args.stack, args.outputs)
        if args.max_dollars is not None and args.max_dollars <= 0:
            raise SubmitError([f"MAX_DOLLARS={args.max_dollars:g}: give a positive number of US dollars"])
        if args.trials is not None and args.trials < 1:
            raise SubmitError([f"TRIALS={args.trials}: give at least 1"])
        plan = plan_sweep(
            args.sweep,
            args.name,
            args.trials,
            args.parallel,
            args.max_dollars,
            args.team,
            image_tag(args.image),
            tuple(args.overrides),
            outputs,
        )
        job_id, what = start(plan, outputs)
    except (StackError, SubmitError) as error:
        print(f"sweep: {error}", file=sys.stderr)
        return 2
    print(what)
    print(
        f"  study:    {plan.directory} (FSx; the checkpoints bucket's {run_path('sweeps', plan.team)}/{plan.name}/)"
    )
    if args.no_follow:
        return 0
    try:
        status = follow(outputs, job_id, args.poll)
    except KeyboardInterrupt:
        print(f"\nstopped following; the workers run on: the same command follows {plan.job_name} again")
        return 130
    return 0 if status == "SUCCEEDED" else 1
