"""`python -m trainer models list | show | promote`: the model versions and their tags, here or on a stack.

    models list [--dir runs | --stack ENV]              every version, oldest first, with its tags
    models show NAME                                     one version (by name, or the one a tag names now):
                                                         its lineage, metrics, evaluations and tag history
    models promote NAME --tag production                 point a tag at a version (a new event, never a rewrite)

`--format json` prints the records as JSON. With --stack, the stack's checkpoints bucket is read (and written,
for promote) through its outputs (trainer/aws/outputs.py), with --team only the team's own prefix (its runs and
tags: trainer/contract/teams.py, the part of the bucket its role may list); without, a local directory (default
runs/).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from trainer.checkpoint.version import RecordError
from trainer.contract.teams import team_root
from trainer.models.registry import Found, LocalStore, Registry, RegistryError, S3Store, Store

DEFAULT_DIR = Path("runs")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="<list|show|promote>")
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_mutually_exclusive_group()
    where.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help="a local directory of run checkpoints (default runs/)"
    )
    where.add_argument("--stack", help="read the stack's checkpoints bucket instead")
    common.add_argument("--outputs", help="with --stack: a JSON file of stack outputs instead of `pulumi`")
    common.add_argument("--team", help="with --stack: only the team's own runs and tags (teams/<team>/)")
    common.add_argument("--format", choices=("text", "json"), default="text")
    actions.add_parser("list", parents=[common], help="every model version, oldest first, with its tags")
    show = actions.add_parser(
        "show", parents=[common], help="one version: lineage, metrics, evaluations, tags"
    )
    show.add_argument("name", help="a version's name, a tag (e.g. production), or newest")
    promote = actions.add_parser("promote", parents=[common], help="point a tag at a version (history kept)")
    promote.add_argument(
        "name", help="a version's name, a tag whose version to promote, or newest (the newest version)"
    )
    promote.add_argument("--tag", required=True, help="the tag, e.g. production")


def store_for(args: argparse.Namespace) -> Store:
    if args.stack is None:
        if args.outputs or args.team:
            raise RegistryError(f"{'--outputs' if args.outputs else '--team'} goes with --stack")
        return LocalStore(args.dir)
    from trainer.aws.clients import client
    from trainer.aws.outputs import load_outputs

    outputs = load_outputs(args.stack, args.outputs)
    return S3Store(
        client("s3", outputs.region),
        client("sts", outputs.region),
        outputs["checkpoints_bucket"],
        outputs["kms_key_arn"],
        team_root(args.team),
    )


def main(args: argparse.Namespace) -> int:
    from trainer.aws.outputs import StackError

    try:
        registry = Registry(store_for(args))
        if args.action == "list":
            _list(registry, args.format)
        elif args.action == "show":
            _show(registry, registry.find(args.name), args.format)
        else:
            event, where = registry.promote(args.name, args.tag)
            if args.format == "json":
                print(json.dumps({**event.model_dump(), "written": where}, indent=1))
            elif where is None:
                print(f"{event.tag} -> {event.version} already (since {event.at}); nothing appended")
            else:
                was = f" (was {event.previous})" if event.previous else ""
                print(f"{event.tag} -> {event.version}{was}; recorded in {where}")
    except (RecordError, StackError) as error:
        print(f"models: {error}", file=sys.stderr)
        return 2
    return 0


def _list(registry: Registry, form: str) -> None:
    if form == "json":
        every = [f.as_json(registry.tags_of(f.record.version)) for f in registry.versions]
        print(json.dumps(every, indent=1))
        return
    if not registry.versions:
        print(f"no model versions in {registry.store.where}")
        return
    table = Table("version", "created", "step", "val_loss", "parent", "tags", box=None)
    for found in registry.versions:
        record = found.record
        loss = record.metrics.get("val_loss")
        table.add_row(
            record.version,
            record.created,
            str(record.step),
            f"{loss:.4f}" if loss is not None else "-",
            (record.parent.version or record.parent.checkpoint) if record.parent else "-",
            ", ".join(registry.tags_of(record.version)) or "-",
        )
    Console(width=200).print(table)


def _show(registry: Registry, found: Found, form: str) -> None:
    record = found.record
    tags = registry.tags_of(record.version)
    history = [e.model_dump() for tag in tags for e in registry.history(tag)]
    if form == "json":
        print(json.dumps({**found.as_json(tags), "tag_history": history}, indent=1))
        return
    lines = [
        f"version     {record.version}",
        f"checkpoint  {found.location}",
        f"created     {record.created}  run {record.run}, step {record.step}",
        f"code        {record.git_commit or 'unknown'}"
        + (" (uncommitted changes)" if record.git_dirty else ""),
        f"image       {record.image.tag} {record.image.digest or ''}" if record.image else "image       -",
        f"parent      {(record.parent.version or record.parent.checkpoint) if record.parent else '-'}",
        f"config      sha256 {record.config_sha256[:16]}",
        f"tokenizer   {record.tokenizer_path} sha256 {record.tokenizer_sha256[:16]}",
        *(f"dataset     {d.prefix} sha256 {d.sha256[:16]}" for d in record.datasets),
        f"lineage     sha256 {record.lineage_sha256[:16]}",
        f"metrics     {json.dumps(record.metrics, sort_keys=True)}",
        *(f"evaluation  {e['name']}: {json.dumps(e['results'], sort_keys=True)}" for e in found.evaluations),
        *(f"tag         {e['tag']} <- {e['version']} at {e['at']} by {e['by']}" for e in history),
    ]
    print("\n".join(lines))
