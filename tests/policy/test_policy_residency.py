"""data-residency: regional resources, replication rules and cross-region copies stay in trainstack:allowedRegions."""

from __future__ import annotations

import json

import pytest

from policy.residency import data_residency

AUDIT = "trainstack:audit:Audit"
BUCKET = "aws:s3/bucket:Bucket"
REPLICATION = "aws:s3/bucketReplicationConfig:BucketReplicationConfig"


@pytest.fixture
def audit(resource):
    return resource(AUDIT, {"allowedRegions": ["us-east-1"]}, name="audit")


def provider(resource, region: str):
    return resource("pulumi:providers:aws", {"region": region}, name="aws")


def test_resources_in_the_allowed_region_pass(resource, violations, audit):
    bucket = resource(BUCKET, {}, name="datasets")
    assert violations(data_residency, audit, provider(resource, "us-east-1"), bucket) == []


def test_a_provider_outside_the_allowed_regions_is_refused(resource, violations, audit):
    [(name, message)] = violations(data_residency, audit, provider(resource, "eu-west-1"))
    assert (
        name == "aws"
        and "'aws' is in region eu-west-1, outside trainstack:allowedRegions (us-east-1)" in message
    )


def test_a_resource_with_its_own_region_outside_is_refused(resource, violations, audit):
    bucket = resource(BUCKET, {"region": "ap-south-1"}, name="copy")
    [(name, message)] = violations(data_residency, audit, provider(resource, "us-east-1"), bucket)
    assert name == "copy" and "is in region ap-south-1" in message


def test_replication_to_a_bucket_in_another_region_is_refused(resource, violations, audit):
    source = resource(BUCKET, {}, name="checkpoints")
    replica = resource(BUCKET, {"region": "eu-central-1"}, name="replica")
    rules = [{"id": "all", "status": "Enabled", "destination": {"bucket": "arn:aws:s3:::replica"}}]
    rule = resource(
        REPLICATION, {"bucket": "checkpoints", "rules": rules}, name="rep", fed_by={"rules": [replica]}
    )
    found = violations(data_residency, audit, provider(resource, "us-east-1"), source, replica, rule)
    assert ("rep", found[-1][1]) in found and "replicates to bucket 'replica' in eu-central-1" in found[-1][1]


def test_replication_to_a_bucket_in_an_allowed_region_passes(resource, violations):
    audit = resource(AUDIT, {"allowedRegions": ["us-east-1", "us-west-2"]}, name="audit")
    replica = resource(BUCKET, {"region": "us-west-2"}, name="replica")
    rules = [{"id": "all", "status": "Enabled", "destination": {"bucket": "arn:aws:s3:::replica"}}]
    rule = resource(
        REPLICATION, {"bucket": "checkpoints", "rules": rules}, name="rep", fed_by={"rules": [replica]}
    )
    assert violations(data_residency, audit, provider(resource, "us-east-1"), replica, rule) == []


def test_replication_to_a_bucket_the_stack_does_not_declare_is_refused(resource, violations, audit):
    rules = [{"id": "all", "status": "Enabled", "destination": {"bucket": "arn:aws:s3:::someone-elses"}}]
    rule = resource(REPLICATION, {"bucket": "checkpoints", "rules": rules}, name="rep")
    [(name, message)] = violations(data_residency, audit, provider(resource, "us-east-1"), rule)
    assert name == "rep" and "a bucket this program does not manage" in message


@pytest.mark.parametrize(
    ("type_", "props", "wanted"),
    [
        (
            "aws:ecr/replicationConfiguration:ReplicationConfiguration",
            {"replicationConfiguration": {"rules": [{"destinations": [{"region": "eu-west-1"}]}]}},
            "replicates images to eu-west-1",
        ),
        (
            "aws:dynamodb/table:Table",
            {"replicas": [{"regionName": "eu-west-1"}]},
            "has a replica in eu-west-1",
        ),
        ("aws:ec2/amiCopy:AmiCopy", {"sourceAmiRegion": "eu-west-1"}, "copies data in from eu-west-1"),
        ("aws:ebs/snapshotCopy:SnapshotCopy", {"sourceRegion": "eu-west-1"}, "copies data in from eu-west-1"),
        (
            "aws:backup/plan:Plan",
            {
                "rules": [
                    {"copyActions": [{"destinationVaultArn": "arn:aws:backup:eu-west-1:1:backup-vault:v"}]}
                ]
            },
            "copies backups to a vault in eu-west-1",
        ),
    ],
)
def test_cross_region_copies_are_refused(resource, violations, audit, type_, props, wanted):
    [(name, message)] = violations(data_residency, audit, resource(type_, props, name="copy"))
    assert name == "copy" and wanted in message


def test_same_region_copies_pass(resource, violations, audit):
    copy = resource("aws:ebs/snapshotCopy:SnapshotCopy", {"sourceRegion": "us-east-1"}, name="copy")
    assert violations(data_residency, audit, copy) == []


def test_a_program_without_the_audit_component_is_not_judged(resource, violations):
    assert violations(data_residency, provider(resource, "eu-west-1")) == []


def test_every_stack_passes_with_its_own_region_and_with_a_wider_list(planned, violations):
    for stack in ("dev", "staging", "prod"):
        assert violations(data_residency, *planned(stack)) == []
    widened = planned("prod", **{"trainstack:allowedRegions": json.dumps(["us-west-2", "eu-west-1"])})
    assert violations(data_residency, *widened) == []


def test_allowed_regions_without_the_stack_region_are_refused_before_any_resource():
    from infra.config import StackConfigError, parse_stack_config, read_stack_file

    with pytest.raises(StackConfigError, match="must include the stack's own region us-west-2"):
        parse_stack_config("prod", {**read_stack_file("prod"), "trainstack:allowedRegions": ["eu-west-1"]})
