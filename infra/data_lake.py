"""The S3 data lake: a datasets bucket and a checkpoints bucket, encrypted with the stack key, TLS only, versioned.

Lifecycle on both: incomplete multipart uploads are aborted after a week (checkpoint shards are large multipart
uploads that a killed job leaves behind), noncurrent versions expire after `noncurrentVersionExpirationDays`.
With `protectData` (prod) the buckets are protected and retained when the stack is destroyed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pulumi
import pulumi_aws as aws

from infra.config import StackConfig
from infra.iam import policy_document

if TYPE_CHECKING:
    from infra.keys import Keys

ABORT_INCOMPLETE_UPLOADS_AFTER_DAYS = 7


@dataclass
class DataLakeArgs:
    config: StackConfig
    keys: Keys


class DataLake(pulumi.ComponentResource):
    """`datasets` (tokenized shards, read by jobs through FSx) and `checkpoints` (exported from FSx)."""

    def __init__(self, name: str, args: DataLakeArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainstack:data_lake:DataLake", name, None, opts)
        self.datasets = self._bucket("datasets", args)
        self.checkpoints = self._bucket("checkpoints", args)
        self.register_outputs(
            {"datasets_bucket": self.datasets.bucket, "checkpoints_bucket": self.checkpoints.bucket}
        )

    def _bucket(self, purpose: str, args: DataLakeArgs) -> aws.s3.Bucket:
        cfg, name = args.config, f"{args.config.name_prefix}-{purpose}"
        child = pulumi.ResourceOptions(parent=self)
        bucket = aws.s3.Bucket(
            name,
            opts=pulumi.ResourceOptions(
                parent=self, protect=cfg.protect_data, retain_on_delete=cfg.protect_data
            ),
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            name,
            bucket=bucket.id,
            rules=[
                {
                    "apply_server_side_encryption_by_default": {
                        "sse_algorithm": "aws:kms",
                        "kms_master_key_id": args.keys.key.arn,
                    },
                    # One data key per bucket instead of a KMS call per object: cheaper, and fewer throttles.
                    "bucket_key_enabled": True,
                }
            ],
            opts=child,
        )
        aws.s3.BucketVersioning(
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
        aws.s3.BucketPolicy(
            name,
            bucket=bucket.id,
            policy=policy_document(
                {
                    "Sid": "DenyInsecureTransport",
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": "s3:*",
                    "Resource": [bucket.arn, pulumi.Output.concat(bucket.arn, "/*")],
                    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                }
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[public_access]),
        )
        aws.s3.BucketLifecycleConfiguration(
            name,
            bucket=bucket.id,
            rules=[
                {
                    "id": "abort-incomplete-multipart-uploads",
                    "status": "Enabled",
                    "filter": {},
                    "abort_incomplete_multipart_upload": {
                        "days_after_initiation": ABORT_INCOMPLETE_UPLOADS_AFTER_DAYS
                    },
                },
                {
                    "id": "expire-noncurrent-versions",
                    "status": "Enabled",
                    "filter": {},
                    "noncurrent_version_expiration": {
                        "noncurrent_days": cfg.noncurrent_version_expiration_days
                    },
                },
            ],
            opts=child,
        )
        return bucket
