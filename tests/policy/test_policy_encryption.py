"""cmk-encryption-at-rest and kms-key-rotation, on hand-built inputs in wire form."""

from __future__ import annotations

import pytest
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

from policy.encryption import encryption_at_rest, key_rotation

KEY_ARN = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
REPOSITORY = "aws:ecr/repository:Repository"


def root_volume(**ebs):
    return {"blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"volumeSize": 200.0, **ebs}}]}


@pytest.mark.parametrize(
    ("type_", "props"),
    [
        (LOG_GROUP, {"kmsKeyId": KEY_ARN}),
        (LUSTRE, {"deploymentType": "PERSISTENT_2", "kmsKeyId": KEY_ARN}),
        (LUSTRE, {"deploymentType": "SCRATCH_2"}),  # scratch file systems cannot take a key of ours
        (LAUNCH_TEMPLATE, root_volume(encrypted="true", kmsKeyId=KEY_ARN)),
        (REPOSITORY, {"encryptionConfigurations": [{"encryptionType": "KMS", "kmsKey": KEY_ARN}]}),
        # In a real preview the key's ARN is unknown until it exists: set all the same.
        (LOG_GROUP, {"kmsKeyId": UNKNOWN_STRING_VALUE}),
    ],
)
def test_data_encrypted_with_a_customer_managed_key_passes(resource, violations, type_, props):
    assert violations(encryption_at_rest, resource(type_, props)) == []


@pytest.mark.parametrize(
    ("type_", "props", "fix"),
    [
        (LOG_GROUP, {"retentionInDays": 30.0}, "set kms_key_id"),
        (LOG_GROUP, {"kmsKeyId": "alias/aws/logs"}, "set kms_key_id"),
        (LUSTRE, {"deploymentType": "PERSISTENT_2"}, "uses the FSx-managed key"),
        (LAUNCH_TEMPLATE, root_volume(encrypted="true"), "/dev/xvda without a customer-managed key"),
        (LAUNCH_TEMPLATE, root_volume(encrypted="false", kmsKeyId=KEY_ARN), "/dev/xvda without"),
        (LAUNCH_TEMPLATE, {"metadataOptions": {"httpTokens": "required"}}, "maps no EBS volume"),
        (REPOSITORY, {"imageTagMutability": "IMMUTABLE"}, "encryption_type': 'KMS'"),
        (REPOSITORY, {"encryptionConfigurations": [{"encryptionType": "KMS"}]}, "'kms_key'"),
    ],
)
def test_data_without_a_customer_managed_key_is_a_violation(resource, violations, type_, props, fix):
    [(name, message)] = violations(encryption_at_rest, resource(type_, props, name="data"))
    assert name == "data" and fix in message and "'data'" in message


def test_other_resource_types_are_not_judged_for_encryption(resource, violations):
    assert violations(encryption_at_rest, resource("aws:ec2/vpc:Vpc", {"cidrBlock": "10.0.0.0/16"})) == []


def test_symmetric_key_that_rotates_passes(resource, violations):
    assert violations(key_rotation, resource("aws:kms/key:Key", {"enableKeyRotation": True})) == []


def test_key_without_rotation_is_a_violation(resource, violations):
    [(_, message)] = violations(
        key_rotation, resource("aws:kms/key:Key", {"description": "k"}, name="stack-key")
    )
    assert message == "KMS key 'stack-key' does not rotate: set enable_key_rotation=True."


def test_asymmetric_key_is_exempt_from_rotation(resource, violations):
    signing = resource("aws:kms/key:Key", {"customerMasterKeySpec": "RSA_2048", "keyUsage": "SIGN_VERIFY"})
    assert violations(key_rotation, signing) == []
