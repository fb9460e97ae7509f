"""Data residency at submission: the run's datasets and checkpoints buckets must live in the stack's allowed regions.

The allowed regions are the stack's `allowed_regions` output (`trainstack:allowedRegions`, default the stack's own
region). Each bucket's region is S3's answer to GetBucketLocation (S3 API reference: `LocationConstraint` is null
for us-east-1 and `EU` for buckets made in eu-west-1 with the old name), asked before anything is submitted.
"""

from __future__ import annotations

from trainer.aws.clients import client
from trainer.aws.outputs import StackOutputs

# GetBucketLocation's legacy answers and the regions they mean (S3 API reference, GetBucketLocation).
LEGACY_LOCATIONS = {None: "us-east-1", "": "us-east-1", "EU": "eu-west-1"}


def allowed_regions(outputs: StackOutputs) -> list[str]:
    """The regions the stack's data may live in; stacks deployed before the output existed allow their own."""
    regions = outputs.values.get("allowed_regions")
    return [str(r) for r in regions] if isinstance(regions, list) and regions else [outputs.region]


def bucket_region(bucket: str, region: str) -> str:
    location = client("s3", region).get_bucket_location(Bucket=bucket).get("LocationConstraint")
    return LEGACY_LOCATIONS.get(location, location)


def residency_problems(outputs: StackOutputs) -> list[str]:
    """One line per bucket of the run that lives outside the allowed regions."""
    allowed = allowed_regions(outputs)
    problems = []
    for what, output in (("dataset", "datasets_bucket"), ("checkpoint", "checkpoints_bucket")):
        bucket = outputs[output]
        region = bucket_region(bucket, outputs.region)
        if region not in allowed:
            problems.append(
                f"{what} location s3://{bucket} ({output}) is in {region}, outside stack {outputs.stack!r}'s "
                f"allowed regions {', '.join(allowed)} (trainstack:allowedRegions): keep the data in a bucket "
                "of an allowed region, or allow the region in the stack config if the data may live there"
            )
    return problems
