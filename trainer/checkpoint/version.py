"""A model version record: what made one published checkpoint, written once beside it as `model_version.json`.

    iter_0000250/
      manifest.json            the checkpoint's files and digests (trainer/checkpoint/store.py), sealed first
      model_version.json       this record, written after the publish, never rewritten
      evaluations/<name>.json  evaluation results added later, one file per evaluation, each written once

The record holds the config as resolved, the content hashes of each dataset (from its manifest,
trainer/data/manifest.py: the index's sha256, the .bin's sampled sha256, the tokenizer's), the tokenizer's hash,
the git commit, the image (on a stack: the tag and digest the job's environment carries), the parent checkpoint a
fine-tune started from (checkpoint.load), the metrics saved with the checkpoint and its step. `lineage_sha256`
hashes what decides the weights (config, data, tokenizer, parent): equal lineage, equal training.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from trainer.contract.container import IMAGE_DIGEST_ENV, IMAGE_TAG_ENV
from trainer.cost.ledger import MANIFEST_KEY as LEDGER_KEY
from trainer.data.manifest import DatasetFiles, read_manifest, sampled_sha256
from trainer.data.tokenizer import file_sha256

RECORD = "model_version.json"
EVALUATIONS = "evaluations"
MANIFEST = "manifest.json"  # the checkpoint store's seal (trainer/checkpoint/store.py MANIFEST)
LATEST = (
    "latest"  # the store's pointer to a directory's newest checkpoint (trainer/checkpoint/store.py LATEST)
)
ROOT = Path(__file__).resolve().parents[2]


class RecordError(ValueError):
    """A model version record that cannot be written or read as asked."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetLineage(_Strict):
    prefix: str
    sha256: str  # over the content hashes below: equal data, equal hash
    idx_sha256: str
    bin_sampled_sha256: str
    tokenizer_sha256: str | None  # the tokenizer prepared beside it, where its manifest records one
    tokens: int | None


class Parent(_Strict):
    checkpoint: str  # the checkpoint checkpoint.load resolved to
    version: str | None  # its own record's version, where it has one (a converted model has none)
    manifest_sha256: str | None


class Image(_Strict):
    tag: str | None
    digest: str | None


class ModelVersion(_Strict):
    format: int = 1
    version: str  # <run>-s<step>-<first 8 hex of the checkpoint manifest's sha256>
    created: str  # UTC, ISO 8601
    run: str
    step: int
    checkpoint: str  # where it was published (on a stack: under /fsx/checkpoints, exported to the bucket)
    manifest_sha256: str  # the checkpoint's manifest.json: every file's digest, so every byte
    config: dict[str, Any]  # the config as resolved (the tokenizer's vocabulary, `auto` settled)
    config_sha256: str
    datasets: list[DatasetLineage]
    tokenizer_path: str
    tokenizer_sha256: str
    lineage_sha256: str  # config, data, tokenizer and parent together
    git_commit: str | None
    git_dirty: bool | None
    image: Image | None  # on a stack only
    parent: Parent | None  # a run that started from checkpoint.load
    metrics: dict[str, float]  # saved with the checkpoint (val_loss at its step, where evaluated)
    cost: dict[str, Any] | None = (
        None  # the run's ledger at this checkpoint (trainer/cost/ledger.py), where kept
    )


def canonical_sha256(value: Any) -> str:
    """sha256 of a JSON value with sorted keys: the same value, the same hash, whatever the key order."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def dataset_lineage(prefix: str) -> DatasetLineage:
    """A dataset's content hashes: its manifest's where recorded, else read from the files (older manifests)."""
    files = DatasetFiles(prefix)
    manifest = read_manifest(files)
    idx = manifest.idx_sha256 if manifest and manifest.idx_sha256 else None
    sampled = manifest.bin_sampled_sha256 if manifest and manifest.bin_sampled_sha256 else None
    try:
        idx = idx or file_sha256(files.idx)
        sampled = sampled or sampled_sha256(files.bin)
    except OSError as error:
        raise RecordError(f"data.prefixes: {prefix!r} cannot be hashed ({error})") from None
    tokenizer = manifest.tokenizer.sha256 if manifest else None
    content = {"idx_sha256": idx, "bin_sampled_sha256": sampled, "tokenizer_sha256": tokenizer}
    return DatasetLineage(
        prefix=prefix,
        sha256=canonical_sha256(content),
        tokens=manifest.tokens if manifest else None,
        **content,
    )


def git_state(root: Path = ROOT) -> tuple[str | None, bool | None]:
    """This checkout's commit and whether tracked files differ from it; (None, None) outside a git checkout (the
    image carries no .git: its tag is the commit, see `image`)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30
        )
        if head.returncode != 0:
            return None, None
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    return head.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None


def image_of(environ: Mapping[str, str]) -> Image | None:
    tag, digest = environ.get(IMAGE_TAG_ENV), environ.get(IMAGE_DIGEST_ENV)
    return Image(tag=tag, digest=digest) if tag or digest else None


def resolved_checkpoint(path: Path) -> Path:
    """A checkpoint directory itself, or the one a directory of them names in `latest`."""
    pointer = path / LATEST
    return path / pointer.read_text().strip() if pointer.is_file() else path


def manifest_sha256(checkpoint: Path) -> str | None:
    try:
        return hashlib.sha256((checkpoint / MANIFEST).read_bytes()).hexdigest()
    except OSError:
        return None


def parent_of(load: str | None) -> Parent | None:
    if not load:
        return None
    checkpoint = resolved_checkpoint(Path(load))
    record = read_record(checkpoint) if (checkpoint / RECORD).is_file() else None
    return Parent(
        checkpoint=str(checkpoint),
        version=record.version if record else None,
        manifest_sha256=manifest_sha256(checkpoint),
    )


class Lineage:
    """What every checkpoint of one run shares (config, data, tokenizer, code, image, parent), computed once: the
    data hashes read the files where a manifest lacks them."""

    def __init__(self, config: dict[str, Any], environ: Mapping[str, str] | None = None):
        environ = os.environ if environ is None else environ
        data, checkpoint = config["data"], config["checkpoint"]
        self.run: str = config["name"]
        self.config = config
        self.config_sha256 = canonical_sha256(config)
        self.datasets = [dataset_lineage(prefix) for prefix in data["prefixes"]]
        self.tokenizer_path: str = data["tokenizer_path"]
        try:
            self.tokenizer_sha256 = file_sha256(self.tokenizer_path)
        except OSError as error:
            raise RecordError(
                f"data.tokenizer_path = {self.tokenizer_path!r} cannot be hashed ({error})"
            ) from None
        self.parent = parent_of(checkpoint.get("load"))
        self.git_commit, self.git_dirty = git_state()
        self.image = image_of(environ)
        self.lineage_sha256 = canonical_sha256(
            {
                "config": self.config_sha256,
                "datasets": [d.sha256 for d in self.datasets],
                "tokenizer": self.tokenizer_sha256,
                "parent": self.parent.manifest_sha256 if self.parent else None,
            }
        )

    def record(self, checkpoint: Path, step: int, metrics: Mapping[str, float]) -> ModelVersion:
        sealed = manifest_sha256(checkpoint)
        if sealed is None:
            raise RecordError(f"{checkpoint} has no {MANIFEST}: only a published checkpoint gets a version")
        return ModelVersion(
            version=f"{self.run}-s{step}-{sealed[:8]}",
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            run=self.run,
            step=step,
            checkpoint=str(checkpoint),
            manifest_sha256=sealed,
            config=self.config,
            config_sha256=self.config_sha256,
            datasets=self.datasets,
            tokenizer_path=self.tokenizer_path,
            tokenizer_sha256=self.tokenizer_sha256,
            lineage_sha256=self.lineage_sha256,
            git_commit=self.git_commit,
            git_dirty=self.git_dirty,
            image=self.image,
            parent=self.parent,
            metrics={key: float(value) for key, value in metrics.items() if isinstance(value, int | float)},
            cost=metrics.get(LEDGER_KEY),
        )


def write_once(path: Path, text: str) -> None:
    """Write `text` to `path` unless something is there: a temporary file, then a hard link to the final name,
    which the file system refuses when the name exists (a rename would replace it)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    try:
        os.link(temporary, path)
    except FileExistsError:
        raise RecordError(
            f"{path} exists: a model version's files are written once, never replaced"
        ) from None
    finally:
        temporary.unlink()


def write_record(checkpoint: Path, record: ModelVersion) -> Path:
    path = checkpoint / RECORD
    write_once(path, record.model_dump_json(indent=1) + "\n")
    return path


def parse_record(text: str | bytes, source: str) -> ModelVersion:
    try:
        return ModelVersion.model_validate_json(text)
    except ValidationError as error:
        first = error.errors()[0]
        raise RecordError(
            f"{source} is not a model version record ({error.error_count()} problem(s), first: "
            f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']})"
        ) from None


def read_record(checkpoint: Path) -> ModelVersion:
    path = checkpoint / RECORD
    try:
        return parse_record(path.read_bytes(), str(path))
    except OSError as error:
        raise RecordError(f"{path}: cannot read it ({error.strerror})") from None


EVALUATION_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"


def add_evaluation(checkpoint: Path, name: str, results: Mapping[str, Any]) -> Path:
    """Add one evaluation's results beside a checkpoint's record (evaluations/<name>.json, written once): the
    record itself is never rewritten, so evaluations run later (`evaluate`) add files instead."""
    check_evaluation_name(checkpoint, name)
    directory = checkpoint / EVALUATIONS
    directory.mkdir(exist_ok=True)
    path = directory / f"{name}.json"
    entry = {"name": name, "added": datetime.now(UTC).isoformat(timespec="seconds"), "results": dict(results)}
    write_once(path, json.dumps(entry, indent=1, sort_keys=True) + "\n")
    return path


def check_evaluation_name(checkpoint: Path, name: str) -> None:
    """Raise RecordError unless an evaluation named `name` can be added beside `checkpoint`'s record."""
    if not re.fullmatch(EVALUATION_NAME, name):
        raise RecordError(
            f"evaluation name {name!r}: use letters, digits, '.', '-' and '_' (at most 100, starting with a letter "
            "or digit)"
        )
    if not (checkpoint / RECORD).is_file():
        raise RecordError(f"{checkpoint} has no {RECORD}: evaluations attach to a registered model version")


def read_evaluations(checkpoint: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted((checkpoint / EVALUATIONS).glob("*.json"))]
