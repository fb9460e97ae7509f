"""`python -m trainer finetune --stack <env>` (`make finetune STACK=<env>`): a fine-tune's stages on the cluster,
resuming where the last call stopped.

    finetune --stack ENV [--team NAME] [--dataset NAME] [--config FILE] [--suite FILE] [--run NAME] [--nodes N]
             [--image TAG] [--tag candidate] [--record NAME] [--wait] [--retry]

1 dataset  with --dataset, the prepared chat dataset in the datasets bucket: its latest published version
           (`NAME/latest.json`, written by `make data STACK=`), else NAME/NAME (`trainer upload`); the run trains on
           it, with the tokenizer prepare copied beside it (NAME.tokenizer.json)
2 train    the run's job, found by its name (Batch: the job named after the run; EKS: the JobSet of that name):
           none -> submitted with every check of `make train STACK=` (trainer/jobs/submit.py); active -> said (--wait
           polls until it ends); failed -> an error naming the job and `make logs` (--retry submits it again, which
           resumes from the run's checkpoints); succeeded -> the next stage
3 stages   evaluate -> promote -> export (`finetune-stages`, trainer/models/pipeline.py) in one one-node job named
           <run>-stages with the same image, on /fsx/checkpoints/<run>; the same status logic. Its outputs reach the
           checkpoints bucket through FSx's auto-export of /fsx/checkpoints: the evaluation beside the version
           record, the tag's file under model-tags/ (where `models list --stack` reads both) and the export under
           <run>/export/<version>/ with its marker <version>.export.json. When the run's newest version in the
           bucket has all three, the stage is done and nothing is submitted.

4 deploy   with --deploy (`make finetune STACK=<env> DEPLOY=1`) and a suite with a `deploy:` gate: the new version
           goes to the stack's endpoint (`make deploy`, trainer/deploy/) when its evaluation beats the live
           version's by the gate's margin (trainer/deploy/gate.py); else one line says why it was held back

On a stack shared by teams (docs/security.md#teams) --team is required, as for `make train`: both jobs carry the
team's share and tag (Batch) or go to its namespace (EKS), the dataset is the team's (teams/<team>/NAME, uploaded
with `trainer upload --team`), and the run, its model versions and its tags live under teams/<team>/ of the
checkpoints bucket, where `models list --stack --team` reads them; a job of the run's name is the team's only if
its `team` tag says so. --deploy is the platform operators' (the endpoint is the stack's, not a team's) and is refused
with --team.

One line per stage (`train: succeeded (job ...)`, `stages: submitted (job ...)`). Every check that needs no
cluster runs before anything is looked up or submitted: the stack, the config and layout, the run name, the suite,
the names of the tag and the evaluation, the dataset and the suite's files in the bucket.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from botocore.exceptions import ClientError
from pydantic import ValidationError

from trainer.aws.clients import client
from trainer.aws.outputs import StackError, StackOutputs, load_outputs
from trainer.checkpoint.version import RecordError
from trainer.config import TrainConfig
from trainer.contract.container import CHECKPOINTS_DIR, IMAGE_TAG_ENV
from trainer.contract.teams import run_path, team_root
from trainer.evaluation.suite import Suite
from trainer.jobs.job import STATUSES, TERMINAL, batch_run_jobs
from trainer.jobs.jobset import RenderError
from trainer.jobs.request import Submission
from trainer.jobs.residency import residency_problems
from trainer.jobs.submit import (
    FSX_DATASETS,
    ROOT,
    SubmitError,
    aws_problems,
    eks_problems,
    image_problems,
    image_tag,
    orchestrator_problems,
    plan,
    submit,
)
from trainer.jobs.teams import team_name_problems
from trainer.models.pipeline import DEFAULT_TAG, DTYPES, EXPORT, EXPORT_MARKER_SUFFIX, check_names
from trainer.models.registry import Registry, S3Store

DEFAULT_CONFIG = Path("trainer/configs/llama3-8b-sft.yaml")
DEFAULT_SUITE = Path("trainer/configs/suites/llama3-8b-sft.yaml")
STAGES_SUFFIX = "-stages"
ACTIVE = tuple(status for status in STATUSES if status not in TERMINAL)
DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# What `prepare --format chat` writes for PREFIX (trainer/data/chat.py): tokens, the loss mask, the tokenizer it
# tokenized with, and the record written last.
CHAT_SUFFIXES = (".bin", ".idx", "-mask.bin", "-mask.idx", ".tokenizer.json", ".chat.json")
LATEST = "latest.json"  # `make data STACK=`'s pointer to a dataset's newest version (trainer/jobs/data.py)


@functools.cache
def _cached_client(service: str, region: str, endpoint: str | None) -> Any:
    return client(service, region)


def aws(service: str, region: str) -> Any:
    """One client per service for this process (each boto3 session costs a fraction of a second to build)."""
    return _cached_client(service, region, os.environ.get("AWS_ENDPOINT_URL"))


class FinetuneError(RuntimeError):
    """A stage that cannot go on: what is wrong and what to do."""


@dataclass(frozen=True)
class ClusterJob:
    """A job on either orchestrator, in Batch's words (trainer/jobs/eks.py jobset_status for a JobSet)."""

    id: str
    status: str
    created: float  # epoch seconds
    stopped: float | None
    reason: str | None


@dataclass(frozen=True)
class Pipeline:
    """Everything the stages need, checked: the run, its training submission and config, the stages' job."""

    run: str
    train: Submission
    cfg: TrainConfig
    stages: Submission
    record: str
    tag: str
    team: str | None = None

    @property
    def path(self) -> str:
        """The run below the bucket's root (a team's under teams/<team>/)."""
        return run_path(self.run, self.team)


def _missing(s3: Any, bucket: str, key: str) -> bool:
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
            return True
        raise
    return False


def dataset_prefix(outputs: StackOutputs, name: str, team: str | None = None) -> str:
    """The chat dataset's prefix under /fsx/datasets: its latest published version, else NAME/NAME (a team's under
    teams/<team>/, where `trainer upload --team` puts it); every file `prepare --format chat` writes must be in the
    bucket."""
    if not DATASET_NAME.match(name):
        raise SubmitError(
            [f"DATASET={name!r}: a folder name in the datasets bucket: letters, digits, '.', '-' and '_'"]
        )
    s3, bucket = aws("s3", outputs.region), outputs["datasets_bucket"]
    folder = team_root(team) + name
    key = f"{folder}/{name}"
    if not _missing(s3, bucket, f"{folder}/{LATEST}"):
        latest = json.loads(s3.get_object(Bucket=bucket, Key=f"{folder}/{LATEST}")["Body"].read())
        key = str(latest["prefix"]).removeprefix(FSX_DATASETS)
    absent = [f"s3://{bucket}/{key}{s}" for s in CHAT_SUFFIXES if _missing(s3, bucket, key + s)]
    if absent:
        raise SubmitError(
            [
                f"DATASET={name}: {', '.join(absent)} not found: prepare the chat data here with `python -m trainer "
                f"prepare --format chat ... --output data/{name}/{name}` and upload it with `python -m trainer upload "
                f"--stack {outputs.stack} --prefix data/{name}/{name} --name {name}{' --team ' + team if team else ''}` "
                f"(docs/finetune.md; make data "
                f"STACK={outputs.stack} publishes text corpora only)"
            ]
        )
    return FSX_DATASETS + key


def suite_problems(suite_path: Path, outputs: StackOutputs, team: str | None = None) -> list[str]:
    """The suite is in the image (under trainer/), parses, and every file it names is in the datasets bucket (a
    team's under its own prefix, the only one its role may check, as for its training data)."""
    path = suite_path.resolve()
    if not path.is_relative_to(ROOT / "trainer"):
        return [
            f"SUITE={suite_path}: the image carries trainer/ only; put the suite under trainer/configs/suites/"
        ]
    try:
        suite = Suite.model_validate(yaml.safe_load(path.read_text()) or {})
    except OSError as error:
        return [f"SUITE={suite_path}: {error.strerror}"]
    except (yaml.YAMLError, ValidationError) as error:
        return [f"SUITE={suite_path}: not a suite ({error}); docs/evaluate.md gives its format"]
    wanted: list[tuple[str, str, tuple[str, ...]]] = [
        (f"perplexity.{i}.data", t.data, (".bin", ".idx")) for i, t in enumerate(suite.perplexity)
    ]
    wanted += [(f"generation.{i}.file", t.file, ("",)) for i, t in enumerate(suite.generation)]
    s3, bucket, problems = aws("s3", outputs.region), outputs["datasets_bucket"], []
    own = FSX_DATASETS + team_root(team)
    upload_team = f" TEAM={team}" if team else ""
    for key, value, suffixes in wanted:
        if not value.startswith(own):
            where = (
                f"team {team}'s data lives under {own}"
                if team
                else f"the job reads {own} (the datasets bucket)"
            )
            problems.append(f"SUITE={suite_path}: {key} = {value!r}: {where}")
            continue
        for suffix in suffixes:
            if _missing(s3, bucket, value.removeprefix(FSX_DATASETS) + suffix):
                problems.append(
                    f"SUITE={suite_path}: {key} = {value!r}: s3://{bucket}/{value.removeprefix(FSX_DATASETS)}{suffix} "
                    f"not found; upload the held-out data (make data STACK={outputs.stack}{upload_team} ... LOCAL=1)"
                )
    return problems


def pipeline(args: argparse.Namespace, outputs: StackOutputs, tag: str) -> Pipeline:
    """Every check that submits nothing: config, layout, run name, names, dataset and suite in the bucket."""
    record = args.record or args.suite.stem
    try:
        check_names(record, args.tag)
    except RecordError as error:
        raise SubmitError([str(error)]) from None
    if args.deploy and args.team:
        raise SubmitError(
            [
                f"DEPLOY=1 with TEAM={args.team}: the endpoint is the stack's, deployed by its platform operators "
                f"(make deploy STACK={outputs.stack} VERSION=...); leave DEPLOY out and hand them the version"
            ]
        )
    if problems := team_name_problems(outputs, args.team):
        raise SubmitError(problems)
    overrides = []
    if args.dataset:  # its tokens and the tokenizer they were made with; the user's --set still wins
        prefix = dataset_prefix(outputs, args.dataset, args.team)
        overrides += [f"data.prefixes=[{prefix}]", f"data.tokenizer_path={prefix}.tokenizer.json"]
    overrides += args.overrides
    train, cfg = plan(args.config, overrides, outputs, args.nodes, tag, args.run, args.team)
    # A team's tag events beside its runs (teams/<team>/model-tags/), where `models list --stack --team` reads them.
    tags_root = f"{CHECKPOINTS_DIR}/{team_root(args.team)}".rstrip("/")
    stage_args = ["--run", train.run_dir, "--suite", str(args.suite), "--record", record, "--tag", args.tag]
    stage_args += [
        "--tokenizer",
        cfg.data.tokenizer_path,
        "--dtype",
        args.dtype,
        "--tags-root",
        tags_root,
    ]
    stages = Submission(
        run=train.run + STAGES_SUFFIX,
        # On Batch the stack's multi-node definition with numNodes 1: allowed since its node range `0:` is open and
        # its main node is 0 (Batch API Reference, NodeOverrides numNodes); on EKS a JobSet of one pod.
        nodes=1,
        gpus_per_node=outputs.gpus_per_node,
        image=train.image,
        # The entrypoint runs `trainer launch <command>`: one process (evaluate and export run at TP=1, PP=1), and
        # no preflight (its all-reduce and EFA checks guard multi-node training, not one process reading /fsx).
        command=["--skip-preflight", "--nproc-per-node", "1", "finetune-stages", *stage_args],
        environment={"TRAINSTACK_RUN": train.run, IMAGE_TAG_ENV: tag},
        team=args.team,
    )
    if (
        problems := eks_problems(train, outputs)
        + eks_problems(stages, outputs)
        + suite_problems(args.suite, outputs, args.team)
    ):
        raise SubmitError(problems)
    return Pipeline(train.run, train, cfg, stages, record, args.tag, args.team)


def _epoch(stamp: str | None) -> float | None:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else None


def find_job(outputs: StackOutputs, name: str, team: str | None = None) -> ClusterJob | None:
    """The newest job named `name` of `team` (or of no team) in the stack's queue (Batch), or the JobSet of that
    name in the team's namespace (EKS); None if none."""
    if outputs.orchestrator == "eks":
        from trainer.jobs.eks import connect, jobset_status, status_reason

        for js in connect(outputs, team=team).jobsets():
            if js["metadata"]["name"] == name:
                # When it ended: its Completed or Failed condition's lastTransitionTime (required in status.conditions
                # of the pinned JobSet v0.12.0 CRD, ../shared/k8s-crds/).
                ended = [
                    c.get("lastTransitionTime")
                    for c in js.get("status", {}).get("conditions", [])
                    if c.get("type") in ("Completed", "Failed") and c.get("status") == "True"
                ]
                created = _epoch(js["metadata"].get("creationTimestamp")) or 0.0
                return ClusterJob(
                    name, jobset_status(js), created, _epoch(next(iter(ended), None)), status_reason(js)
                )
        return None
    ours = batch_run_jobs(outputs, name, team)
    return _batch_job(max(ours, key=lambda j: j["createdAt"])) if ours else None


def _batch_job(job: dict[str, Any]) -> ClusterJob:
    """A Batch job from ListJobs' summary or DescribeJobs' detail (the same keys: milliseconds since the epoch)."""
    stopped = job.get("stoppedAt")
    return ClusterJob(
        job["jobId"],
        job["status"],
        job["createdAt"] / 1000,
        stopped / 1000 if stopped else None,
        job.get("statusReason"),
    )


def job_by_id(outputs: StackOutputs, job_id: str, team: str | None = None) -> ClusterJob | None:
    """The job just submitted, by its id (DescribeJobs), or on EKS the JobSet of that name (in `team`'s
    namespace)."""
    if outputs.orchestrator == "eks":
        return find_job(outputs, job_id, team)
    found = aws("batch", outputs.region).describe_jobs(jobs=[job_id])["jobs"]
    return _batch_job(found[0]) if found else None


class RunBucket(S3Store):
    """The checkpoints bucket as `models --stack [--team]` reads it, its versions listed under the run's prefix
    only."""

    def __init__(self, outputs: StackOutputs, run: str, root: str = ""):
        super().__init__(
            aws("s3", outputs.region),
            aws("sts", outputs.region),
            outputs["checkpoints_bucket"],
            outputs["kms_key_arn"],
            root,
        )
        self.run = run

    def _keys(self, prefix: str = "") -> list[str]:
        return super()._keys(prefix or f"{self.run}/")


def stages_missing(outputs: StackOutputs, p: Pipeline, train: ClusterJob) -> tuple[str | None, list[str]]:
    """The run's newest model version in the bucket and what of the stages' outputs it lacks there; a version
    older than the training job is not its (its checkpoints have not reached the bucket yet)."""
    store = RunBucket(outputs, p.run, team_root(p.team))
    registry = Registry(store)
    if not registry.versions:
        return None, [f"any model version under s3://{store.bucket}/{p.path}/"]
    newest = registry.versions[-1]
    version, missing = newest.record.version, []
    # A record's time is whole seconds (checkpoint/version.py): compare the job's at that precision, or a record
    # written within the job's first second would predate it.
    if datetime.fromisoformat(newest.record.created).timestamp() < math.floor(train.created):
        missing.append(f"a model version from training job {train.id} (the newest, {version}, predates it)")
    if not any(e.get("name") == p.record for e in newest.evaluations):
        missing.append(f"evaluation {p.record!r}")
    if registry.tags().get(p.tag) != version:
        missing.append(f"tag {p.tag!r}")
    marker = f"{p.path}/{EXPORT}/{version}{EXPORT_MARKER_SUFFIX}"
    if _missing(store.s3, store.bucket, marker):
        missing.append(f"export marker s3://{store.bucket}/{marker}")
    else:
        files = json.loads(store.s3.get_object(Bucket=store.bucket, Key=marker)["Body"].read())["files"]
        prefix = f"{p.path}/{EXPORT}/{version}/"
        pages = store.s3.get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=prefix)
        there = {
            item["Key"].removeprefix(prefix): item["Size"]
            for page in pages
            for item in page.get("Contents", [])
        }
        if absent := [name for name, size in files.items() if there.get(name) != size]:
            missing.append(
                f"{len(absent)} of the export's {len(files)} files (e.g. s3://{store.bucket}/{prefix}{absent[0]})"
            )
    return version, missing


def _team(submission: Submission) -> str:
    return f" TEAM={submission.team}" if submission.team else ""


def _submitted_line(label: str, job_id: str, submission: Submission, outputs: StackOutputs) -> str:
    return (
        f"{label}: submitted (job {job_id}): {submission.nodes} x {outputs['instance_type']} ({submission.image}); "
        f"follow it: make logs STACK={outputs.stack}{_team(submission)} JOB={job_id} FOLLOW=1"
    )


def advance(
    label: str,
    submission: Submission,
    checks: Callable[[], list[str]],
    outputs: StackOutputs,
    args: argparse.Namespace,
    after: float | None = None,
) -> ClusterJob | None:
    """One stage's job: submitted when there is none (or none since `after`, or --retry and it failed), waited for
    with --wait; the job once it succeeded, None while it is not done (one line says so)."""
    job = find_job(outputs, submission.run, submission.team)
    stale = job is not None and job.status in TERMINAL and after is not None and job.created < after
    if job is None or stale or (job.status == "FAILED" and args.retry):
        if problems := checks():
            raise SubmitError(problems)
        if job is not None and outputs.orchestrator == "eks":  # a JobSet's name is unique in its namespace
            from trainer.jobs.eks import connect

            connect(outputs, team=submission.team).delete_jobset(submission.run)
        job_id = submit(submission, outputs)
        print(_submitted_line(label, job_id, submission, outputs))
        if not args.wait:
            return None
        job = ClusterJob(job_id, "SUBMITTED", time.time(), None, None)
    elif job.status in ACTIVE:
        print(f"{label}: {job.status.lower()} (job {job.id})")
    while job.status in ACTIVE:
        if not args.wait:
            return None
        time.sleep(args.poll_s)
        if (found := job_by_id(outputs, job.id, submission.team)) is None:
            raise FinetuneError(f"{label}: job {job.id} is gone from the stack; run again to submit it anew")
        job = found
    if job.status == "FAILED":
        raise FinetuneError(
            f"{label}: failed (job {job.id}{': ' + job.reason if job.reason else ''}); its log: make logs "
            f"STACK={outputs.stack}{_team(submission)} JOB={job.id}; once fixed, RETRY=1 submits it again (it resumes from the run's "
            "checkpoints)"
        )
    print(f"{label}: succeeded (job {job.id})")
    return job


def drive(p: Pipeline, outputs: StackOutputs, args: argparse.Namespace, tag: str) -> int:
    train = advance("train", p.train, lambda: aws_problems(p.train, p.cfg, outputs, tag), outputs, args)
    if train is None:
        return 0
    version, missing = stages_missing(outputs, p, train)
    bucket = outputs["checkpoints_bucket"]
    if version and not missing:
        print(
            f"stages: done ({version}: evaluated as {p.record!r}, tagged {p.tag!r}, exported to "
            f"s3://{bucket}/{p.path}/{EXPORT}/{version}/)"
        )
        return deliver_stage(p, outputs, args, version)

    def checks() -> list[str]:
        return residency_problems(outputs) + orchestrator_problems(outputs) + image_problems(outputs, tag)

    stages = advance("stages", p.stages, checks, outputs, args, after=train.stopped)
    if stages is None:
        return 0
    deadline = time.monotonic() + args.export_timeout_s
    while True:
        version, missing = stages_missing(outputs, p, train)
        if not missing:
            print(f"stages: done ({version}: in s3://{bucket}/{p.path}/)")
            return deliver_stage(p, outputs, args, version)
        if not args.wait or time.monotonic() > deadline:
            break
        time.sleep(args.poll_s)
    line = (
        f"stages: the bucket lacks {', '.join(missing)} yet: FSx exports /fsx/checkpoints to s3://{bucket} "
        "asynchronously"
    )
    if args.wait:
        print(
            f"{line}, and did not within {args.export_timeout_s:.0f} s: check the data repository association"
        )
        return 1
    print(f"{line}; run again to see it done")
    return 0


def deliver_stage(p: Pipeline, outputs: StackOutputs, args: argparse.Namespace, version: str | None) -> int:
    """Stage 4, only with --deploy: the gate, then `make deploy` of the new version to the stack's endpoint."""
    if not args.deploy or version is None:
        return 0
    from trainer.deploy.command import clients_for
    from trainer.deploy.endpoint import DeployError, Pool

    try:
        pool = Pool.from_outputs(outputs.stack, outputs.values)
    except DeployError as error:
        raise FinetuneError(f"deploy: {error}") from None
    store = S3Store(
        aws("s3", pool.region), aws("sts", pool.region), outputs["checkpoints_bucket"], pool.kms_key_arn
    )
    return deliver(args.suite, p.record, version, clients_for(pool.region), pool, store, args.poll_s)


def deliver(
    suite_path: Path,
    record: str,
    version: str,
    clients: Any,
    pool: Any,
    store: S3Store,
    poll_s: float,
    sleep: Callable[[float], None] | None = None,
) -> int:
    """The suite's gate between the new version's evaluation `record` and the live version's, then the deploy."""
    from trainer.deploy.command import deploy
    from trainer.deploy.endpoint import live as endpoint_now
    from trainer.deploy.gate import verdict

    gate = Suite.model_validate(yaml.safe_load(suite_path.read_text()) or {}).deploy
    if gate is None:
        print(f"deploy: skipped: {suite_path} has no deploy gate (docs/serving-stack.md#continuous-delivery)")
        return 0
    registry = Registry(store)
    now = endpoint_now(clients, pool)
    live = now.version if now is not None else None

    def evaluation(name: str) -> dict[str, Any] | None:
        return next((e for e in registry.find(name).evaluations if e.get("name") == record), None)

    if live == version:
        print(f"deploy: {version} is live on {pool.endpoint} already")
        return 0
    opens, why = verdict(gate, evaluation(version) or {}, evaluation(live) if live else None)
    if not opens:
        print(f"deploy: held back: {version} does not beat {live} by the margin: {why}")
        return 0
    print(f"deploy: {version} passes the gate ({why})")
    return deploy(clients, pool, registry, version, False, store.caller, poll_s, sleep)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True, help="the stack to run on (dev, staging, prod, eks-dev)")
    parser.add_argument("--outputs", help="a JSON file of stack outputs instead of `pulumi stack output`")
    parser.add_argument(
        "--team", help="on a stack shared by teams: the team whose share, quota, data and prefix the jobs use"
    )
    parser.add_argument("--dataset", help="a prepared chat dataset's name in the stack's datasets bucket")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help=f"default {DEFAULT_CONFIG}")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--suite", type=Path, default=DEFAULT_SUITE, help=f"default {DEFAULT_SUITE}")
    parser.add_argument("--record", help="the evaluation's name (default: the suite file's name)")
    parser.add_argument(
        "--tag", default=DEFAULT_TAG, help=f"the tag the evaluated version gets (default {DEFAULT_TAG})"
    )
    parser.add_argument("--dtype", choices=DTYPES, default="bf16", help="the export's dtype (default bf16)")
    parser.add_argument("--run", help="run name: /fsx/checkpoints/<run> (default: the config's name)")
    parser.add_argument(
        "--nodes", type=int, help="nodes for the training job (default: the stack's node count)"
    )
    parser.add_argument("--image", help="image tag in the stack's ECR repository (default: this git commit)")
    parser.add_argument("--wait", action="store_true", help="wait for each job instead of returning at once")
    parser.add_argument("--retry", action="store_true", help="submit a failed stage's job again")
    parser.add_argument(
        "--deploy",
        action="store_true",
        help="last, deploy the new version to the stack's endpoint when it passes the suite's deploy gate",
    )
    parser.add_argument("--poll-s", type=float, default=60.0, help="seconds between looks with --wait")
    parser.add_argument(
        "--export-timeout-s", type=float, default=1800.0, help="with --wait: how long the bucket may lag FSx"
    )


def main(args: argparse.Namespace) -> int:
    try:
        outputs = load_outputs(args.stack, args.outputs)
        tag = image_tag(args.image)
        return drive(pipeline(args, outputs, tag), outputs, args, tag)
    except (StackError, SubmitError, RenderError) as error:
        print(f"finetune: {error}", file=sys.stderr)
        return 2
    # A job that failed, or the EKS API server refused or could not be reached (trainer/jobs/eks.py).
    except RuntimeError as error:
        print(f"finetune: {error}", file=sys.stderr)
        return 1
