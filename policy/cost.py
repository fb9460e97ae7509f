"""Every resource that costs money carries the stack's cost-allocation tags, and none is activated by the program.

AWS splits costs by tag only for resources that carry the tag (AWS Billing User Guide, "Using user-defined cost
allocation tags"): the stack's budget (infra/budget.py), which filters on `stack`, and any cost report by project
miss an untagged NAT gateway or file system. A resource's tags are its own `tags` plus its provider's default tags
(the stack's provider sets them: infra/__main__.py). Default tags do not reach what Batch launches: the compute
environment's `computeResources.tags` do (AWS Batch API reference, ComputeResource.tags: "tags that are applied to
EC2 resources that are launched in the compute environment"), and a launch template's instance tag specification.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pulumi_policy import (
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError

from policy import aws_types

# The stack's cost-allocation tag keys (infra/config.py StackConfig.tags, the provider's default tags).
COST_ALLOCATION_TAGS = ("project", "stack")
AWS_PROVIDER = "pulumi:providers:aws"
# What bills by the hour, the GB or the request in a stack, and takes tags.
COSTLY_TYPES = (
    *aws_types.BUCKETS,
    aws_types.LOG_GROUP,
    aws_types.LUSTRE_FILE_SYSTEM,
    aws_types.REPOSITORY,
    aws_types.KMS_KEY,
    aws_types.EBS_VOLUME,
    aws_types.EFS_FILE_SYSTEM,
    aws_types.NAT_GATEWAY,
    aws_types.VPC_ENDPOINT,
    aws_types.METRIC_ALARM,
    aws_types.SNS_TOPIC,
    aws_types.BATCH_COMPUTE_ENVIRONMENT,
    "aws:ec2/eip:Eip",
    "aws:cloudtrail/trail:Trail",
    "aws:ec2/instance:Instance",
)


def _tags(value: Any) -> dict[str, Any] | None:
    """Tags as given (a map; a provider's inputs carry JSON); None when unknown until the update."""
    try:
        if isinstance(value, str):
            value = json.loads(value)
        return dict(value or {})
    except UnknownValueError:
        return None


def _default_tags(resource: PolicyResource, providers: list[PolicyResource]) -> dict[str, Any] | None:
    """The default tags of the provider that creates `resource` (the stack's only AWS provider when the engine
    names none, as offline)."""
    props: Mapping[str, Any] | None = None
    if resource.provider is not None:
        props = resource.provider.props
    elif len(providers) == 1:
        props = providers[0].props
    if props is None:
        return {}
    try:
        defaults = _tags(props.get("defaultTags"))
    except UnknownValueError:
        return None
    return None if defaults is None else _tags(defaults.get("tags"))


def _launched_tags(resource: PolicyResource) -> dict[str, Any] | None:
    """The tags Batch puts on the instances a compute environment launches."""
    try:
        compute = resource.props.get("computeResources") or {}
        return _tags(compute.get("tags"))
    except UnknownValueError:
        return None


def validate_cost_allocation_tags(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    providers = [r for r in args.resources if r.resource_type == AWS_PROVIDER]
    for resource in args.resources:
        if resource.resource_type not in COSTLY_TYPES:
            continue
        try:
            own = _tags(resource.props.get("tags"))
        except UnknownValueError:
            continue
        defaults = _default_tags(resource, providers)
        if own is None or defaults is None:
            continue  # computed during the update: judged at `pulumi up`
        missing = [key for key in COST_ALLOCATION_TAGS if key not in {**defaults, **own}]
        if missing:
            report_violation(
                f"{resource.resource_type.split(':')[-1]} '{resource.name}' costs money but has no "
                f"{', '.join(missing)} tag, so its cost escapes the stack's budget and cost reports: create it with "
                "the stack's provider (its default tags) or give it tags=cfg.tags",
                resource.urn,
            )
        if resource.resource_type == aws_types.BATCH_COMPUTE_ENVIRONMENT:
            launched = _launched_tags(resource)
            gaps = [key for key in COST_ALLOCATION_TAGS if launched is not None and key not in launched]
            if gaps:
                report_violation(
                    f"compute environment '{resource.name}' launches instances without the {', '.join(gaps)} "
                    "tag (provider default tags do not reach them): set compute_resources.tags=cfg.tags",
                    resource.urn,
                )


COST_ALLOCATION_TAG = "aws:costexplorer/costAllocationTag:CostAllocationTag"


def validate_cost_tags_activated_later(
    args: ResourceValidationArgs, report_violation: ReportViolation
) -> None:
    """AWS lists a user-defined tag key for activation only after it reaches billing data, up to 24 hours after it
    is first applied (pulumi-aws costexplorer.CostAllocationTag: "it can take up to 24 hours for the tag keys to
    appear on Cost Allocation tag page for activation"; terraform-provider-aws issues 29068 and 31442), and only the
    payer account may activate it (UpdateCostAllocationTagsStatus from a linked account: AccessDeniedException
    "Linked account doesn't have access to cost allocation tags", 2i2c-org/infrastructure pull 4932). A program
    that activates the tag it first applies fails its first `pulumi up`."""
    if args.resource_type != COST_ALLOCATION_TAG:
        return
    report_violation(
        f"cost-allocation tag '{args.name}' is activated by the stack that applies it: AWS lists a tag key for "
        "activation only up to 24 hours after it reaches billing data, and only in the payer account; activate "
        "it later in the Billing console (docs/cost.md#budgets-and-tags) instead of in the program",
        None,
    )


cost_tags_activated_later = ResourceValidationPolicy(
    name="cost-tags-activated-later",
    description="No cost-allocation tag is activated in the program: AWS lists a tag for activation only after it "
    "reaches billing data (up to 24 h), in the payer account.",
    validate=validate_cost_tags_activated_later,
)

cost_allocation_tags = StackValidationPolicy(
    name="cost-allocation-tags",
    description="Every resource that costs money carries the stack's cost-allocation tags (project, stack).",
    validate=validate_cost_allocation_tags,
)
