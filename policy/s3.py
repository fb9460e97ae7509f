"""S3 buckets: encrypted with a customer-managed key, public access blocked, TLS only, versioned.

In pulumi-aws 7 a bucket's settings are separate resources (server-side encryption configuration, versioning,
public access block, bucket policy) whose `bucket` input names it, so these are stack policies: a setting belongs
to the buckets whose outputs feed its `bucket` input (`bucket=bucket.id`). A bucket's deprecated inline settings
(`server_side_encryption_configuration`, `versioning`, `policy`) count as well.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from pulumi_policy import PolicyResource, ReportViolation, StackValidationArgs, StackValidationPolicy

from policy import aws_types
from policy.iam import parse_document, statements
from policy.resources import as_list, is_customer_managed_key, of_type, referrers

KMS_ALGORITHMS = ("aws:kms", "aws:kms:dsse")
PUBLIC_ACCESS_SETTINGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")


def _settings(
    resources: Sequence[PolicyResource], types: str | Collection[str], bucket: PolicyResource
) -> list[PolicyResource]:
    return referrers(resources, as_list(types), "bucket", bucket)


def _encrypted_with_customer_managed_key(bucket: PolicyResource, resources: Sequence[PolicyResource]) -> bool:
    defaults = [
        rule.get("applyServerSideEncryptionByDefault")
        for configuration in _settings(resources, aws_types.BUCKET_ENCRYPTION, bucket)
        for rule in configuration.props.get("rules") or []
    ]
    inline = bucket.props.get("serverSideEncryptionConfiguration") or {}
    defaults += [rule.get("applyServerSideEncryptionByDefault") for rule in as_list(inline.get("rule"))]
    return any(
        default is not None
        and default.get("sseAlgorithm") in KMS_ALGORITHMS
        and is_customer_managed_key(default, "kmsMasterKeyId")
        for default in defaults
    )


def _public_access_blocked(bucket: PolicyResource, resources: Sequence[PolicyResource]) -> bool:
    return any(
        all(block.props.get(setting) is True for setting in PUBLIC_ACCESS_SETTINGS)
        for block in _settings(resources, aws_types.BUCKET_PUBLIC_ACCESS_BLOCK, bucket)
    )


def _denies_insecure_transport(statement: Mapping[str, Any]) -> bool:
    principal = statement.get("Principal")
    everyone = principal == "*" or (isinstance(principal, Mapping) and as_list(principal.get("AWS")) == ["*"])
    condition = (statement.get("Condition") or {}).get("Bool") or {}
    arns = [str(arn) for arn in as_list(statement.get("Resource"))]
    return (
        statement.get("Effect") == "Deny"
        and everyone
        and bool({"*", "s3:*"} & set(as_list(statement.get("Action"))))
        and [str(v).lower() for v in as_list(condition.get("aws:SecureTransport"))] == ["false"]
        # Both the bucket (ListBucket, ...) and its objects (GetObject, ...).
        and any(arn.endswith("/*") for arn in arns)
        and any(not arn.endswith("/*") for arn in arns)
    )


def _tls_only(bucket: PolicyResource, resources: Sequence[PolicyResource]) -> bool:
    texts = [p.props.get("policy") for p in _settings(resources, aws_types.BUCKET_POLICY, bucket)]
    texts.append(bucket.props.get("policy"))
    documents = [d for d in map(parse_document, texts) if d is not None]
    return any(_denies_insecure_transport(s) for d in documents for s in statements(d))


def _versioned(bucket: PolicyResource, resources: Sequence[PolicyResource]) -> bool:
    enabled = [
        (versioning.props.get("versioningConfiguration") or {}).get("status") == "Enabled"
        for versioning in _settings(resources, aws_types.BUCKET_VERSIONING, bucket)
    ]
    return any(enabled) or (bucket.props.get("versioning") or {}).get("enabled") is True


def bucket_policy(
    name: str, description: str, holds: Callable[[PolicyResource, Sequence[PolicyResource]], bool], fix: str
) -> StackValidationPolicy:
    """A stack policy that reports every bucket for which `holds(bucket, resources)` is false, with `fix`."""

    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        for bucket in of_type(args.resources, aws_types.BUCKETS):
            if not holds(bucket, args.resources):
                report_violation(f"S3 bucket '{bucket.name}' {fix}", bucket.urn)

    return StackValidationPolicy(name=name, description=description, validate=validate)


bucket_encryption = bucket_policy(
    "s3-cmk-encryption",
    "S3 buckets encrypt new objects with a customer-managed KMS key (SSE-KMS).",
    _encrypted_with_customer_managed_key,
    "is not encrypted with a customer-managed key: add aws.s3.BucketServerSideEncryptionConfiguration("
    "bucket=bucket.id, rules=[{'apply_server_side_encryption_by_default': {'sse_algorithm': 'aws:kms', "
    "'kms_master_key_id': <stack key ARN>}, 'bucket_key_enabled': True}]).",
)

public_access_blocked = bucket_policy(
    "s3-public-access-blocked",
    "S3 buckets block every form of public access (all four public access block settings on).",
    _public_access_blocked,
    "does not block public access: add aws.s3.BucketPublicAccessBlock(bucket=bucket.id, block_public_acls=True, "
    "block_public_policy=True, ignore_public_acls=True, restrict_public_buckets=True).",
)

tls_only = bucket_policy(
    "s3-tls-only",
    "S3 buckets have a bucket policy that denies every request not made over TLS.",
    _tls_only,
    "accepts requests without TLS: add aws.s3.BucketPolicy(bucket=bucket.id) with a statement "
    "{'Effect': 'Deny', 'Principal': '*', 'Action': 's3:*', 'Resource': [<bucket ARN>, <bucket ARN>/*], "
    "'Condition': {'Bool': {'aws:SecureTransport': 'false'}}}.",
)

versioning = bucket_policy(
    "s3-versioning",
    "S3 buckets keep object versions, so an overwrite or delete can be undone.",
    _versioned,
    "is not versioned: add aws.s3.BucketVersioning(bucket=bucket.id, "
    "versioning_configuration={'status': 'Enabled'}).",
)
