"""`python -m trainer submit --stack <env>`: run the trainer as an AWS Batch multi-node parallel job.

Everything is checked before anything is submitted: the config's parallel layout against the node count and the
GPUs per node (tensor parallelism stays inside a node's NVLink domain), the image tag in the stack's ECR
repository, the job queue enabled, and the datasets present in the bucket behind /fsx/datasets. Checkpoints go to
/fsx/checkpoints/<run> (a team's to /fsx/checkpoints/teams/<team>/<run>, and its data must be under its own
/fsx/datasets/teams/<team>/: trainer/contract/teams.py), so submitting the same run again resumes it.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from trainer.aws.clients import batch_job_url, client, log_group_url
from trainer.aws.outputs import StackError, StackOutputs, load_outputs
from trainer.config import ConfigError, TrainConfig, auto_keys, layout_problems, load_config
from trainer.contract.catalog import instance_type
from trainer.contract.container import (
    CHECKPOINTS_DIR,
    DATASETS_DIR,
    DEFAULT_CONFIG,
    IMAGE_DIGEST_ENV,
    IMAGE_TAG_ENV,
    SUBMITTED_AT_ENV,
    runnable_definition_name,
)
from trainer.contract.teams import run_path, team_prefix
from trainer.jobs.job import LIVE, run_jobs, stop_and_wait
from trainer.jobs.jobset import RenderError, jobset_name_problems
from trainer.jobs.request import Submission, batch_job_request, job_settings, jobset_for
from trainer.jobs.residency import residency_problems
from trainer.jobs.teams import job_namespace, team_problems
from trainer.plan.command import plan_for
from trainer.plan.performance import Assumptions

ROOT = Path(__file__).resolve().parents[2]
FSX_DATASETS = DATASETS_DIR + "/"
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")


class SubmitError(RuntimeError):
    """A reason not to submit; one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("not submitted:\n" + "\n".join(f"  - {p}" for p in problems))


def git_commit() -> str | None:
    result = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return result.stdout.strip() or None


def plan(
    config_path: Path,
    overrides: list[str],
    outputs: StackOutputs,
    nodes: int | None,
    tag: str,
    run: str | None,
    team: str | None = None,
) -> tuple[Submission, TrainConfig]:
    """The job to submit (for `team`, under its prefixes), with every check that needs no AWS call."""
    problems: list[str] = []
    config_path = config_path.resolve()
    if not config_path.is_relative_to(ROOT / "trainer"):
        problems.append(
            f"CONFIG={config_path}: the image carries trainer/ only; put the config under trainer/configs/ "
            "and rebuild the image (make image && make push)"
        )
    nodes = outputs.node_count if nodes is None else nodes
    refused_nodes = node_problems(outputs, nodes)
    nodes_valid = not refused_nodes
    problems += refused_nodes
    planned_layout = None
    try:
        if nodes_valid:
            overrides, planned_layout = _plan_auto_layout(config_path, overrides, outputs, nodes)
        cfg = load_config(config_path, overrides, device="cuda")
    except ConfigError as error:
        raise SubmitError(problems + error.problems) from None
    run = run or cfg.name
    if not RUN_NAME.match(run):
        problems.append(
            f"RUN={run!r}: use letters, digits, '-' and '_' (at most 100, starting with a letter or digit)"
        )
    gpus = outputs.gpus_per_node
    tp = cfg.parallel.tensor_model_parallel_size
    if gpus % tp:
        problems.append(
            f"parallel.tensor_model_parallel_size = {tp} does not divide the {gpus} GPUs of a "
            f"{outputs['instance_type']} node: tensor parallelism must stay inside one node's NVLink domain"
        )
    problems += [f"{p} ({nodes} nodes x {gpus} GPUs)" for p in layout_problems(cfg, nodes * gpus, "cuda")]
    refused = team_problems(outputs, team, nodes) if nodes_valid else []
    problems += refused or team_data_problems(cfg, team, outputs)
    if problems:
        raise SubmitError(problems)
    relative_config = str(config_path.relative_to(ROOT))
    run_dir = f"{CHECKPOINTS_DIR}/{run_path(run, team)}"
    command = ["train", "--config", relative_config, "--set", f"logging.run_dir={run_dir}"]
    for override in overrides:
        command += ["--set", override]
    submission = Submission(
        run=run,
        nodes=nodes,
        gpus_per_node=gpus,
        image=f"{outputs['ecr_repository_url']}:{tag}",
        command=command,
        environment={
            "TRAINSTACK_RUN": run,
            "TRAINSTACK_CONFIG": relative_config,
            IMAGE_TAG_ENV: tag,
        },
        planned_layout=planned_layout,
        team=team,
    )
    return submission, cfg


def node_problems(outputs: StackOutputs, nodes: int) -> list[str]:
    """NODES= within the stack's node count."""
    if 1 <= nodes <= outputs.node_count:
        return []
    return [
        f"NODES={nodes}: stack {outputs.stack!r} allows 1 to {outputs.node_count} nodes of "
        f"{outputs['instance_type']} (its compute environment's maxvCpus); raise trainstack:nodeCount to go further"
    ]


def data_paths(cfg: TrainConfig) -> list[tuple[str, str]]:
    """The config's data on the cluster: (key, path) for each dataset prefix and the tokenizer."""
    paths = [(f"data.prefixes[{i}]", p) for i, p in enumerate(cfg.data.prefixes)]
    return [*paths, ("data.tokenizer_path", cfg.data.tokenizer_path)]


def team_data_problems(cfg: TrainConfig, team: str | None, outputs: StackOutputs) -> list[str]:
    """A team's job reads its data from its own prefix, the only one its role may check (infra/teams.py)."""
    if not team:
        return []
    own = f"{FSX_DATASETS}{team_prefix(team)}"
    return [
        f"{key} = {path!r}: team {team}'s data lives under {own} (s3://{outputs['datasets_bucket']}/"
        f"{team_prefix(team)}); upload it with make data STACK={outputs.stack} TEAM={team} SRC=... LOCAL=1"
        for key, path in data_paths(cfg)
        if not path.startswith(own)
    ]


def _plan_auto_layout(
    config_path: Path, overrides: list[str], outputs: StackOutputs, nodes: int
) -> tuple[list[str], str | None]:
    """Overrides with the planner's choice for the keys the config leaves `auto` (docs/plan.md)."""
    planned = auto_keys(config_path, overrides)
    if not planned:
        return overrides, None
    instance = instance_type(outputs["instance_type"])
    chosen = plan_for(config_path, overrides, instance, nodes, Assumptions()).chosen
    if chosen is None:
        raise SubmitError(
            [
                f"{', '.join(planned)} = auto: no layout fits {nodes} x {instance.name}; see "
                f"python -m trainer plan --config {config_path} --instance {instance.name} "
                f"--nodes {nodes}"
            ]
        )
    kept = [override for override in overrides if override.partition("=")[0] not in planned]
    summary = (
        f"{chosen.describe()}: {chosen.memory.total / 2**30:.1f} GiB per GPU, "
        f"{chosen.step.tokens_per_s:,.0f} tokens/s estimated"
    )
    return kept + chosen.overrides(planned), summary


def config_changed_since(tag: str, config_path: Path) -> bool:
    """Whether the config differs from the one baked into the image (tags are commits; other tags: unknown)."""
    result = subprocess.run(
        ["git", "diff", "--quiet", tag, "--", str(config_path)], cwd=ROOT, capture_output=True, check=False
    )
    return result.returncode == 1


def aws_problems(submission: Submission, cfg: TrainConfig, outputs: StackOutputs, tag: str) -> list[str]:
    """Checks against the stack's AWS resources: data residency, queue (Batch) or cluster (EKS) state, image in
    ECR, datasets in S3."""
    return (
        residency_problems(outputs)
        + orchestrator_problems(outputs)
        + image_problems(outputs, tag)
        + dataset_problems(cfg, outputs)
    )


def orchestrator_problems(outputs: StackOutputs) -> list[str]:
    if outputs.orchestrator == "eks":
        from trainer.jobs.eks import cluster_problems

        return cluster_problems(outputs)
    return queue_problems(outputs)


def queue_problems(outputs: StackOutputs) -> list[str]:
    batch = client("batch", outputs.region)
    queues = batch.describe_job_queues(jobQueues=[outputs["job_queue"]])["jobQueues"]
    if not queues:
        return [f"job queue {outputs['job_queue']!r} does not exist in {outputs.region}; run make up"]
    if queues[0]["state"] != "ENABLED" or queues[0].get("status") not in (None, "VALID"):
        return [
            f"job queue {outputs['job_queue']!r} is {queues[0]['state']} ({queues[0].get('status')}): "
            f"enable it (aws batch update-job-queue --job-queue {outputs['job_queue']} --state ENABLED)"
        ]
    return []


def image_digest(outputs: StackOutputs, tag: str) -> str | None:
    """The digest of the image tagged `tag` in the stack's repository (ECR DescribeImages,
    imageDetails[].imageDigest); None when no image has that tag."""
    ecr = client("ecr", outputs.region)
    try:
        details = ecr.describe_images(
            repositoryName=outputs.ecr_repository_name, imageIds=[{"imageTag": tag}]
        )
    except ClientError as error:
        if error.response["Error"]["Code"] != "ImageNotFoundException":
            raise
        return None
    return next((d.get("imageDigest") for d in details["imageDetails"]), None)


def image_problems(outputs: StackOutputs, tag: str) -> list[str]:
    if image_digest(outputs, tag) is None:
        return [
            f"IMAGE={tag}: no such tag in {outputs['ecr_repository_url']}; "
            f"build and push it: make image && make push STACK={outputs.stack}"
        ]
    return []


def dataset_problems(cfg: TrainConfig, outputs: StackOutputs) -> list[str]:
    problems = []
    s3 = client("s3", outputs.region)
    bucket = outputs["datasets_bucket"]
    for key, path in data_paths(cfg):
        suffixes = ("",) if key == "data.tokenizer_path" else (".bin", ".idx")
        if not path.startswith(FSX_DATASETS):
            problems.append(
                f"{key} = {path!r}: the cluster reads data from {FSX_DATASETS} (FSx linked to s3://{bucket}); "
                f"upload with make data STACK={outputs.stack} SRC=... and use the path it prints"
            )
            continue
        for suffix in suffixes:
            object_key = path.removeprefix(FSX_DATASETS) + suffix
            try:
                s3.head_object(Bucket=bucket, Key=object_key)
            except ClientError as error:
                if error.response["Error"]["Code"] not in ("404", "NoSuchKey", "NotFound"):
                    raise
                problems.append(
                    f"{key} = {path!r}: s3://{bucket}/{object_key} not found; upload it with "
                    f"make data STACK={outputs.stack} SRC=..."
                )
    return problems


# Every job definition a stack exports (trainer/contract/outputs.py): the multi-node one, the Spot queue's single-node
# one when `trainstack:spot` is on, and the data queue's. Each names a placeholder image (infra/cluster.py,
# infra/data_prep.py), so each gets a revision with the pushed tag: the registry's tags are immutable and nothing
# else ever points them at a new image (tests/jobs/test_push.py checks every stack's definitions are listed here).
JOB_DEFINITION_OUTPUTS = ("job_definition", "spot_job_definition", "data_job_definition")


def job_definition_for(image: str, outputs: StackOutputs, output: str = "job_definition") -> str:
    """The stack's job definition `output` with `image`: itself, an earlier revision that differs from it only by
    that image, or a new revision, under the name runnable_definition_name gives (`<x>-run` for the stack's
    `<x>-template`). Multi-node definitions get it on every node range (Batch cannot override a
    multi-node job's image at submission), single-node container definitions in their container properties."""
    batch = client("batch", outputs.region)
    described = batch.describe_job_definitions(jobDefinitions=[outputs[output]])["jobDefinitions"]
    if not described:
        raise SubmitError([f"job definition {outputs[output]!r} ({output}) is missing"])
    definition = described[0]
    if "nodeProperties" in definition:
        kind, field = "multinode", "nodeProperties"
        wanted = copy.deepcopy(definition[field])
        for node_range in wanted["nodeRangeProperties"]:
            node_range["container"]["image"] = image
    elif "containerProperties" in definition:
        kind, field = "container", "containerProperties"
        wanted = {**copy.deepcopy(definition[field]), "image": image}
    else:
        raise SubmitError(
            [f"job definition {outputs[output]!r} ({output}) has neither node nor container properties"]
        )
    # A template's revisions run as <name>-run (trainer/contract/container.py).
    name = runnable_definition_name(definition["jobDefinitionName"])
    pages = batch.get_paginator("describe_job_definitions").paginate(jobDefinitionName=name, status="ACTIVE")
    for revision in (d for page in pages for d in page["jobDefinitions"]):
        if revision.get(field) == wanted and _settings(revision) == _settings(definition):
            return revision["jobDefinitionArn"]
    registered = batch.register_job_definition(
        jobDefinitionName=name,
        type=kind,
        **{field: wanted},
        **_settings(definition),
    )
    return registered["jobDefinitionArn"]


# Everything else RegisterJobDefinition takes that DescribeJobDefinitions returns (botocore 1.44.8 batch model:
# RegisterJobDefinitionRequest and JobDefinition members), apart from the name, the type and the properties: a
# revision is reused only when all of them equal the stack's own, so one registered by someone else with another
# timeout, retry strategy or parameters is never picked up (issue 46 item 9).
CARRIED_SETTINGS = (
    "parameters",
    "retryStrategy",
    "timeout",
    "tags",
    "propagateTags",
    "platformCapabilities",
    "schedulingPriority",
    "consumableResourceProperties",
    "ecsProperties",
    "eksProperties",
)


def _settings(definition: dict[str, Any]) -> dict[str, Any]:
    """A definition's carried settings, an empty value the same as an absent one (Batch returns `{}` for none)."""
    return {k: definition[k] for k in CARRIED_SETTINGS if definition.get(k) not in (None, {}, [])}


def job_definitions_for(image: str, outputs: StackOutputs) -> dict[str, str]:
    """A revision with `image` of every job definition the stack exports: {output name: revision ARN}."""
    return {
        output: job_definition_for(image, outputs, output)
        for output in JOB_DEFINITION_OUTPUTS
        if output in outputs.values
    }


def submit(submission: Submission, outputs: StackOutputs) -> str:
    """Submit to the stack's orchestrator; the job's id (Batch) or the JobSet's name (EKS)."""
    # What only this moment knows (contract SUBMISSION_ENV): the image's digest, for the model version records
    # (trainer/checkpoint/version.py), and the clock, where the ledger's queue wait starts (trainer/cost/ledger.py).
    digest = image_digest(outputs, submission.image.rsplit(":", 1)[1])
    now = {**({IMAGE_DIGEST_ENV: digest} if digest else {}), SUBMITTED_AT_ENV: f"{time.time():.3f}"}
    submission = dataclasses.replace(submission, environment={**submission.environment, **now})
    if outputs.orchestrator == "eks":
        manifest = jobset_for(submission, outputs, job_settings(outputs.stack))
        return submit_jobset(manifest, outputs, submission.team)
    request = batch_job_request(submission, outputs, job_definition_for(submission.image, outputs))
    return client("batch", outputs.region).submit_job(**request)["jobId"]


def submit_jobset(manifest: dict[str, Any], outputs: StackOutputs, team: str | None = None) -> str:
    """Create exactly `manifest` (what `make render` prints) in the stack's namespace, or `team`'s."""
    from trainer.jobs.eks import connect  # the kubernetes client only for EKS stacks

    created = connect(outputs, team=team).create_jobset(manifest)
    return str(created["metadata"]["name"])


def eks_problems(submission: Submission, outputs: StackOutputs) -> list[str]:
    """What only an EKS stack refuses: a run name that is no DNS label (TEAM= is checked as on Batch: plan)."""
    if outputs.orchestrator != "eks":
        return []
    return jobset_name_problems(submission.run, submission.nodes)


def print_jobset_submitted(submission: Submission, outputs: StackOutputs, name: str) -> None:
    """The same lines as for a Batch job, with the JobSet's name as the job id."""
    print(
        f"submitted run {submission.run!r}: {submission.nodes} x {outputs['instance_type']} ({submission.image})"
    )
    if submission.planned_layout:
        print(f"  layout:     {submission.planned_layout} (planned: docs/plan.md)")
    print(f"  job id:     {name}")
    print(f"  checkpoints {submission.run_dir}  (s3://{outputs['checkpoints_bucket']}/{submission.run_key})")
    namespace = job_namespace(outputs, submission.team)
    team = f" TEAM={submission.team}" if submission.team else ""
    print(f"  logs:       pod {name}-node-0-0 in namespace {namespace}, once Kueue admits the JobSet")
    print(f"  cluster:    {outputs['eks_cluster_name']} (queue {outputs['kueue_local_queue']})")
    print(f"follow it:    make logs STACK={outputs.stack}{team} JOB={name} FOLLOW=1")


# One job per run (issue 40): how often --replace looks whether the old job has ended, and how long beyond the
# trainer's stop grace it waits (Batch stops a container with SIGTERM, then SIGKILL; EKS after the pods' grace).
REPLACE_POLL_S = 5.0
REPLACE_SLACK_S = 120.0


def make_way(submission: Submission, outputs: StackOutputs, *, replace: bool, dry_run: bool) -> None:
    """A run's jobs all write its run directory, so one at a time: refuse while a job of this run is queued or
    running; with --replace stop it first and wait until it has ended (its run lock goes with its processes)."""
    jobs = run_jobs(outputs, submission.run, submission.team)
    live = [(job, status) for job, status in jobs if status in LIVE]
    stack, run = outputs.stack, submission.run
    team = f" TEAM={submission.team}" if submission.team else ""
    if live and not replace:
        raise SubmitError(
            [
                f"RUN={run}: job {job} of this run is {status} on stack {stack}, and would share "
                f"{submission.run_dir} with this one. Wait for it (make status STACK={stack}{team} JOB={job}), "
                f"stop it (make cancel STACK={stack}{team} JOB={job}), or replace it: make train STACK={stack}"
                f"{team} RUN={run} REPLACE=1 (stops it, then submits)"
                for job, status in live
            ]
        )
    # On EKS a JobSet's name stays taken after it ends: replacing deletes an ended one too.
    old = jobs if outputs.orchestrator == "eks" else live
    if not (replace and old):
        return
    if dry_run:
        print(f"would stop {', '.join(f'{job} ({status})' for job, status in old)} first")
        return
    grace = job_settings(stack).stop_grace_seconds + REPLACE_SLACK_S
    print(f"replacing run {run!r}: stopping {', '.join(f'{job} ({status})' for job, status in old)}")
    reason = f"replaced by a new submission of run {run} (make train REPLACE=1)"
    if left := stop_and_wait(outputs, old, reason, grace, REPLACE_POLL_S, submission.team):
        raise SubmitError(
            [
                f"RUN={run}: job {job} is still {status} {grace:g} s after it was told to stop; submit again once "
                f"it has ended (make status STACK={stack} JOB={job})"
                for job, status in left
            ]
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True, help="the stack to run on (dev, staging, prod)")
    parser.add_argument("--outputs", help="a JSON file of stack outputs instead of `pulumi stack output`")
    parser.add_argument("--config", type=Path, default=Path(DEFAULT_CONFIG))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--nodes", type=int, help="nodes for this job (default: the stack's node count)")
    parser.add_argument("--image", help="image tag in the stack's ECR repository (default: this git commit)")
    parser.add_argument(
        "--run", help="run name: checkpoints under /fsx/checkpoints/<run> (default: config name)"
    )
    parser.add_argument(
        "--team", help="on a stack shared by teams: the team whose share and quota the job uses"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="check everything and print the job; submit nothing"
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="a job of this run is queued or running: stop it, wait until it has ended, then submit (REPLACE=1)",
    )


def image_tag(image: str | None) -> str:
    """The image tag a submission runs: IMAGE= where given, else this checkout's commit."""
    tag = image or git_commit()
    if not tag:
        raise SubmitError(["IMAGE is not given and this is not a git checkout; give IMAGE=<tag>"])
    return tag


def main(args: argparse.Namespace) -> int:
    try:
        outputs = load_outputs(args.stack, args.outputs)
        tag = image_tag(args.image)
        submission, cfg = plan(args.config, args.overrides, outputs, args.nodes, tag, args.run, args.team)
        if problems := eks_problems(submission, outputs):
            raise SubmitError(problems)
        if problems := aws_problems(submission, cfg, outputs, tag):
            raise SubmitError(problems)
        if config_changed_since(tag, args.config):
            print(
                f"note: {args.config} differs from the image's copy (commit {tag}); the job uses the image's"
            )
        make_way(submission, outputs, replace=args.replace, dry_run=args.dry_run)
        if args.dry_run:
            print(f"would submit {submission}")
            return 0
        if outputs.orchestrator == "eks":
            jobset_for(
                submission, outputs, job_settings(outputs.stack)
            )  # a bad run name fails before the token
        job_id = submit(submission, outputs)
    except (StackError, SubmitError, RenderError) as error:
        print(f"submit: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # the API server refused or could not be reached (trainer/jobs/eks.py)
        print(f"submit: {error}", file=sys.stderr)
        return 1
    region, group = outputs.region, outputs["log_group"]
    if outputs.orchestrator == "eks":
        print_jobset_submitted(submission, outputs, job_id)
        return 0
    print(
        f"submitted run {submission.run!r}: {submission.nodes} x {outputs['instance_type']} ({submission.image})"
    )
    if submission.planned_layout:
        print(f"  layout:     {submission.planned_layout} (planned: docs/plan.md)")
    print(f"  job id:     {job_id}")
    print(f"  checkpoints {submission.run_dir}  (s3://{outputs['checkpoints_bucket']}/{submission.run_key})")
    print(f"  logs:       log group {group}, main node stream appears when it starts")
    print(f"  console:    {batch_job_url(region, job_id)}")
    print(f"  log group:  {log_group_url(region, group)}")
    print(f"follow it:    make logs STACK={outputs.stack} JOB={job_id} FOLLOW=1")
    return 0
