"""`make data STACK=<env> SRC=s3://...`: data preparation on the stack's CPU queue, near the data.

    python -m trainer data submit --stack ENV --src s3://bucket/prefix/ (or a local path) --tokenizer FILE [--name N]
    python -m trainer data shard --plan s3://...      (a Batch array child: its shard from AWS_BATCH_JOB_ARRAY_INDEX)
    python -m trainer data publish --plan s3://...    (the dependent merge job)
    python -m trainer data cost --stack ENV --job ID...   (vCPU-hours of finished data jobs)

`submit` lists the source objects (a local path is uploaded first, to `<name>/.sources/` in the datasets bucket),
names a dataset version after their keys, sizes and ETags and the options (the same inputs, the same version),
and does nothing when that version is already published. Otherwise it writes the plan (objects, shards: runs of
the sorted keys of about `--shard-mb` each, the order a local `prepare` of the same files reads them) and the
tokenizer under `<name>/.staging/<version>/`, then submits `data shard` as an array job (Batch sets
AWS_BATCH_JOB_ARRAY_INDEX, from 0, in each child: Batch user guide, "AWS Batch job environment variables"; array
sizes run from 2 to 10,000: "Array jobs"), and `data publish` depending on the array job, which Batch starts only
after every child succeeded (Batch user guide, "Job dependencies"). Each child runs `prepare` on its shard with
`--max-reject-rate 1`; publish merges the shards (trainer/data/merge.py), applies the corpus's reject rate and
uploads `<name>/<version>/<name>.{bin,idx,tokenizer.json,digests}`, then the manifest, then `<name>/latest.json`:
a version is complete once its manifest exists, and a new version never touches an older one.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict

from trainer.aws.clients import client
from trainer.aws.outputs import StackError, StackOutputs, load_outputs
from trainer.contract.container import ARRAY_INDEX_ENV
from trainer.data import DataError
from trainer.data.manifest import DatasetFiles
from trainer.data.sources import DEFAULT_GLOBS
from trainer.data.tokenizer import file_sha256
from trainer.data.validate import DEFAULT_MAX_REJECT_RATE, ValidationLimits, check_limits
from trainer.jobs.submit import FSX_DATASETS, SubmitError, image_problems, image_tag, job_definition_for
from trainer.jobs.teams import team_tags
from trainer.jobs.upload import TRANSFER

# Batch user guide, "Array jobs": an array job has 2 to 10,000 children.
MAX_ARRAY_SIZE = 10_000
DEFAULT_SHARD_MB = 256
STAGING = ".staging"
SOURCES = ".sources"
ARRAY_INDEX = ARRAY_INDEX_ENV


class DataJobError(RuntimeError):
    """A data job that cannot be submitted or run: what is wrong and what to change."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceObject(_Strict):
    key: str
    size: int
    etag: str


class DataPlan(_Strict):
    """Everything the array children and the merge job need, written once by `submit`."""

    name: str
    version: str
    source_bucket: str
    source_prefix: str
    objects: list[SourceObject]
    shards: list[tuple[int, int]]  # [start, end) into objects
    datasets_bucket: str
    kms_key_arn: str
    tokenizer_sha256: str
    text_key: str
    limits: ValidationLimits

    @property
    def staging(self) -> str:
        return f"{self.name}/{STAGING}/{self.version}"

    @property
    def published_prefix(self) -> str:
        return f"{self.name}/{self.version}/{self.name}"

    def shard_prefix(self, index: int) -> str:
        return f"shard-{index:05d}"


def parse_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://") or len(uri) <= len("s3://"):
        raise DataJobError(f"--src {uri!r}: expected s3://bucket/prefix or a local file or directory")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    return bucket, prefix


def list_sources(s3, bucket: str, prefix: str, globs: Sequence[str]) -> list[SourceObject]:
    """The objects under the prefix whose names match `globs`, in the order a local `prepare` of the same files
    reads them (sorted path by path), hidden path parts skipped as locally."""
    found = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            relative = PurePosixPath(
                item["Key"][len(prefix) :].lstrip("/") or PurePosixPath(item["Key"]).name
            )
            if any(part.startswith(".") for part in relative.parts):
                continue
            if item["Key"] == prefix or any(fnmatch.fnmatch(relative.name, g) for g in globs):
                found.append(SourceObject(key=item["Key"], size=item["Size"], etag=item["ETag"].strip('"')))
    return sorted(found, key=lambda o: PurePosixPath(o.key).parts)


def plan_shards(objects: Sequence[SourceObject], shard_bytes: int) -> list[tuple[int, int]]:
    """Contiguous runs of objects of about `shard_bytes` each (an object larger than that is a shard alone), at
    most MAX_ARRAY_SIZE of them."""
    total = sum(o.size for o in objects)
    count = max(1, min(len(objects), MAX_ARRAY_SIZE, -(-total // max(shard_bytes, 1))))
    shards: list[tuple[int, int]] = []
    start = size = 0
    target = total / count
    for index, item in enumerate(objects):
        size += item.size
        if size >= target * (len(shards) + 1) and len(shards) < count - 1 and index + 1 < len(objects):
            shards.append((start, index + 1))
            start = index + 1
    shards.append((start, len(objects)))
    return shards


def dataset_version(
    objects: Sequence[SourceObject], tokenizer_sha256: str, text_key: str, limits: ValidationLimits
) -> str:
    """12 hex digits naming what decides the dataset's bytes: the same inputs and options, the same version."""
    record = {
        "objects": [o.model_dump() for o in objects],
        "tokenizer": tokenizer_sha256,
        "text_key": text_key,
        "limits": limits.model_dump(),
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class DataSubmission:
    plan: DataPlan
    published: bool  # the version existed already: nothing was submitted
    array_job_id: str | None = None
    merge_job_id: str | None = None
    vcpus_per_job: int | None = None

    def summary(self) -> str:
        p = self.plan
        where = f"s3://{p.datasets_bucket}/{p.published_prefix}"
        if self.published:
            return f"{where}: already published (version {p.version}); nothing to do"
        kind = "array job" if len(p.shards) > 1 else "job"
        return (
            f"submitted {len(p.shards)} shard(s) of {len(p.objects)} object(s) as {kind} {self.array_job_id}, then "
            f"merge job {self.merge_job_id}; it publishes {where}.* (on the cluster: "
            f"--set data.prefixes=[{FSX_DATASETS}{p.published_prefix}]); each job has {self.vcpus_per_job} vCPUs, "
            f"`python -m trainer data cost --job {self.array_job_id} --job {self.merge_job_id}` gives their "
            f"vCPU-hours when they end"
        )


def _exists(s3, bucket: str, key: str) -> bool:
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except s3.exceptions.ClientError as error:
        if error.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return True


def _encryption(outputs_or_plan_key: str) -> dict[str, str]:
    return {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": outputs_or_plan_key}


def upload_sources(s3, outputs: StackOutputs, src: Path, name: str, globs: Sequence[str]) -> str:
    """A local corpus, copied to the datasets bucket under <name>/.sources/ (relative paths kept); its s3:// URI."""
    from trainer.data.sources import find_input_files

    files = find_input_files([str(src)], globs)
    base = src if src.is_dir() else src.parent
    bucket = outputs["datasets_bucket"]
    for path in files:
        key = f"{name}/{SOURCES}/{path.relative_to(base.resolve()).as_posix()}"
        s3.upload_file(str(path), bucket, key, ExtraArgs=_encryption(outputs["kms_key_arn"]), Config=TRANSFER)
    return f"s3://{bucket}/{name}/{SOURCES}/"


def submit_data(
    outputs: StackOutputs,
    src: str,
    name: str,
    tokenizer: Path,
    *,
    tag: str,
    text_key: str = "text",
    globs: Sequence[str] = DEFAULT_GLOBS,
    limits: ValidationLimits | None = None,
    shard_bytes: int = DEFAULT_SHARD_MB << 20,
) -> DataSubmission:
    """Everything `data submit` does, its jobs running the image `tag` of the stack's repository; every check runs
    before anything is uploaded or submitted."""
    limits = limits or ValidationLimits()
    for needed in ("data_job_queue", "data_job_definition"):
        if needed not in outputs.values:
            raise DataJobError(
                f"stack {outputs.stack!r} has no {needed} output: `pulumi up` it with this version "
                f"(infra/data_prep.py adds the CPU queue), or prepare locally without STACK"
            )
    if not tokenizer.is_file():
        raise DataJobError(
            f"--tokenizer {str(tokenizer)!r} is not a file: every shard must use one tokenizer.json (a BPE trained "
            f"per shard would differ); e.g. prepare a sample locally and pass its PREFIX.tokenizer.json"
        )
    if shard_bytes < 1:
        raise DataJobError(f"--shard-mb {shard_bytes / 2**20:g}: must be positive")
    if problems := image_problems(outputs, tag):
        raise DataJobError("; ".join(problems))
    s3, batch = client("s3", outputs.region), client("batch", outputs.region)
    if not src.startswith("s3://"):
        local = Path(src)
        if not local.exists():
            raise DataJobError(
                f"--src {src!r} does not exist: give s3://bucket/prefix or a local file or directory"
            )
        src = upload_sources(s3, outputs, local, name, globs)
    bucket, prefix = parse_s3_uri(src)
    objects = list_sources(s3, bucket, prefix, globs)
    if not objects:
        raise DataJobError(f"--src {src!r} holds no objects matching {', '.join(globs)}")
    tokenizer_sha256 = file_sha256(tokenizer)
    version = dataset_version(objects, tokenizer_sha256, text_key, limits)
    plan = DataPlan(
        name=name,
        version=version,
        source_bucket=bucket,
        source_prefix=prefix,
        objects=objects,
        shards=plan_shards(objects, shard_bytes),
        datasets_bucket=outputs["datasets_bucket"],
        kms_key_arn=outputs["kms_key_arn"],
        tokenizer_sha256=tokenizer_sha256,
        text_key=text_key,
        limits=limits,
    )
    datasets = plan.datasets_bucket
    if _exists(s3, datasets, f"{plan.published_prefix}.manifest.json"):
        return DataSubmission(plan, published=True)
    encryption = _encryption(plan.kms_key_arn)
    s3.upload_file(str(tokenizer), datasets, f"{plan.staging}/tokenizer.json", ExtraArgs=encryption)
    plan_key = f"{plan.staging}/plan.json"
    s3.put_object(Bucket=datasets, Key=plan_key, Body=plan.model_dump_json().encode(), **encryption)
    plan_uri = f"s3://{datasets}/{plan_key}"
    # The stack's definition names `:latest`, which its IMMUTABLE repository never receives (ECR User Guide, "Image
    # tag mutability"), and a container job cannot override its image at submission: submit to the revision that
    # names the pushed tag, as `make train` does (trainer/jobs/submit.py job_definition_for).
    queue = outputs["data_job_queue"]
    definition = job_definition_for(f"{outputs['ecr_repository_url']}:{tag}", outputs, "data_job_definition")
    array = {"arrayProperties": {"size": len(plan.shards)}} if len(plan.shards) > 1 else {}
    shards = batch.submit_job(
        jobName=f"data-{name}-{version}-shards",
        jobQueue=queue,
        jobDefinition=definition,
        containerOverrides={"command": ["data", "shard", "--plan", plan_uri, "--region", outputs.region]},
        tags={"dataset": name, "version": version, **team_tags(None)},  # the stack's, no team's
        **array,
    )["jobId"]
    merge = batch.submit_job(
        jobName=f"data-{name}-{version}-merge",
        jobQueue=queue,
        jobDefinition=definition,
        dependsOn=[{"jobId": shards}],
        containerOverrides={"command": ["data", "publish", "--plan", plan_uri, "--region", outputs.region]},
        tags={"dataset": name, "version": version, **team_tags(None)},  # the stack's, no team's
    )["jobId"]
    vcpus = _definition_vcpus(batch, definition)
    return DataSubmission(plan, False, shards, merge, vcpus)


def _definition_vcpus(batch, definition: str) -> int | None:
    found = batch.describe_job_definitions(jobDefinitions=[definition])["jobDefinitions"]
    requirements = found[0].get("containerProperties", {}).get("resourceRequirements", []) if found else []
    return next((int(r["value"]) for r in requirements if r["type"] == "VCPU"), None)


def read_plan(s3, uri: str) -> DataPlan:
    bucket, key = parse_s3_uri(uri)
    return DataPlan.model_validate_json(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def shard_index(environ: dict[str, str], plan: DataPlan) -> int:
    """This child's shard: AWS_BATCH_JOB_ARRAY_INDEX, or 0 for a plan of one shard (no array: no index)."""
    value = environ.get(ARRAY_INDEX)
    if value is None:
        if len(plan.shards) == 1:
            return 0
        raise DataJobError(f"{ARRAY_INDEX} is not set; Batch sets it in each child of an array job")
    if not value.isdigit() or int(value) >= len(plan.shards):
        raise DataJobError(f"{ARRAY_INDEX}={value!r}: the plan has shards 0 to {len(plan.shards) - 1}")
    return int(value)


def run_shard(region: str, plan_uri: str, index: int | None, workdir: Path) -> str:
    """One array child: download its shard's objects, `prepare` them, upload the shard (manifest last)."""
    from trainer.data.prepare import default_workers, prepare_dataset

    s3 = client("s3", region)
    plan = read_plan(s3, plan_uri)
    index = shard_index(dict(os.environ), plan) if index is None else index
    start, end = plan.shards[index]
    sources = workdir / "src"
    paths = []
    for item in plan.objects[start:end]:
        path = sources / item.key
        path.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(plan.source_bucket, item.key, str(path))
        paths.append(path)
    tokenizer = workdir / "tokenizer.json"
    s3.download_file(plan.datasets_bucket, f"{plan.staging}/tokenizer.json", str(tokenizer))
    local = workdir / plan.shard_prefix(index)
    prepare_dataset(
        [str(p) for p in paths],
        str(local),
        tokenizer=str(tokenizer),
        text_key=plan.text_key,
        workers=default_workers(),
        # Shards check their records alone; the corpus's limit applies to the sum, at publish.
        limits=plan.limits.model_copy(update={"max_reject_rate": 1.0}),
    )
    _upload_dataset(s3, plan, DatasetFiles(str(local)), f"{plan.staging}/{plan.shard_prefix(index)}")
    return f"s3://{plan.datasets_bucket}/{plan.staging}/{plan.shard_prefix(index)}"


def run_publish(region: str, plan_uri: str, workdir: Path) -> str:
    """The merge job: download every shard, merge, publish the version (manifest last), then point latest at it."""
    from trainer.data.merge import merge_datasets

    s3 = client("s3", region)
    plan = read_plan(s3, plan_uri)
    published = f"s3://{plan.datasets_bucket}/{plan.published_prefix}"
    if _exists(s3, plan.datasets_bucket, f"{plan.published_prefix}.manifest.json"):
        return f"{published}: already published"
    workdir.mkdir(parents=True, exist_ok=True)
    shards = []
    for index in range(len(plan.shards)):
        local = DatasetFiles(str(workdir / plan.shard_prefix(index)))
        for path in local.all():
            key = f"{plan.staging}/{plan.shard_prefix(index)}{path.name[len(Path(local.prefix).name) :]}"
            s3.download_file(plan.datasets_bucket, key, str(path))
        shards.append(local.prefix)
    merged = merge_datasets(shards, str(workdir / plan.name), max_reject_rate=plan.limits.max_reject_rate)
    _upload_dataset(s3, plan, merged.files, plan.published_prefix)
    latest = {"version": plan.version, "prefix": f"{FSX_DATASETS}{plan.published_prefix}"}
    s3.put_object(
        Bucket=plan.datasets_bucket,
        Key=f"{plan.name}/latest.json",
        Body=json.dumps(latest).encode(),
        **_encryption(plan.kms_key_arn),
    )
    return f"{published}: {merged.summary()}"


def _upload_dataset(s3, plan: DataPlan, files: DatasetFiles, key_prefix: str) -> None:
    """The dataset's files under key_prefix, the manifest last: a reader that finds it finds every other file."""
    for path in files.all():  # DatasetFiles.all() ends with the manifest
        suffix = path.name[len(Path(files.prefix).name) :]
        s3.upload_file(
            str(path),
            plan.datasets_bucket,
            f"{key_prefix}{suffix}",
            ExtraArgs=_encryption(plan.kms_key_arn),
            Config=TRANSFER,
        )


def vcpu_hours(batch, job_ids: Sequence[str]) -> float:
    """vCPU-hours the finished jobs ran (an array job: each child), from DescribeJobs' startedAt/stoppedAt and the
    container's VCPU requirement: what the ledger prices a data job by."""
    total = 0.0
    pending = list(job_ids)
    while pending:
        described = batch.describe_jobs(jobs=pending[:100])["jobs"]
        pending = pending[100:]
        for job in described:
            size = job.get("arrayProperties", {}).get("size")
            if size and "index" not in job.get("arrayProperties", {}):
                pending += [f"{job['jobId']}:{index}" for index in range(size)]
                continue
            if "startedAt" not in job or "stoppedAt" not in job:
                continue
            requirements = job.get("container", {}).get("resourceRequirements", [])
            vcpus = next((float(r["value"]) for r in requirements if r["type"] == "VCPU"), 0.0)
            total += vcpus * (job["stoppedAt"] - job["startedAt"]) / 3_600_000
    return total


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    submit = actions.add_parser("submit", help="plan the shards and submit the array job and its merge")
    submit.add_argument("--stack", required=True)
    submit.add_argument("--outputs", help="a JSON file of stack outputs instead of `pulumi stack output`")
    submit.add_argument(
        "--src", required=True, help="s3://bucket/prefix/, or a local file or directory (uploaded)"
    )
    submit.add_argument("--name", required=True, help="the dataset's folder in the datasets bucket")
    submit.add_argument("--tokenizer", type=Path, required=True, help="the tokenizer.json every shard uses")
    submit.add_argument("--image", help="image tag in the stack's ECR repository (default: this git commit)")
    submit.add_argument("--text-key", default="text")
    submit.add_argument("--glob", action="append", dest="globs", metavar="PATTERN")
    submit.add_argument("--shard-mb", type=int, default=DEFAULT_SHARD_MB, help="source bytes per array child")
    submit.add_argument("--max-reject-rate", type=float, default=DEFAULT_MAX_REJECT_RATE)
    submit.add_argument("--min-chars", type=int, default=1)
    submit.add_argument("--max-chars", type=int, default=ValidationLimits().max_chars)
    for action in ("shard", "publish"):
        inside = actions.add_parser(action, help=f"in the Batch container: {action} one data plan")
        inside.add_argument("--plan", required=True, help="the plan's s3:// URI, written by `data submit`")
        inside.add_argument(
            "--region", default=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        )
        inside.add_argument("--workdir", type=Path, help="local staging (default: a temporary directory)")
        if action == "shard":
            inside.add_argument("--index", type=int, help=f"the shard (default: {ARRAY_INDEX})")
    cost = actions.add_parser("cost", help="vCPU-hours of finished data jobs")
    cost.add_argument("--stack", required=True)
    cost.add_argument("--outputs")
    cost.add_argument("--job", action="append", required=True, dest="jobs")


def main(args: argparse.Namespace) -> int:
    try:
        if args.action == "submit":
            outputs = load_outputs(args.stack, args.outputs)
            limits = check_limits(args.min_chars, args.max_chars, args.max_reject_rate)
            submission = submit_data(
                outputs,
                args.src,
                args.name,
                args.tokenizer,
                tag=image_tag(args.image),
                text_key=args.text_key,
                globs=args.globs or DEFAULT_GLOBS,
                limits=limits,
                shard_bytes=args.shard_mb << 20,
            )
            print(submission.summary())
        elif args.action == "cost":
            outputs = load_outputs(args.stack, args.outputs)
            hours = vcpu_hours(client("batch", outputs.region), args.jobs)
            print(json.dumps({"jobs": args.jobs, "vcpu_hours": round(hours, 4)}))
        else:
            if not args.region:
                raise DataJobError(
                    "--region or AWS_REGION: the stack's region (Batch sets AWS_REGION in jobs)"
                )
            with tempfile.TemporaryDirectory(prefix="trainstack-data-") as scratch:
                workdir = args.workdir or Path(scratch)
                if args.action == "shard":
                    print(run_shard(args.region, args.plan, args.index, workdir))
                else:
                    print(run_publish(args.region, args.plan, workdir))
    except (StackError, DataJobError, DataError) as error:
        print(f"data: {error}", file=sys.stderr)
        return 2
    except SubmitError as error:
        print(f"data: {'; '.join(error.problems)}", file=sys.stderr)
        return 2
    return 0
