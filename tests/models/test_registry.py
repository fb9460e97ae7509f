"""The registry: versions found under a local directory and in a KMS-encrypted, versioned checkpoints bucket
(moto), tags that move by one compare-and-swap of the tag's own file, and a history that keeps every promotion;
of two concurrent promotions one wins, and S3's retryable 409 is retried (botocore's Stubber: moto never answers
it)."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from tests.checkpoint.test_version import config, prepared
from tests.support.training import sealed_checkpoint
from trainer.checkpoint.version import RECORD, Lineage, write_record
from trainer.models.registry import (
    NEWEST,
    TAGS,
    LocalStore,
    Registry,
    RegistryError,
    S3Store,
    TagChanged,
    TagEvent,
    TagHistory,
)

REGION = "us-east-1"
BUCKET = "trainstack-test-checkpoints"


@pytest.fixture(scope="module")
def lineage(tmp_path_factory) -> Lineage:
    prefix = prepared(tmp_path_factory.mktemp("data"), "some text to train on. " * 50)
    return Lineage(config(prefix, prefix + ".tokenizer.json"), environ={})


@pytest.fixture
def runs(tmp_path, lineage) -> Path:
    """runs/tiny/checkpoints with two published, recorded checkpoints (steps 5 and 10)."""
    for step, loss in ((5, 3.0), (10, 2.0)):
        checkpoint = sealed_checkpoint(tmp_path / "runs" / "tiny" / "checkpoints" / f"iter_{step:07d}", loss)
        write_record(checkpoint, lineage.record(checkpoint, step, {"val_loss": loss}))
    return tmp_path / "runs"


def versions(registry: Registry) -> list[str]:
    return [found.record.version for found in registry.versions]


def test_local_versions_are_found_under_the_directory(runs):
    registry = Registry(LocalStore(runs))
    assert [v.split("-")[:2] for v in versions(registry)] == [["tiny", "s5"], ["tiny", "s10"]]
    assert registry.versions[1].location == str(runs / "tiny" / "checkpoints" / "iter_0000010")
    assert registry.tags() == {}


def test_promote_moves_a_tag_by_appending_events_and_keeps_its_history(runs):
    registry = Registry(LocalStore(runs))
    first, second = versions(registry)
    registry.promote(first, "production")
    registry.promote(second, "staging")
    registry.promote("staging", "production")  # a tag's version promoted to another tag
    again = Registry(LocalStore(runs))  # read back from the files
    assert again.tags() == {"production": second, "staging": second}
    assert again.find("production").record.version == second
    assert [(e.version, e.previous) for e in again.history("production")] == [(first, None), (second, first)]
    assert len(json.loads((runs / TAGS / "production.json").read_text())["events"]) == 2
    assert again.tags_of(second) == ["production", "staging"]


def test_newest_names_the_newest_version_and_a_repeated_promotion_appends_nothing(runs):
    registry = Registry(LocalStore(runs))
    first, second = versions(registry)
    assert registry.find(NEWEST).record.version == second
    event, where = registry.promote(NEWEST, "candidate")
    assert (event.version, where is not None) == (second, True)
    again, where = Registry(LocalStore(runs)).promote(NEWEST, "candidate")  # a pipeline run again
    assert (again, where) == (event, None)
    assert len(json.loads((runs / TAGS / "candidate.json").read_text())["events"]) == 1
    with pytest.raises(RegistryError, match=r"--tag 'newest': .*not 'newest'"):
        registry.promote(first, NEWEST)


def test_an_unknown_version_or_a_bad_tag_is_refused_with_what_would_be_valid(runs):
    registry = Registry(LocalStore(runs))
    first = versions(registry)[0]
    with pytest.raises(
        RegistryError, match=r"no model version or tag 'nope' .* versions \(newest\): tiny-s5-"
    ):
        registry.find("nope")
    with pytest.raises(RegistryError, match=r"--tag 'Prod!': use lowercase letters.*e\.g\. production"):
        registry.promote(first, "Prod!")
    with pytest.raises(RegistryError, match="a tag needs a name of its own"):
        registry.promote(first, first)
    with pytest.raises(RegistryError, match=r"--dir .*: no such directory"):
        LocalStore(runs / "missing")


def test_of_two_concurrent_promotions_of_one_tag_one_wins_and_the_other_is_refused(runs):
    """Both read the tag before either writes (two `models promote` at once): the second write finds the tag
    changed since its read and is refused naming the winner, instead of both succeeding past each other."""
    first, second = versions(Registry(LocalStore(runs)))
    one, other = Registry(LocalStore(runs)), Registry(LocalStore(runs))
    one.promote(first, "production")
    with pytest.raises(TagChanged, match=f"'production' names {first} now, not None.*another promotion won"):
        other.promote(second, "production")
    history = Registry(LocalStore(runs)).history("production")
    assert [(e.version, e.previous) for e in history] == [(first, None)]


def test_a_local_write_from_a_stale_read_is_refused(runs):
    store = LocalStore(runs)
    event = TagEvent(
        tag="production", version="v", at="2026-12-04T22:00:00.000001+00:00", by="me", previous=None
    )
    store.write_tag(TagHistory(tag="production", events=[event]), None)
    with pytest.raises(TagChanged, match="changed since it was read"):
        store.write_tag(
            TagHistory(tag="production", events=[event, event]), None
        )  # read before the first write
    history, token = store.read_tag("production")
    assert history is not None and [e.version for e in history.events] == ["v"]
    store.write_tag(TagHistory(tag="production", events=[event, event]), token)


@pytest.fixture
def bucket():
    """The stack's checkpoints bucket as infra/ makes it: versioned, SSE-KMS with the stack key by default."""
    with mock_aws():
        kms = boto3.client("kms", region_name=REGION)
        key = kms.create_key(Description="trainstack-test")["KeyMetadata"]["Arn"]
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        s3.put_bucket_encryption(
            Bucket=BUCKET,
            ServerSideEncryptionConfiguration={
                "Rules": [
                    {"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key}}
                ]
            },
        )
        yield s3, key


def exported(s3, runs: Path) -> None:
    """What FSx's auto-export puts in the bucket for /fsx/checkpoints/<run>/...: the same relative keys."""
    for path in sorted(p for p in runs.rglob("*") if p.is_file()):
        s3.put_object(Bucket=BUCKET, Key=str(path.relative_to(runs)), Body=path.read_bytes())


def test_s3_versions_and_tags_are_read_and_promotions_written_encrypted_to_the_tags_own_object(bucket, runs):
    s3, key = bucket
    exported(s3, runs)
    store = S3Store(s3, boto3.client("sts", region_name=REGION), BUCKET, key)
    registry = Registry(store)
    first, second = versions(registry)
    assert registry.versions[0].location == f"s3://{BUCKET}/tiny/checkpoints/iter_0000005"
    event, where = registry.promote(first, "production")
    registry.promote(second, "production")
    assert event.by.startswith("arn:aws:")
    written = s3.get_object(Bucket=BUCKET, Key=where.removeprefix(f"s3://{BUCKET}/"))
    assert (written["ServerSideEncryption"], written["SSEKMSKeyId"]) == ("aws:kms", key)
    assert [e["version"] for e in json.loads(written["Body"].read())["events"]] == [first, second]
    again = Registry(S3Store(s3, boto3.client("sts", region_name=REGION), BUCKET, key))
    assert again.find("production").record.version == second
    assert [e.version for e in again.history("production")] == [first, second]
    keys = [v["Key"] for v in s3.list_object_versions(Bucket=BUCKET, Prefix=TAGS)["Versions"]]
    assert keys == [f"{TAGS}/production.json"] * 2  # one object, each promotion a version of it


def test_a_teams_store_reads_and_writes_only_under_its_prefix(bucket, runs):
    """models --stack --team: the team's runs are exported under teams/<team>/ (trainer/contract/teams.py)."""
    s3, key = bucket
    for path in sorted(p for p in runs.rglob("*") if p.is_file()):
        relative = str(path.relative_to(runs))
        s3.put_object(Bucket=BUCKET, Key=f"teams/vision/{relative}", Body=path.read_bytes())
        if "iter_0000005" in relative:  # another team's run of the same name: not vision's
            s3.put_object(Bucket=BUCKET, Key=f"teams/speech/{relative}", Body=path.read_bytes())
    store = S3Store(s3, boto3.client("sts", region_name=REGION), BUCKET, key, root="teams/vision/")
    registry = Registry(store)
    assert store.where == f"s3://{BUCKET}/teams/vision"
    assert [f.location for f in registry.versions] == [
        f"s3://{BUCKET}/teams/vision/tiny/checkpoints/iter_0000005",
        f"s3://{BUCKET}/teams/vision/tiny/checkpoints/iter_0000010",
    ]
    _, where = registry.promote(versions(registry)[1], "production")
    assert where == f"s3://{BUCKET}/teams/vision/{TAGS}/production.json"
    assert Registry(store).tags() == {"production": versions(registry)[1]}


def test_s3_evaluations_beside_a_record_are_read(bucket, runs):
    s3, key = bucket
    checkpoint = runs / "tiny" / "checkpoints" / "iter_0000010"
    from trainer.checkpoint.version import add_evaluation

    add_evaluation(checkpoint, "heldout", {"perplexity": 7.5})
    exported(s3, runs)
    registry = Registry(S3Store(s3, boto3.client("sts", region_name=REGION), BUCKET, key))
    found = registry.versions[1]
    assert [e["results"] for e in found.evaluations] == [{"perplexity": 7.5}]
    assert (checkpoint / RECORD).is_file() and registry.versions[0].evaluations == []


def test_s3_a_promotion_from_a_stale_read_gets_412_and_is_refused(bucket, runs):
    """moto 5.2.5 answers PutObject's If-Match with 412 PreconditionFailed when the ETag changed (as S3 does)."""
    s3, key = bucket
    exported(s3, runs)
    sts = boto3.client("sts", region_name=REGION)
    one, other = Registry(S3Store(s3, sts, BUCKET, key)), Registry(S3Store(s3, sts, BUCKET, key))
    first, second = versions(one)
    one.promote(first, "production")
    store = S3Store(s3, sts, BUCKET, key)
    history, etag = store.read_tag("production")
    assert history is not None
    one.promote(second, "production")  # the tag moves after `store` read it
    with pytest.raises(TagChanged, match="changed since it was read"):
        store.write_tag(TagHistory(tag="production", events=history.events), etag)
    with pytest.raises(TagChanged, match=f"names {second} now, not None"):
        other.promote(second, "production")
    assert [e.version for e in Registry(S3Store(s3, sts, BUCKET, key)).history("production")] == [
        first,
        second,
    ]


def test_s3_a_409_conditional_request_conflict_is_read_again_and_retried_not_reported(bucket, runs):
    """S3's 409 ConditionalRequestConflict means a conflicting write was in flight: "fetch the object's ETag and
    retry" (S3 API reference, PutObject If-Match). moto never answers it, so the first PutObject is answered 409
    by a botocore `before-call` handler (the hook botocore's Stubber answers through); everything else is moto."""
    from botocore.awsrequest import AWSResponse

    s3, key = bucket
    exported(s3, runs)
    registry = Registry(S3Store(s3, boto3.client("sts", region_name=REGION), BUCKET, key))
    first, second = versions(registry)
    registry.promote(first, "production")
    answered = []

    def conflict_once(**_):
        if answered:
            return None  # the call goes to moto
        answered.append(409)
        error = {"Code": "ConditionalRequestConflict", "Message": "A conflicting operation occurred"}
        return AWSResponse("https://s3", 409, {}, None), {
            "Error": error,
            "ResponseMetadata": {"HTTPStatusCode": 409},
        }

    s3.meta.events.register("before-call.s3.PutObject", conflict_once)
    event, where = registry.promote(second, "production")
    s3.meta.events.unregister("before-call.s3.PutObject", conflict_once)
    assert answered == [409] and (event.version, event.previous) == (second, first)
    again = Registry(S3Store(s3, boto3.client("sts", region_name=REGION), BUCKET, key))
    assert [e.version for e in again.history("production")] == [first, second]
    assert where == f"s3://{BUCKET}/{TAGS}/production.json"
