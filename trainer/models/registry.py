"""The model versions under a checkpoints root, on this machine or in a stack's checkpoints bucket, and their tags.

A version is a checkpoint with a record (trainer/checkpoint/version.py); it is found wherever it lies under the root
(runs/<name>/checkpoints/iter_*/ here; <run>/checkpoints/iter_*/ in the bucket, FSx's export of
/fsx/checkpoints). A tag (`production`) names one version at a time and is the only thing that changes. It is one
file holding its whole history, each promotion an event appended to it:

    model-tags/<tag>.json    {"tag", "events": [{"tag", "version", "at", "by", "previous"}, ...]}

The tag's version is its newest event's. A promotion is one compare-and-swap of that file: read it, append, write
it only if nobody wrote it since (so of two concurrent promotions of one tag, one wins and the other is refused,
naming what the tag names now, instead of both "succeeding" past each other). In S3 that is one PutObject with
`If-Match` on the ETag read (`If-None-Match: *` for a new tag): S3 answers 412 Precondition Failed when the object
changed, and 409 ConditionalRequestConflict when a conflicting write was in flight, on which "you should fetch the
object's ETag and retry" (Amazon S3 User Guide, "How to prevent object overwrites with conditional writes"; API
reference PutObject, If-Match): a 409 is retried from the read, a 412 reported. Every object is written with the
stack's KMS key; the bucket is versioned, so every earlier state of a tag stays readable too. Here, the same swap
under an exclusive lock on the tag (fcntl), the file replaced by a rename.
"""

from __future__ import annotations

import fcntl
import getpass
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, ValidationError

from trainer.checkpoint.version import EVALUATIONS, RECORD, ModelVersion, RecordError, parse_record

TAGS = "model-tags"
TAG_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
# The name that always means the newest version (by creation): `models show newest`, `promote newest --tag ...`.
NEWEST = "newest"
# A 409 ConditionalRequestConflict is retried from the read this many times, waiting a little longer each time.
SWAP_ATTEMPTS = 5


class RegistryError(RecordError):
    """A version or tag that is not there, or a promotion that cannot be recorded."""


class TagEvent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tag: str
    version: str
    at: str  # UTC, ISO 8601 with microseconds: events sort by it
    by: str
    previous: str | None  # the version the tag named before, if any


class TagHistory(BaseModel):
    """model-tags/<tag>.json: every promotion of one tag, oldest first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tag: str
    events: list[TagEvent]


class TagChanged(RegistryError):
    """The tag was written by someone else between this promotion's read and its write (S3's 412)."""


class TagBusy(RegistryError):
    """A conflicting write of the tag was in flight (S3's 409 ConditionalRequestConflict): read again and retry."""


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

    def tag_histories(self) -> list[TagHistory]: ...

    def read_tag(self, tag: str) -> tuple[TagHistory | None, str | None]:
        """The tag's history and the token a write must present (S3's ETag), or (None, None) for a new tag."""
        ...

    def write_tag(self, history: TagHistory, token: str | None) -> str:
        """Replace the tag's history if it is still what `token` read (raise TagChanged, or TagBusy to retry);
        where it was written."""
        ...

    def caller(self) -> str: ...


def _tag_name(tag: str) -> str:
    return f"{TAGS}/{tag}.json"


def _parse_history(text: str | bytes, source: str) -> TagHistory:
    try:
        return TagHistory.model_validate_json(text)
    except ValidationError as error:
        raise RegistryError(f"{source} is not a tag's history ({error.errors()[0]['msg']})") from None


def _dump(history: TagHistory) -> str:
    return history.model_dump_json(indent=1) + "\n"


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

    def tag_histories(self) -> list[TagHistory]:
        return [_parse_history(p.read_bytes(), str(p)) for p in sorted((self.root / TAGS).glob("*.json"))]

    def read_tag(self, tag: str) -> tuple[TagHistory | None, str | None]:
        path = self.root / _tag_name(tag)
        if not path.is_file():
            return None, None
        text = path.read_bytes()
        return _parse_history(text, str(path)), hashlib.sha256(text).hexdigest()

    def write_tag(self, history: TagHistory, token: str | None) -> str:
        path = self.root / _tag_name(history.tag)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(f".{path.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            now = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
            if now != token:
                raise TagChanged(
                    f"{path} changed since it was read: another promotion of {history.tag!r} won"
                )
            temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            temporary.write_text(_dump(history))
            temporary.replace(path)
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

    def tag_histories(self) -> list[TagHistory]:
        return [
            _parse_history(self._read(key), f"s3://{self.bucket}/{key}")
            for key in sorted(self._keys(TAGS + "/"))
            if key.endswith(".json") and "/" not in key.removeprefix(self.root + TAGS + "/")
        ]

    def read_tag(self, tag: str) -> tuple[TagHistory | None, str | None]:
        key = self.root + _tag_name(tag)
        try:
            answer = self.s3.get_object(Bucket=self.bucket, Key=key)
        except ClientError as error:
            if error.response["Error"]["Code"] == "NoSuchKey":
                return None, None
            raise
        return _parse_history(answer["Body"].read(), f"s3://{self.bucket}/{key}"), answer["ETag"]

    def write_tag(self, history: TagHistory, token: str | None) -> str:
        key = self.root + _tag_name(history.tag)
        condition = {"IfMatch": token} if token is not None else {"IfNoneMatch": "*"}
        try:
            self.s3.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=_dump(history).encode(),
                ContentType="application/json",
                ServerSideEncryption="aws:kms",
                SSEKMSKeyId=self.kms_key_arn,
                **condition,
            )
        except ClientError as error:
            code = error.response["Error"]["Code"]
            if code == "ConditionalRequestConflict":  # 409: a conflicting write in flight; read again, retry
                raise TagBusy(f"s3://{self.bucket}/{key}: a conflicting write was in flight") from None
            if code in ("PreconditionFailed", "NoSuchKey"):  # 412: changed since read (404: deleted since)
                raise TagChanged(
                    f"s3://{self.bucket}/{key} changed since it was read: another promotion of {history.tag!r} won"
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
        self.events = sorted(
            (event for history in store.tag_histories() for event in history.events), key=lambda e: e.at
        )

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
        for attempt in range(SWAP_ATTEMPTS):
            history, token = self.store.read_tag(tag)
            events = history.events if history is not None else []
            current = events[-1].version if events else None
            if current is not None and current != self.tags().get(tag):
                raise TagChanged(
                    f"{tag!r} names {current} now, not {self.tags().get(tag)} as it did when this promotion began: "
                    "another promotion won; look (`models show`) and promote again if still wanted"
                )
            if current == found.record.version:
                return events[-1], None
            event = TagEvent(
                tag=tag,
                version=found.record.version,
                at=datetime.now(UTC).isoformat(timespec="microseconds"),
                by=self.store.caller(),
                previous=current,
            )
            try:
                where = self.store.write_tag(TagHistory(tag=tag, events=[*events, event]), token)
            except TagBusy:
                time.sleep(0.2 * 2**attempt)
                continue
            self.events.append(event)
            return event, where
        raise RegistryError(
            f"{tag!r}: S3 answered 409 ConditionalRequestConflict {SWAP_ATTEMPTS} times; another write of the tag "
            "keeps conflicting: try again"
        )
