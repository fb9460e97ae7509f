"""S3 stack policies: a bucket's separate settings resources, related to it through property dependencies."""

from __future__ import annotations

import json

import pytest
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

from policy.s3 import bucket_encryption, public_access_blocked, tls_only, versioning

BUCKET = "aws:s3/bucket:Bucket"
KEY_ARN = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
ARN = "arn:aws:s3:::datasets"
DENY_INSECURE_TRANSPORT = {
    "Sid": "DenyInsecureTransport",
    "Effect": "Deny",
    "Principal": "*",
    "Action": "s3:*",
    "Resource": [ARN, f"{ARN}/*"],
    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
}


def document(*statements):
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


@pytest.fixture
def bucket(resource):
    return resource(BUCKET, {}, name="datasets")


@pytest.fixture
def setting(resource, bucket):
    """A settings resource of `bucket`: its `bucket` input is fed by the bucket's id."""
    return lambda type_, props, name="datasets": resource(
        f"aws:s3/{type_[0].lower()}{type_[1:]}:{type_}",
        {"bucket": "datasets", **props},
        name,
        fed_by={"bucket": [bucket]},
    )


def encryption(algorithm="aws:kms", key=KEY_ARN):
    default = {"sseAlgorithm": algorithm, **({"kmsMasterKeyId": key} if key else {})}
    return {"rules": [{"applyServerSideEncryptionByDefault": default, "bucketKeyEnabled": True}]}


def test_bucket_encrypted_with_the_stack_key_passes(violations, bucket, setting):
    config = setting("BucketServerSideEncryptionConfiguration", encryption())
    assert violations(bucket_encryption, bucket, config) == []


def test_bucket_key_unknown_in_preview_still_counts_as_set(violations, bucket, setting):
    config = setting("BucketServerSideEncryptionConfiguration", encryption(key=UNKNOWN_STRING_VALUE))
    assert violations(bucket_encryption, bucket, config) == []


@pytest.mark.parametrize(
    "props", [encryption(algorithm="AES256", key=None), encryption(key=None), encryption(key="alias/aws/s3")]
)
def test_bucket_with_s3_or_aws_managed_keys_is_a_violation(violations, bucket, setting, props):
    config = setting("BucketServerSideEncryptionConfiguration", props)
    [(name, message)] = violations(bucket_encryption, bucket, config)
    assert name == "datasets" and "BucketServerSideEncryptionConfiguration(" in message


def test_encryption_of_another_bucket_does_not_count(resource, violations, bucket):
    other = resource(BUCKET, {}, name="checkpoints")
    config = resource(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        {"bucket": "checkpoints", **encryption()},
        fed_by={"bucket": [other]},
    )
    assert [name for name, _ in violations(bucket_encryption, bucket, other, config)] == ["datasets"]


def test_inline_encryption_of_the_deprecated_bucket_form_counts(resource, violations):
    inline = {
        "rule": {"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms", "kmsMasterKeyId": KEY_ARN}}
    }
    bucket = resource("aws:s3/bucketV2:BucketV2", {"serverSideEncryptionConfiguration": inline})
    assert violations(bucket_encryption, bucket) == []


ALL_BLOCKED = {
    "blockPublicAcls": True,
    "blockPublicPolicy": True,
    "ignorePublicAcls": True,
    "restrictPublicBuckets": True,
}


def test_bucket_with_all_four_public_access_blocks_passes(violations, bucket, setting):
    assert violations(public_access_blocked, bucket, setting("BucketPublicAccessBlock", ALL_BLOCKED)) == []


@pytest.mark.parametrize("off", sorted(ALL_BLOCKED))
def test_bucket_with_any_public_access_setting_off_is_a_violation(violations, bucket, setting, off):
    block = setting("BucketPublicAccessBlock", {**ALL_BLOCKED, off: False})
    [(_, message)] = violations(public_access_blocked, bucket, block)
    assert "restrict_public_buckets=True" in message


def test_bucket_without_public_access_block_is_a_violation(violations, bucket):
    assert [name for name, _ in violations(public_access_blocked, bucket)] == ["datasets"]


def test_bucket_policy_denying_insecure_transport_passes(violations, bucket, setting):
    policy = setting("BucketPolicy", {"policy": document(DENY_INSECURE_TRANSPORT)})
    assert violations(tls_only, bucket, policy) == []


@pytest.mark.parametrize(
    "statement",
    [
        {**DENY_INSECURE_TRANSPORT, "Effect": "Allow"},
        {**DENY_INSECURE_TRANSPORT, "Action": "s3:GetObject"},
        {**DENY_INSECURE_TRANSPORT, "Principal": {"AWS": "arn:aws:iam::123456789012:root"}},
        {**DENY_INSECURE_TRANSPORT, "Resource": f"{ARN}/*"},  # objects only: ListBucket still over plain HTTP
        {**DENY_INSECURE_TRANSPORT, "Condition": {"Bool": {"aws:SecureTransport": "true"}}},
    ],
)
def test_bucket_policy_not_denying_all_insecure_requests_is_a_violation(
    violations, bucket, setting, statement
):
    policy = setting("BucketPolicy", {"policy": document(statement)})
    [(_, message)] = violations(tls_only, bucket, policy)
    assert "aws:SecureTransport" in message


def test_bucket_without_policy_is_a_violation(violations, bucket):
    assert [name for name, _ in violations(tls_only, bucket)] == ["datasets"]


def test_versioned_bucket_passes(violations, bucket, setting):
    enabled = setting("BucketVersioning", {"versioningConfiguration": {"status": "Enabled"}})
    assert violations(versioning, bucket, enabled) == []


@pytest.mark.parametrize("status", ["Suspended", "Disabled"])
def test_bucket_with_versioning_off_is_a_violation(violations, bucket, setting, status):
    off = setting("BucketVersioning", {"versioningConfiguration": {"status": status}})
    [(_, message)] = violations(versioning, bucket, off)
    assert "versioning_configuration={'status': 'Enabled'}" in message
