"""`python -m trainer sweep-stack` (`make sweep STACK=<env> TRIALS=32 PARALLEL=4`): a sweep on a stack.

Its trials run as PARALLEL workers, one node each, of the stack's queue:
- Batch: one array job of PARALLEL children on the single-node GPU queue (the Spot queue, infra/cluster.py `_spot`:
  the main queue's definition is multi-node, one job across nodes, while each trial here is one node's trainer);
- EKS: one JobSet of one Indexed Job of PARALLEL pods, one a node (trainer/jobs/jobset.py, as a run's, admitted by
  Kueue as a whole; its worker index the pod's JOB_COMPLETION_INDEX).
Every worker runs `python -m trainer sweep-worker` (trainer/sweep/worker.py) as its node's one process (`launch
--direct`: not a torchrun rank, since each of its trials is a `trainer train` of the node's GPUs): it asks the
shared study for a trial, trains it, reports it, and repeats until the sweep's TRIALS are in the study or its one
dollar cap is reached. The study lives on FSx for Lustre, which every node mounts:
/fsx/checkpoints/sweeps/<name>/ (a team's: /fsx/checkpoints/teams/<team>/sweeps/<name>/), an Optuna journal file
(trainer/sweep/study.py says why its lock holds on Lustre as mounted here), with each trial's run directory beside
it, exported to the checkpoints bucket like any run's.

The driver only submits and follows: the job (or JobSet) is named `sweep-<name>`, after the study alone, so that a
study has one live job whatever its TRIALS or cap (two jobs' workers of one index would take each other's running
trials for their own interrupted ones). Running the command again finds it by name (trainer/jobs/job.py run_jobs)
and follows it instead of submitting another, or refuses while it runs another TRIALS or cap. An ended one that
succeeded with the same worker command is reported; one that failed, or ran another TRIALS or cap, is submitted
again (the study resumes where its workers left it; on EKS the ended JobSet is deleted first, since its name stays
taken).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.aws.clients import client
from trainer.aws.outputs import StackError, StackOutputs, load_outputs
from trainer.config import ConfigError
from trainer.contract.container import CHECKPOINTS_DIR, IMAGE_TAG_ENV
from trainer.contract.teams import RUN_TAG, STACK_TAG, run_path
from trainer.jobs.data import MAX_ARRAY_SIZE  # PARALLEL=1: a plain job, not an array
from trainer.jobs.job import LIVE, TERMINAL, run_jobs, stop_and_wait
from trainer.jobs.jobset import RenderError, jobset_manifest, jobset_name_problems
from trainer.jobs.request import job_settings
from trainer.jobs.submit import (
    REPLACE_POLL_S,
    REPLACE_SLACK_S,
    ROOT,
    SubmitError,
    image_problems,
    image_tag,
    job_definition_for,
    submit_jobset,
)
from trainer.jobs.teams import team_problems, team_submit_arguments
from trainer.sweep.space import load_sweep
from trainer.sweep.worker import positive_dollars
from trainer.tracking.mlflow_runs import DEFAULT_URI

QUEUE, DEFINITION = "spot_job_queue", "spot_job_definition"
# Batch SubmitJob jobName: up to 128 letters, numbers, hyphens and underscores, starting with a letter or number
# (Batch API Reference, SubmitJob); `sweep-` takes 6 of them.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
SWEEP_ENV = "TRAINSTACK_SWEEP"


def job_name(name: str) -> str:
    """The sweep's array job (or JobSet): named after its study alone."""
    return f"sweep-{name}"


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
    mlflow: str | None = None  # the tracking server's URI each worker logs its trials to

    @property
    def job_name(self) -> str:
        """One job per study, whatever its TRIALS or cap: two jobs' workers of one index on one study would each
        take the other's running trial for its own interrupted one (trainer/sweep/study.py open_study)."""
        return job_name(self.name)

    @property
    def directory(self) -> str:
        """The shared study's directory on FSx, under the team's prefix for a team's sweep."""
        return f"{CHECKPOINTS_DIR}/{run_path('sweeps', self.team)}/{self.name}"

    def worker_command(self) -> list[str]:
        """The container's arguments (the entrypoint runs `trainer launch <them>`): the worker as the node's one
        process, not a torchrun rank (trainer/launch/node.py --direct)."""
        command = [
            "--direct",
            "sweep-worker",
            "--sweep",
            str(self.sweep),
            "--name",
            self.name,
            "--dir",
            self.directory,
        ]
        command += ["--trials", str(self.trials)]
        if self.max_dollars is not None:
            command += ["--max-dollars", f"{self.max_dollars:g}"]
        if self.mlflow is not None:
            command += ["--mlflow", self.mlflow]
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
    mlflow: str | None = None,
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
        # Its trials train on one node's GPUs, not on this machine (which may have none)
        loaded = load_sweep(path, overrides, world=(outputs.gpus_per_node, "cuda"))
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
        # The JobSet's name: `sweep-<name>`, a DNS-1035 label with room for its pods' names.
        problems += [
            f"NAME={name!r}: the sweep's JobSet is named {job_name(name)!r}, which EKS refuses ({problem})"
            for problem in jobset_name_problems(job_name(name), parallel)
        ]
    elif QUEUE not in outputs.values or DEFINITION not in outputs.values:
        problems.append(
            f"stack {outputs.stack!r} has no single-node GPU queue ({QUEUE}, {DEFINITION}): a sweep's workers are "
            "one node each; turn on trainstack:spot (docs/infra.md) and make up"
        )
    problems += team_problems(outputs, team, parallel)
    if problems:
        raise SubmitError(problems)
    relative = path.relative_to(ROOT)
    return StackSweep(relative, name, trials, parallel, max_dollars, team, tag, overrides, mlflow)


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


def sweep_jobset(plan: StackSweep, outputs: StackOutputs) -> dict[str, Any]:
    """The JobSet of an EKS stack's sweep: PARALLEL pods of one Indexed Job, each a node's worker, as the API
    server receives it (the stack's JobSet for a run of PARALLEL nodes, trainer/jobs/jobset.py, with the workers'
    command: its namespace, Kueue queue, team label and service account, FSx claim, GPUs and EFA, grace and
    timeout). A pod that fails with the retry code or loses its node restarts the JobSet, as a run's does: each
    restarted worker re-queues the trial it was running (trainer/sweep/study.py open_study)."""
    return jobset_manifest(
        plan.job_name,
        plan.parallel,
        f"{outputs['ecr_repository_url']}:{plan.tag}",
        plan.worker_command(),
        {SWEEP_ENV: plan.name, IMAGE_TAG_ENV: plan.tag},
        outputs,
        job_settings(outputs.stack),
        plan.team,
    )


def start(plan: StackSweep, outputs: StackOutputs) -> tuple[str, str]:
    """The sweep's array job (or JobSet), found by its name or submitted: (job id or JobSet name, what happened).

    The study's one live job is followed when its workers run the requested command, and refused otherwise (its
    TRIALS or cap differ): it must end first. An ended one running the same command is reported; one that failed,
    or that ran another TRIALS or cap (continuing a sweep past its last TRIALS or cap), is submitted again and the
    study resumes."""
    found = run_jobs(outputs, plan.job_name, plan.team, queue=QUEUE)
    commands = worker_commands(outputs, [job for job, _ in found], plan.team)
    wanted = plan.worker_command()
    for job_id, status in found:
        if status in LIVE:
            if commands.get(job_id) != wanted:
                raise SubmitError([live_refusal(plan, outputs, job_id, status, commands.get(job_id))])
            return job_id, f"following {plan.job_name} ({job_id}, {status}), submitted before"
    for job_id, status in found:
        if status == "SUCCEEDED" and commands.get(job_id) == wanted:
            return job_id, f"{plan.job_name} ({job_id}) already ended: SUCCEEDED"
    if not found:
        again = ""
    elif any(status == "SUCCEEDED" for _, status in found):
        again = " again (the last one ended with another TRIALS or cap; the study resumes)"
    else:
        again = " again (the last one failed; the study resumes)"
    if outputs.orchestrator == "eks":
        # An ended JobSet keeps its name: it goes first (its pods have ended; nothing to stop).
        grace = job_settings(outputs.stack).stop_grace_seconds + REPLACE_SLACK_S
        reason = f"sweep {plan.name}: submitted again"
        if found and (left := stop_and_wait(outputs, found, reason, grace, REPLACE_POLL_S, plan.team)):
            raise SubmitError(
                [
                    f"JobSet {name} is still there {grace:g} s after its deletion; run again"
                    for name, _ in left
                ]
            )
        name = submit_jobset(sweep_jobset(plan, outputs), outputs, plan.team)
        return name, f"submitted JobSet {name}{again}: {plan.parallel} workers, {plan.trials} trials"
    definition = job_definition_for(f"{outputs['ecr_repository_url']}:{plan.tag}", outputs, DEFINITION)
    job_id = client("batch", outputs.region).submit_job(**sweep_request(plan, outputs, definition))["jobId"]
    return (
        job_id,
        f"submitted {plan.job_name} ({job_id}){again}: {plan.parallel} workers, {plan.trials} trials",
    )


def worker_commands(outputs: StackOutputs, jobs: list[str], team: str | None) -> dict[str, list[str]]:
    """What each of the sweep's jobs runs: the array job's container command (DescribeJobs JobDetail
    `container.command`, the submitted containerOverrides' command: Batch API Reference, ContainerDetail), or the
    JobSet's workers' container args (the same list: trainer/jobs/jobset.py)."""
    if not jobs:
        return {}
    if outputs.orchestrator == "eks":
        from trainer.jobs.eks import connect  # the kubernetes client only for EKS stacks

        cluster = connect(outputs, team=team)
        commands = {}
        for name in jobs:
            replicated = cluster.jobset(name)["spec"]["replicatedJobs"][0]
            [container] = replicated["template"]["spec"]["template"]["spec"]["containers"]
            commands[name] = list(container.get("args", []))
        return commands
    batch = client("batch", outputs.region)
    # DescribeJobs takes at most 100 jobs a call (Batch API Reference, DescribeJobs `jobs`).
    return {
        job["jobId"]: list(job.get("container", {}).get("command", []))
        for i in range(0, len(jobs), 100)
        for job in batch.describe_jobs(jobs=jobs[i : i + 100])["jobs"]
    }


def _option(command: list[str] | None, option: str) -> str | None:
    """The value of `option` in a worker's command, or None where it has none."""
    if command and option in command[:-1]:
        return command[command.index(option) + 1]
    return None


def live_refusal(
    plan: StackSweep, outputs: StackOutputs, job_id: str, status: str, command: list[str] | None
) -> str:
    """Why a second job may not run on the study, and how to wait for or cancel the live one."""

    def shape(trials: str | None, cap: str | None) -> str:
        return f"TRIALS={trials}, MAX_DOLLARS={cap or 'none'}"

    cap = None if plan.max_dollars is None else f"{plan.max_dollars:g}"
    live = shape(_option(command, "--trials"), _option(command, "--max-dollars"))
    asked = shape(str(plan.trials), cap)
    if live == asked:  # another sweep YAML, --set or directory
        live, asked = f"the workers' command {command}", f"{plan.worker_command()}"
    team = f" TEAM={plan.team}" if plan.team else ""
    where = f"STACK={outputs.stack}{team} JOB={job_id}"
    return (
        f"NAME={plan.name}: {plan.job_name} ({job_id}) is {status} on this study with {live}; this asks for "
        f"{asked}. One job runs a study at a time (two would take each other's trials): wait for it to end "
        f"(make status {where}) or cancel it (make cancel {where}), then run this again; the study resumes"
    )


def follow(outputs: StackOutputs, job_id: str, poll_s: float = 30.0, team: str | None = None) -> str:
    """Print the job's status and its workers' counts as they change, until it ends; its last status."""
    read = _jobset_reader(outputs, team) if outputs.orchestrator == "eks" else _array_job_reader(outputs)
    shown = None
    while True:
        name, status, counts = read(job_id)
        line = status + (": " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) if counts else "")
        if line != shown:
            print(f"{name}: {line}", flush=True)
            shown = line
        if status in TERMINAL:
            return status
        time.sleep(poll_s)


Reading = tuple[str, str, dict[str, int]]  # name, status in Batch's words, workers by state


def _array_job_reader(outputs: StackOutputs) -> Callable[[str], Reading]:
    batch = client("batch", outputs.region)

    def read(job_id: str) -> Reading:
        job = batch.describe_jobs(jobs=[job_id])["jobs"][0]
        counts = job.get("arrayProperties", {}).get("statusSummary", {})
        return str(job["jobName"]), str(job["status"]), {s.lower(): int(n) for s, n in counts.items()}

    return read


def _jobset_reader(outputs: StackOutputs, team: str | None) -> Callable[[str], Reading]:
    from trainer.jobs.eks import connect, jobset_status  # the kubernetes client only for EKS stacks

    cluster = connect(outputs, team=team)

    def read(name: str) -> Reading:
        js = cluster.jobset(name)
        # The replicated job's Jobs by state (jobset v0.12.0 ReplicatedJobStatus: ready, succeeded, failed,
        # active, suspended); the sweep's one Job holds every worker, so the pods' counts are the Job's own.
        counts = {
            key: int(sum(rjob.get(key, 0) for rjob in js.get("status", {}).get("replicatedJobsStatus", [])))
            for key in ("active", "succeeded", "failed")
        }
        return name, jobset_status(js), counts

    return read


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True)
    parser.add_argument("--outputs", help="a JSON file of stack outputs instead of `pulumi stack output`")
    parser.add_argument("--sweep", required=True, type=Path, help="the sweep YAML, under trainer/configs/")
    parser.add_argument("--name", help="the study's name (default: the YAML's stem)")
    parser.add_argument("--trials", type=int, help="trials the sweep runs in all (default: the YAML's)")
    parser.add_argument("--parallel", type=int, default=1, help="workers, one node each (the array's size)")
    # Parsed in main, so that a bad cap is refused as MAX_DOLLARS=..., the make variable the user gave.
    parser.add_argument("--max-dollars", help="the sweep's one dollar cap across its trials (US dollars)")
    parser.add_argument("--team", help="on a stack shared by teams: the team whose share the workers use")
    parser.add_argument("--image", help="image tag in the stack's ECR repository (default: this git commit)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument(
        "--mlflow", metavar="URI", help="the MLflow tracking server each worker logs its trials to"
    )
    parser.add_argument(
        "--register", metavar="TAG", help=argparse.SUPPRESS
    )  # refused on a stack, with the way
    parser.add_argument("--no-follow", action="store_true", help="submit (or find) and return")
    parser.add_argument("--poll", type=float, default=30.0, help=argparse.SUPPRESS)


def dollar_cap(text: str) -> float:
    """MAX_DOLLARS as the worker parses it (trainer/sweep/worker.py positive_dollars: above 0, not nan, finite),
    refused here before any AWS call: a cap the worker refuses would fail every child of the array job."""
    try:
        return positive_dollars(text)
    except argparse.ArgumentTypeError:
        raise SubmitError(
            [f"MAX_DOLLARS={text}: give a positive number of US dollars (above 0, finite; not nan or inf)"]
        ) from None


def tracking_uri(uri: str | None) -> str | None:
    """MLFLOW= on a stack: a tracking server's URI the workers reach; the local default store (a SQLite file under
    this checkout's runs/) is on no node, so MLFLOW=1 without a URI is refused."""
    if uri is not None and uri.strip() in ("", "1", DEFAULT_URI):
        raise SubmitError(
            [
                f"MLFLOW={uri or 1}: on a stack the workers log to a tracking server they can reach: give its URI, "
                f"MLFLOW=http://<host>:5000 (the local store {DEFAULT_URI} is on this machine, not on the nodes)"
            ]
        )
    return uri


def register_refusal(tag: str, name: str, stack: str, team: str | None) -> str:
    """REGISTER= on a stack: refused, with how to tag the best trial's version once the sweep has ended."""
    where = f"--stack {stack}" + (f" --team {team}" if team else "")
    return (
        f"REGISTER={tag}: a sweep on a stack does not register its best trial; leave REGISTER out, and once the "
        f"sweep has ended find the best trial's version (its runs are named {name}-t<number>) with `python -m "
        f"trainer models list {where}` and point the tag at it: `python -m trainer models promote <version> "
        f"--tag {tag} {where}`"
    )


def main(args: argparse.Namespace) -> int:
    try:
        outputs = load_outputs(args.stack, args.outputs)
        max_dollars = None if args.max_dollars is None else dollar_cap(args.max_dollars)
        mlflow = tracking_uri(args.mlflow)
        if args.register:
            raise SubmitError(
                [register_refusal(args.register, args.name or args.sweep.stem, args.stack, args.team)]
            )
        if args.trials is not None and args.trials < 1:
            raise SubmitError([f"TRIALS={args.trials}: give at least 1"])
        plan = plan_sweep(
            args.sweep,
            args.name,
            args.trials,
            args.parallel,
            max_dollars,
            args.team,
            image_tag(args.image),
            tuple(args.overrides),
            outputs,
            mlflow,
        )
        if problems := image_problems(outputs, plan.tag):
            raise SubmitError(problems)
        job_id, what = start(plan, outputs)
    except (StackError, SubmitError, RenderError) as error:
        print(f"sweep: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # the API server refused or could not be reached (trainer/jobs/eks.py)
        print(f"sweep: {error}", file=sys.stderr)
        return 1
    print(what)
    print(
        f"  study:    {plan.directory} (FSx; the checkpoints bucket's {run_path('sweeps', plan.team)}/{plan.name}/)"
    )
    if args.no_follow:
        return 0
    try:
        status = follow(outputs, job_id, args.poll, plan.team)
    except KeyboardInterrupt:
        print(f"\nstopped following; the workers run on: the same command follows {plan.job_name} again")
        return 130
    return 0 if status == "SUCCEEDED" else 1
