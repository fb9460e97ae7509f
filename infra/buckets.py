"""What every bucket of the stack has, whatever it holds (policy/s3.py checks each): the stack key with an S3 Bucket
Key, versioning, public access blocked, and a policy that refuses requests without TLS (its first statement)."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_aws as aws


def deny_insecure_transport(bucket: aws.s3.Bucket) -> dict[str, Any]:
    """S3 User Guide, "Security best practices for Amazon S3": deny any request without TLS (aws:SecureTransport)."""
    return {
        "Sid": "DenyInsecureTransport",
        "Effect": "Deny",
        "Principal": "*",
        "Action": "s3:*",
        "Resource": [bucket.arn, pulumi.Output.concat(bucket.arn, "/*")],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }


def private_encrypted_versioned(
    name: str, bucket: aws.s3.Bucket, key_arn: pulumi.Input[str], parent: pulumi.Resource
) -> tuple[aws.s3.BucketVersioning, aws.s3.BucketPublicAccessBlock]:
    """The bucket's default encryption, versioning and public access block, children of `parent`."""
    child = pulumi.ResourceOptions(parent=parent)
    aws.s3.BucketServerSideEncryptionConfiguration(
        name,
        bucket=bucket.id,
        rules=[
            {
                "apply_server_side_encryption_by_default": {
                    "sse_algorithm": "aws:kms",
                    "kms_master_key_id": key_arn,
                },
                # One data key per bucket instead of a KMS call per object: cheaper, and fewer throttles.
                "bucket_key_enabled": True,
            }
        ],
        opts=child,
    )
    versioning = aws.s3.BucketVersioning(
        name, bucket=bucket.id, versioning_configuration={"status": "Enabled"}, opts=child
    )
    public_access = aws.s3.BucketPublicAccessBlock(
        name,
        bucket=bucket.id,
        block_public_acls=True,
        block_public_policy=True,
        ignore_public_acls=True,
        restrict_public_buckets=True,
        opts=child,
    )
    return versioning, public_access
