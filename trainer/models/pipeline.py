"""`python -m trainer finetune-stages`: a fine-tune's stages after training, in this process, each done once.

    finetune-stages --run DIR --suite FILE --record NAME [--tag candidate] [--tokenizer F] [--dtype bf16]
                    [--export-dir DIR] [--tags-root DIR]

1 evaluate  the run's newest checkpoint (DIR/checkpoints) on the suite; the results join its model version record as
            evaluations/NAME.json, once: a checkpoint that has them is not evaluated again
2 promote   the tag to that checkpoint's version: an event only when the tag moves (trainer/models/registry.py)
3 export    the version the tag names, for inference (`convert --to-hf`: trainer/interop/convert.py), to
            EXPORT_DIR/<version>, once per version; then EXPORT_DIR/<version>.export.json lists its files and sizes,
            the marker a reader of the bucket checks every listed file against (FSx exports each file on its own)

`make finetune` runs it here after prepare and train; `make finetune STACK=<env>` runs it in a one-node job on the
cluster (trainer/jobs/finetune.py) with DIR under /fsx/checkpoints and --tags-root /fsx/checkpoints, so the tag
events land where `models --stack` reads them (the bucket's model-tags/, FSx's export of /fsx/checkpoints).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from trainer.checkpoint.version import EVALUATION_NAME, RecordError, add_evaluation, read_record, write_once
from trainer.config import ConfigError
from trainer.data import DataError
from trainer.evaluation.suite import read_suite
from trainer.models.registry import NEWEST, TAG_NAME, LocalStore, Registry, TagHistory

CHECKPOINTS = "checkpoints"
EXPORT = "export"
EXPORT_MARKER_SUFFIX = ".export.json"
DEFAULT_TAG = "candidate"
DTYPES = ("bf16", "fp16", "fp32")  # convert --to-hf's short names (trainer/interop/hf.py DTYPE_ALIASES)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run", type=Path, required=True, help="the run directory (its checkpoints/ is read)"
    )
    parser.add_argument(
        "--suite", type=Path, required=True, help="the evaluation suite YAML (docs/evaluate.md)"
    )
    parser.add_argument("--record", required=True, help="the evaluation's name beside the version record")
    parser.add_argument("--tag", default=DEFAULT_TAG, help=f"the tag to promote (default {DEFAULT_TAG})")
    parser.add_argument(
        "--tokenizer", type=Path, help="tokenizer.json (default: found beside the checkpoint)"
    )
    parser.add_argument(
        "--dtype", choices=DTYPES, default="bf16", help="the export's tensor dtype (convert --to-hf --dtype)"
    )
    parser.add_argument("--export-dir", type=Path, help="where exports go (default RUN/export)")
    parser.add_argument(
        "--tags-root", type=Path, help="where the tag events go (default RUN; on a stack /fsx/checkpoints)"
    )


class RunStore(LocalStore):
    """The run's versions, with its tag events under another root (a stack's /fsx/checkpoints, whose model-tags/
    FSx exports to the bucket's, where `models list --stack` reads them)."""

    def __init__(self, run: Path, tags_root: Path):
        super().__init__(run)
        self.tags = LocalStore(tags_root)

    def tag_histories(self) -> list[TagHistory]:
        return self.tags.tag_histories()

    def read_tag(self, tag: str) -> tuple[TagHistory | None, str | None]:
        return self.tags.read_tag(tag)

    def write_tag(self, history: TagHistory, token: str | None) -> str:
        return self.tags.write_tag(history, token)


def check_names(record: str, tag: str) -> None:
    """The evaluation's and the tag's names, as the record and the registry will check them (RecordError)."""
    if not re.fullmatch(EVALUATION_NAME, record):
        raise RecordError(
            f"--record {record!r}: use letters, digits, '.', '-' and '_' (at most 100, starting with a letter or digit)"
        )
    if not TAG_NAME.match(tag) or tag == NEWEST:
        raise RecordError(
            f"--tag {tag!r}: use lowercase letters, digits, '.', '-' and '_' (at most 63, starting with a letter or "
            f"digit; not {NEWEST!r}), e.g. candidate"
        )


def marker_path(export_dir: Path, version: str) -> Path:
    return export_dir / f"{version}{EXPORT_MARKER_SUFFIX}"


def write_marker(export_dir: Path, version: str) -> Path:
    """<version>.export.json beside a complete export: its files (relative paths) and their sizes."""
    out = export_dir / version
    files = {p.relative_to(out).as_posix(): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
    path = marker_path(export_dir, version)
    write_once(path, json.dumps({"version": version, "files": files}, indent=1) + "\n")
    return path


def evaluate_newest(run: Path, suite: Path, record: str, tokenizer: Path | None) -> Path:
    """Stage 1: the newest checkpoint evaluated and its results recorded, unless they are already; the checkpoint."""
    from trainer.evaluation import evaluate

    checked = evaluate.plan(run / CHECKPOINTS, suite, tokenizer)
    if (done := evaluate.recorded(checked.checkpoint, record)) is not None:
        print(f"evaluate: {checked.checkpoint} was evaluated as {record!r} already: {done}")
        return checked.checkpoint
    results = evaluate.run(checked)
    add_evaluation(checked.checkpoint, record, {"suite": str(suite), **results})
    print(evaluate.report(checked.checkpoint, results))
    return checked.checkpoint


def promote(run: Path, tags_root: Path, checkpoint: Path, tag: str) -> tuple[Registry, str]:
    """Stage 2: the tag pointed at the checkpoint's version (an event only when it moves); the version."""
    registry = Registry(RunStore(run, tags_root))
    event, where = registry.promote(read_record(checkpoint).version, tag)
    if where is None:
        print(f"{event.tag} -> {event.version} already (since {event.at}); nothing appended")
    else:
        was = f" (was {event.previous})" if event.previous else ""
        print(f"{event.tag} -> {event.version}{was}; recorded in {where}")
    return registry, event.version


def export(registry: Registry, tag: str, export_dir: Path, dtype: str) -> int:
    """Stage 3: the tag's version exported once, then its marker."""
    from trainer.interop.convert import export_to_hf

    found = registry.find(tag)
    version = found.record.version
    out = export_dir / version
    if out.is_dir():
        print(f"export: {out} already")
    else:
        export_dir.mkdir(parents=True, exist_ok=True)
        if (status := export_to_hf(Path(found.location), out, dtype)) != 0:
            return status
    if not marker_path(export_dir, version).is_file():
        write_marker(export_dir, version)
    return 0


def main(args: argparse.Namespace) -> int:
    export_dir = args.export_dir or args.run / EXPORT
    tags_root = args.tags_root or args.run
    try:
        if not (args.run / CHECKPOINTS).is_dir():
            raise RecordError(f"--run {args.run}: no {CHECKPOINTS}/ in it; train the run first")
        check_names(args.record, args.tag)
        read_suite(args.suite)  # the suite and its files, before any checkpoint is read
        checkpoint = evaluate_newest(args.run, args.suite, args.record, args.tokenizer)
        registry, _ = promote(args.run, tags_root, checkpoint, args.tag)
        return export(registry, args.tag, export_dir, args.dtype)
    # Every check raises a ValueError (ours subclass it, as pydantic's does), a ConfigError or a DataError.
    except (ValueError, ConfigError, DataError) as error:
        print(f"finetune-stages: {error}", file=sys.stderr)
        return 2
