"""The model versions under a checkpoints root, on this machine or in a stack's checkpoints bucket, and their tags.

A version is a checkpoint with a record (trainer/checkpoint/version.py); it is found wherever it lies under the root
(runs/<name>/checkpoints/iter_*/ here; <run>/checkpoints/iter_*/ in the bucket, FSx's export of
/fsx/checkpoints). A tag (`production`) names one version at a time and is the only thing that changes; each
promotion is a new event file that is never rewritten, so a tag's whole history stays:

    model-tags/<tag>/<UTC time>-<version>.json    {"tag", "version", "at", "by", "previous"}

The tag's version is its newest event's. In S3 every object is written with the stack's KMS key and with
`If-None-Match: *`, which S3 refuses when the key exists (Amazon S3 User Guide, "How to prevent object overwrites
with conditional writes"); the bucket is versioned besides.
"""

from __future__ import annotations

import getpass
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, ValidationError

from trainer.checkpoint.version import (
    EVALUATIONS,
    RECORD,
    ModelVersion,
    RecordError,
    parse_record,
    write_once,
)

TAGS = "model-tags"
TAG_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
# The name that always means the newest version (by creation): `models show newest`, `promote newest --tag ...`.
NEWEST = "newest"


class RegistryError(RecordError):
    """A version or tag that is not there, or a promotion that cannot be recorded."""


class TagEvent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tag: str
    version: str
    at: str  # UTC, ISO 8601 with microseconds: events sort by it
    by: str
    previous: str | None  # the version the tag named before, if any


@dataclass
class Found:
    """A version's record, where its checkpoint lies, and the evaluations added beside it."""

    record: ModelVersion
    location: str
    evaluations: list[dict] = field(default_factory=list)

    def as_json(self, tags: list[str]) -> dict[str, Any]:
        return {
            **self.record.model_dump(mode="json"),
            "location": self.location,
            "evaluations": self.evaluations,
            "tags": tags,
        }


class Store(Protocol):
    where: str

    def versions(self) -> list[Found]: ...

    def tag_events(self) -> list[TagEvent]: ...

    def append_tag_event(self, event: TagEvent) -> str: ...

    def caller(self) -> str: ...


def _event_name(event: TagEvent) -> str:
    stamp = datetime.fromisoformat(event.at).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"{TAGS}/{event.tag}/{stamp}-{event.version}.json"


def _parse_event(text: str | bytes, source: str) -> TagEvent:
    try:
        return TagEvent.model_validate_json(text)
    except ValidationError as error:
        raise RegistryError(f"{source} is not a tag event ({error.errors()[0]['msg']})") from None


class LocalStore:
    """Versions under a directory on this machine (a run directory, or `runs/` holding many)."""

    def __init__(self, root: Path):
        if not root.is_dir():
            raise RegistryError(f"--dir {root}: no such directory; give a directory holding run checkpoints")
        self.root = root
        self.where = str(root)

    def versions(self) -> list[Found]:
        found = []
        for path in sorted(self.root.rglob(RECORD)):
            record = parse_record(path.read_bytes(), str(path))
            evaluations = [
                json.loads(e.read_text()) for e in sorted((path.parent / EVALUATIONS).glob("*.json"))
            ]
            found.append(Found(record, str(path.parent), evaluations))
        return found

    def tag_events(self) -> list[TagEvent]:
        return [_parse_event(p.read_bytes(), str(p)) for p in sorted((self.root / TAGS).glob("*/*.json"))]

    def append_tag_event(self, event: TagEvent) -> str:
        path = self.root / _event_name(event)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_once(path, event.model_dump_json(indent=1) + "\n")
        return str(path)

    def caller(self) -> str:
        return getpass.getuser()


class S3Store:
    """Versions in a stack's checkpoints bucket (KMS-encrypted, versioned), where FSx exports /fsx/checkpoints; with
    a `root` (a team's teams/<team>/: trainer/contract/teams.py), only below it: its runs and its tag events."""

    def __init__(self, s3: Any, sts: Any, bucket: str, kms_key_arn: str, root: str = ""):
        self.s3, self.sts, self.bucket, self.kms_key_arn, self.root = s3, sts, bucket, kms_key_arn, root
        self.where = f"s3://{bucket}/{root}".rstrip("/")

    def _keys(self, prefix: str = "") -> list[str]:
        pages = self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.root + prefix
        )
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def _read(self, key: str) -> bytes:
        return self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def versions(self) -> list[Found]:
        keys = self._keys()
        found = []
        for key in sorted(k for k in keys if k.endswith("/" + RECORD)):
            directory = key.removesuffix(RECORD)
            record = parse_record(self._read(key), f"s3://{self.bucket}/{key}")
            evaluations = [
                json.loads(self._read(k))
                for k in sorted(keys)
                if k.startswith(directory + EVALUATIONS + "/") and k.endswith(".json")
            ]
            found.append(Found(record, f"s3://{self.bucket}/{directory.rstrip('/')}", evaluations))
        return found

    def tag_events(self) -> list[TagEvent]:
        return [
            _parse_event(self._read(key), f"s3://{self.bucket}/{key}")
            for key in sorted(self._keys(TAGS + "/"))
            if key.endswith(".json")
        ]

    def append_tag_event(self, event: TagEvent) -> str:
        key = self.root + _event_name(event)
        try:
            self.s3.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=(event.model_dump_json(indent=1) + "\n").encode(),
                ContentType="application/json",
                ServerSideEncryption="aws:kms",
                SSEKMSKeyId=self.kms_key_arn,
                IfNoneMatch="*",
            )
        except ClientError as error:
            if error.response["Error"]["Code"] in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise RegistryError(
                    f"s3://{self.bucket}/{key} exists: tag events are never replaced"
                ) from None
            raise
        return f"s3://{self.bucket}/{key}"

    def caller(self) -> str:
        return str(self.sts.get_caller_identity()["Arn"])


class Registry:
    """Versions and tags read from one store; `promote` appends a tag event."""

    def __init__(self, store: Store):
        self.store = store
        self.versions = sorted(
            store.versions(), key=lambda f: (f.record.created, f.record.run, f.record.step)
        )
        self.events = sorted(store.tag_events(), key=lambda e: e.at)

    def tags(self) -> dict[str, str]:
        """Each tag's current version (its newest event's)."""
        return {event.tag: event.version for event in self.events}

    def tags_of(self, version: str) -> list[str]:
        return sorted(tag for tag, named in self.tags().items() if named == version)

    def history(self, tag: str) -> list[TagEvent]:
        return [event for event in self.events if event.tag == tag]

    def find(self, name: str) -> Found:
        """A version by its name, the version a tag names now, or (NEWEST) the newest version."""
        if name == NEWEST and self.versions:
            return self.versions[-1]
        version = self.tags().get(name, name)
        for found in self.versions:
            if found.record.version == version:
                return found
        known = ", ".join(f.record.version for f in self.versions[-5:]) or "none"
        tags = ", ".join(sorted(self.tags())) or "none"
        raise RegistryError(
            f"no model version or tag {name!r} in {self.store.where}; versions (newest): {known}; tags: {tags}"
        )

    def promote(self, version: str, tag: str) -> tuple[TagEvent, str | None]:
        """Append a tag event pointing `tag` at `version`; where it was written, or None when the tag already
        names that version (nothing appended: a pipeline re-run promotes once)."""
        if not TAG_NAME.match(tag) or tag == NEWEST:
            raise RegistryError(
                f"--tag {tag!r}: use lowercase letters, digits, '.', '-' and '_' (at most 63, starting with a "
                f"letter or digit; not {NEWEST!r}), e.g. production"
            )
        if any(f.record.version == tag for f in self.versions):
            raise RegistryError(f"--tag {tag!r} is a version's name: a tag needs a name of its own")
        found = self.find(version)  # a tag may be promoted from another: `promote staging --tag production`
        if self.tags().get(tag) == found.record.version:
            return self.history(tag)[-1], None
        event = TagEvent(
            tag=tag,
            version=found.record.version,
            at=datetime.now(UTC).isoformat(timespec="microseconds"),
            by=self.store.caller(),
            previous=self.tags().get(tag),
        )
        where = self.store.append_tag_event(event)
        self.events.append(event)
        return event, where
