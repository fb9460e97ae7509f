"""Encryption at rest with a customer-managed KMS key, and KMS keys that rotate.

A key of our own, not an AWS-managed one (`aws/logs`, `aws/fsx`, `aws/ebs`, `aws/ecr`), is what lets the key policy
say who may read the data, shows every use in CloudTrail, and revokes all access at once when it is disabled.
S3 buckets are judged by a stack policy in policy/s3.py: their encryption is a separate resource.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pulumi_policy import ReportViolation, ResourceValidationArgs, ResourceValidationPolicy

from policy import aws_types
from policy.resources import is_customer_managed_key

KMS_ENCRYPTION_TYPES = ("KMS", "KMS_DSSE")
# Asymmetric and HMAC keys cannot rotate automatically.
ROTATABLE_KEY_SPEC = "SYMMETRIC_DEFAULT"


def _log_group(props: Mapping[str, Any]) -> str | None:
    if not is_customer_managed_key(props, "kmsKeyId"):
        return "is not encrypted with a customer-managed key: set kms_key_id to the stack key's ARN"
    return None


def _lustre_file_system(props: Mapping[str, Any]) -> str | None:
    # SCRATCH file systems always use an FSx-managed key; only persistent ones accept ours.
    if str(props.get("deploymentType", "")).startswith("PERSISTENT") and not is_customer_managed_key(
        props, "kmsKeyId"
    ):
        return f"({props['deploymentType']}) uses the FSx-managed key: set kms_key_id to the stack key's ARN"
    return None


def _launch_template(props: Mapping[str, Any]) -> str | None:
    volumes = [m for m in props.get("blockDeviceMappings") or [] if m.get("ebs") is not None]
    if not volumes:
        return (
            "maps no EBS volume, so nodes boot from the AMI's snapshot, encrypted only if the account's default "
            "says so: add a block_device_mappings entry for the root device with "
            "ebs={'encrypted': 'true', 'kms_key_id': <stack key ARN>}"
        )
    unencrypted = [
        m.get("deviceName", f"mapping {i}")
        for i, m in enumerate(volumes)
        if str(m["ebs"].get("encrypted")).lower() != "true"
        or not is_customer_managed_key(m["ebs"], "kmsKeyId")
    ]
    if unencrypted:
        return (
            f"maps EBS volume(s) {', '.join(unencrypted)} without a customer-managed key: "
            "set ebs={'encrypted': 'true', 'kms_key_id': <stack key ARN>}"
        )
    return None


def _repository(props: Mapping[str, Any]) -> str | None:
    configurations = props.get("encryptionConfigurations") or [{}]
    configuration = configurations[0]
    if configuration.get("encryptionType") not in KMS_ENCRYPTION_TYPES or not is_customer_managed_key(
        configuration, "kmsKey"
    ):
        return (
            "is not encrypted with a customer-managed key: "
            "set encryption_configurations=[{'encryption_type': 'KMS', 'kms_key': <stack key ARN>}]"
        )
    return None


AT_REST: dict[str, tuple[str, Callable[[Mapping[str, Any]], str | None]]] = {
    aws_types.LOG_GROUP: ("CloudWatch log group", _log_group),
    aws_types.LUSTRE_FILE_SYSTEM: ("FSx for Lustre file system", _lustre_file_system),
    aws_types.LAUNCH_TEMPLATE: ("Launch template", _launch_template),
    aws_types.REPOSITORY: ("ECR repository", _repository),
}


def validate_encryption_at_rest(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type not in AT_REST:
        return
    noun, check = AT_REST[args.resource_type]
    problem = check(args.props)
    if problem:
        report_violation(f"{noun} '{args.name}' {problem}.", None)


def validate_key_rotation(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type != aws_types.KMS_KEY:
        return
    spec = args.props.get("customerMasterKeySpec") or ROTATABLE_KEY_SPEC
    if spec == ROTATABLE_KEY_SPEC and args.props.get("enableKeyRotation") is not True:
        report_violation(f"KMS key '{args.name}' does not rotate: set enable_key_rotation=True.", None)


encryption_at_rest = ResourceValidationPolicy(
    name="cmk-encryption-at-rest",
    description=(
        "CloudWatch log groups, persistent FSx for Lustre, EBS volumes of launch templates and ECR repositories "
        "are encrypted with a customer-managed KMS key."
    ),
    validate=validate_encryption_at_rest,
)

key_rotation = ResourceValidationPolicy(
    name="kms-key-rotation",
    description="Symmetric customer-managed KMS keys rotate their key material automatically.",
    validate=validate_key_rotation,
)
