"""Reading resources as the policy analyzer hands them over, in a real preview as in the offline one.

In `pulumi preview` the inputs of resources not yet created hold unknowns (ids, ARNs) behind pulumi-policy's
proxy, which raises `UnknownValueError` when one is read: the SDK then reports "can't run policy during preview"
(advisory) and the policy runs on known values at `pulumi up`. So policies read only what they judge, and stack
policies relate resources through `property_dependencies` (which resources feed an input), which the engine knows
before any id exists, never by comparing ids.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pulumi_policy import PolicyResource
from pulumi_policy.proxy import UnknownValueError

# A key given as an alias or alias ARN of an AWS-managed key (aws/s3, aws/ebs, ...) is not the stack's own.
AWS_MANAGED_KEY_ALIAS = "alias/aws/"


def as_list(value: Any) -> list[Any]:
    """IAM and AWS inputs that take one value or a list of them, as a list."""
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, Sequence):
        return [value]
    return list(value)


def has_value(props: Mapping[str, Any], key: str) -> bool:
    """`key` is set; an unknown (computed during the update) counts, since the program did set it."""
    try:
        value = props.get(key)
    except UnknownValueError:
        return True
    if isinstance(value, str | Sequence):
        return len(value) > 0
    return value is not None


def is_customer_managed_key(props: Mapping[str, Any], key: str) -> bool:
    """`key` names a KMS key of ours: set, and not an AWS-managed alias. Unknown in preview: a key being created."""
    try:
        value = props.get(key)
    except UnknownValueError:
        return True
    return isinstance(value, str) and value != "" and AWS_MANAGED_KEY_ALIAS not in value


def of_type(resources: Sequence[PolicyResource], types: Collection[str]) -> list[PolicyResource]:
    return [r for r in resources if r.resource_type in types]


def feeds(resource: PolicyResource, key: str, target: PolicyResource) -> bool:
    """`target`'s outputs (its id, ARN, ...) flow into input `key` of `resource`."""
    return any(r.urn == target.urn for r in resource.property_dependencies.get(key, []))


def referenced(resource: PolicyResource, key: str, types: Collection[str]) -> list[PolicyResource]:
    """The resources of `types` whose outputs flow into input `key` of `resource`."""
    return [r for r in resource.property_dependencies.get(key, []) if r.resource_type in types]


def referrers(
    resources: Sequence[PolicyResource], types: Collection[str], key: str, target: PolicyResource
) -> list[PolicyResource]:
    """The resources of `types` whose input `key` is fed by `target`: a bucket's configuration, a group's rules."""
    return [r for r in of_type(resources, types) if feeds(r, key, target)]
