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

from infra.buckets import deny_insecure_transport, private_encrypted_versioned
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
        _, public_access = private_encrypted_versioned(name, bucket, args.keys.key.arn, self)
        aws.s3.BucketPolicy(
            name,
            bucket=bucket.id,
            policy=policy_document(deny_insecure_transport(bucket)),
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
