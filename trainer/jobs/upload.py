"""`python -m trainer upload --stack <env> --prefix PATH`: put a prepared dataset (PREFIX.bin, PREFIX.idx and the
files prepared beside them, such as the tokenizer, and a chat dataset's loss mask PREFIX-mask.bin/.idx) into the
stack's datasets bucket, where FSx's data repository association shows them under /fsx/datasets (a team's under
its own teams/<team>/, the prefix its role may write: trainer/contract/teams.py). Multipart, encrypted with the
stack's KMS key, with progress."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from boto3.s3.transfer import TransferConfig
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from trainer.aws.clients import client
from trainer.aws.outputs import StackError, StackOutputs, load_outputs
from trainer.contract.teams import team_prefix
from trainer.data.chat import chat_manifest_path, mask_prefix
from trainer.jobs.submit import FSX_DATASETS
from trainer.jobs.teams import team_problems

TRANSFER = TransferConfig(multipart_threshold=64 * 2**20, multipart_chunksize=64 * 2**20, max_concurrency=8)


class UploadError(RuntimeError):
    pass


def dataset_files(prefix: Path) -> list[Path]:
    """PREFIX.bin and PREFIX.idx (required) and every other PREFIX.* file prepared with them; for chat data
    (PREFIX.chat.json) also its loss mask, PREFIX-mask.bin and .idx (required: training reads them)."""
    required = [Path(str(prefix) + suffix) for suffix in (".bin", ".idx")]
    if chat_manifest_path(str(prefix)).is_file():
        required += [Path(mask_prefix(str(prefix)) + suffix) for suffix in (".bin", ".idx")]
    missing = [str(path) for path in required if not path.is_file()]
    if missing:
        raise UploadError(
            f"{' and '.join(missing)} not found; prepare the dataset first (python -m trainer prepare)"
        )
    prepared = (
        p for p in prefix.parent.glob(prefix.name + ".*") if p.is_file() and not p.name.endswith(".tmp")
    )
    return sorted({*prepared, *required})


def upload(outputs: StackOutputs, prefix: Path, name: str) -> list[str]:
    """Upload and return the S3 keys written, under <name>/ (a team's name is teams/<team>/<name>)."""
    files = dataset_files(prefix)
    s3 = client("s3", outputs.region)
    bucket = outputs["datasets_bucket"]
    encryption = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": outputs["kms_key_arn"]}
    keys = []
    columns = ("{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, transient=not sys.stdout.isatty()) as progress:
        for path in files:
            key = f"{name}/{path.name}"
            task = progress.add_task(f"s3://{bucket}/{key}", total=path.stat().st_size)
            s3.upload_file(
                str(path),
                bucket,
                key,
                ExtraArgs=encryption,
                Config=TRANSFER,
                Callback=lambda sent, task=task: progress.advance(task, sent),
            )
            keys.append(key)
    return keys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True)
    parser.add_argument("--outputs", help="a JSON file of stack outputs instead of `pulumi stack output`")
    parser.add_argument(
        "--prefix", type=Path, required=True, help="the prepared dataset's PREFIX (PREFIX.bin/.idx)"
    )
    parser.add_argument(
        "--name", help="folder in the bucket and under /fsx/datasets (default: PREFIX's name)"
    )
    parser.add_argument("--team", help="on a stack shared by teams: upload under the team's own prefix")


def main(args: argparse.Namespace) -> int:
    name = args.name or args.prefix.name
    try:
        outputs = load_outputs(args.stack, args.outputs)
        if args.team:
            if problems := team_problems(outputs, args.team, 0):
                raise UploadError("; ".join(problems))
            name = team_prefix(args.team) + name
        keys = upload(outputs, args.prefix, name)
    except (StackError, UploadError) as error:
        print(f"upload: {error}", file=sys.stderr)
        return 2
    print(f"uploaded {len(keys)} files to s3://{outputs['datasets_bucket']}/{name}/; on the cluster:")
    print(f"  --set data.prefixes=[{FSX_DATASETS}{name}/{args.prefix.name}]")
    for key in keys:
        if key.endswith("tokenizer.json"):
            print(f"  --set data.tokenizer_path={FSX_DATASETS}{key}")
    return 0
