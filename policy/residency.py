"""Data residency: nothing of the stack lives, replicates or is copied outside `trainstack:allowedRegions`.

The allowed regions reach the analyzer as an input of the stack's audit component (`trainstack:audit:Audit`,
`allowedRegions`, written from the validated config). Judged:
- the AWS providers' `region`, and any resource's own `region` input (pulumi-aws 7 lets each resource override the
  provider's region: the v7 upgrade guide, "Enhanced Region Support");
- S3 replication rules: the destination bucket must be a bucket of this program whose region is allowed (a bucket
  the program does not manage has no region the analyzer can see, so it is refused);
- ECR replication destinations, DynamoDB replicas, and copies into this region from elsewhere (EC2 `AmiCopy`,
  EBS `SnapshotCopy`) or out of it (AWS Backup copy actions, whose vault ARN names its region).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pulumi_policy import PolicyResource, ReportViolation, StackValidationArgs, StackValidationPolicy
from pulumi_policy.proxy import UnknownValueError

from policy.resources import as_list, of_type

AUDIT_COMPONENT = "trainstack:audit:Audit"
AWS_PROVIDER = "pulumi:providers:aws"
BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
BUCKET_REPLICATION = "aws:s3/bucketReplicationConfig:BucketReplicationConfig"
ECR_REPLICATION = "aws:ecr/replicationConfiguration:ReplicationConfiguration"
DYNAMODB_TABLE = "aws:dynamodb/table:Table"
AMI_COPY = "aws:ec2/amiCopy:AmiCopy"
SNAPSHOT_COPY = "aws:ebs/snapshotCopy:SnapshotCopy"
BACKUP_PLAN = "aws:backup/plan:Plan"


def _get(props: Mapping[str, Any], key: str) -> Any:
    try:
        return props.get(key)
    except UnknownValueError:  # computed at `pulumi up`: judged then
        return None


def allowed_regions(resources: Sequence[PolicyResource]) -> list[str] | None:
    for component in of_type(resources, [AUDIT_COMPONENT]):
        return [str(r) for r in as_list(_get(component.props, "allowedRegions"))]
    return None


def _arn_region(arn: Any) -> str | None:
    parts = str(arn).split(":") if arn else []
    return parts[3] or None if len(parts) > 4 and parts[0] == "arn" else None


def _bucket_region(bucket: PolicyResource, providers: Sequence[PolicyResource]) -> str | None:
    """A bucket's own `region`, else the region of the program's only AWS provider (the explicit one)."""
    own = _get(bucket.props, "region")
    if own:
        return str(own)
    regions = {str(_get(p.props, "region")) for p in providers if _get(p.props, "region")}
    return regions.pop() if len(regions) == 1 else None


def _replication_problems(
    config: PolicyResource, resources: Sequence[PolicyResource], allowed: list[str]
) -> Iterator[str]:
    destinations = [r for r in config.property_dependencies.get("rules", []) if r.resource_type in BUCKETS]
    rules = as_list(_get(config.props, "rules"))
    named = [((rule.get("destination") or {}).get("bucket")) for rule in rules if isinstance(rule, Mapping)]
    providers = of_type(resources, [AWS_PROVIDER])
    for bucket in destinations:
        region = _bucket_region(bucket, providers)
        if region not in allowed:
            yield f"replicates to bucket '{bucket.name}' in {region or 'an unknown region'}"
    if len(destinations) < len([n for n in named if n]):
        yield (
            "replicates to a bucket this program does not manage, whose region the policy cannot see; "
            "replicate only to a bucket declared in the stack"
        )


def _copy_problems(resource: PolicyResource, allowed: list[str]) -> Iterator[str]:
    props, kind = resource.props, resource.resource_type
    if kind == ECR_REPLICATION:
        configuration = _get(props, "replicationConfiguration") or {}
        for rule in as_list(configuration.get("rules")):
            for destination in as_list(rule.get("destinations")):
                if destination.get("region") not in allowed:
                    yield f"replicates images to {destination.get('region')}"
    elif kind == DYNAMODB_TABLE:
        for replica in as_list(_get(props, "replicas")):
            if replica.get("regionName") not in allowed:
                yield f"has a replica in {replica.get('regionName')}"
    elif kind in (AMI_COPY, SNAPSHOT_COPY):
        source = _get(props, "sourceAmiRegion" if kind == AMI_COPY else "sourceRegion")
        if source and source not in allowed:
            yield f"copies data in from {source}"
    elif kind == BACKUP_PLAN:
        for rule in as_list(_get(props, "rules")):
            for action in as_list(rule.get("copyActions")):
                region = _arn_region(action.get("destinationVaultArn"))
                if region and region not in allowed:
                    yield f"copies backups to a vault in {region}"


def validate_data_residency(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    allowed = allowed_regions(args.resources)
    if allowed is None:
        return  # not a trainstack program: nothing says where its data may live
    valid = ", ".join(allowed)
    for r in args.resources:
        region = _get(r.props, "region") if r.resource_type.startswith(("aws:", AWS_PROVIDER)) else None
        problems = [f"is in region {region}"] if region and str(region) not in allowed else []
        if r.resource_type == BUCKET_REPLICATION:
            problems += _replication_problems(r, args.resources, allowed)
        problems += _copy_problems(r, allowed)
        for problem in problems:
            report_violation(
                f"'{r.name}' {problem}, outside trainstack:allowedRegions ({valid}): keep it in an allowed "
                "region, or add the region to trainstack:allowedRegions if the data may live there",
                r.urn,
            )


data_residency = StackValidationPolicy(
    name="data-residency",
    description=(
        "Every regional resource, replication rule and cross-region copy stays within trainstack:allowedRegions."
    ),
    validate=validate_data_residency,
)
