"""The whole pack over every checked-in stack's offline preview: no violation, and each relation it relies on is real.

Removing one resource from a passing plan must make the policy that depends on it fail: that shows the stack
policies found their resources through the recorded property dependencies, not by luck.
"""

from __future__ import annotations

import pytest

from policy.offline import evaluate, mandatory
from trainer.contract.stack import stack_names


@pytest.mark.parametrize("stack", stack_names())
def test_every_checked_in_stack_passes_every_policy(planned, stack):
    assert [(v.policy, v.urn, v.message) for v in mandatory(evaluate(planned(stack), stack))] == []


@pytest.mark.parametrize(
    ("stack", "removed_type", "removed_name", "policy", "reported"),
    [
        (
            "dev",
            "SecurityGroupIngressRule",
            "trainstack-dev-efa-from-self",
            "efa-security-group-self-traffic",
            "trainstack-dev-efa",
        ),
        (
            "staging",
            "SecurityGroupEgressRule",
            "trainstack-staging-efa-to-self",
            "efa-security-group-self-traffic",
            "trainstack-staging-efa",
        ),
        ("prod", "VpcEndpoint", "trainstack-prod-s3", "s3-gateway-endpoint-with-nat", "trainstack-prod-vpc"),
        (
            "dev",
            "BucketPublicAccessBlock",
            "trainstack-dev-datasets",
            "s3-public-access-blocked",
            "trainstack-dev-datasets",
        ),
        ("dev", "BucketPolicy", "trainstack-dev-checkpoints", "s3-tls-only", "trainstack-dev-checkpoints"),
        (
            "staging",
            "BucketVersioning",
            "trainstack-staging-datasets",
            "s3-versioning",
            "trainstack-staging-datasets",
        ),
        (
            "prod",
            "BucketServerSideEncryptionConfiguration",
            "trainstack-prod-checkpoints",
            "s3-cmk-encryption",
            "trainstack-prod-checkpoints",
        ),
        (
            "staging",
            "DefaultSecurityGroup",
            "trainstack-staging-default",
            "batch-mnp-containers-default-security-group",
            "trainstack-staging-gpu",
        ),
        (
            "prod",
            "SecurityGroupEgressRule",
            "trainstack-prod-fsx-to-efa-988",
            "fsx-lustre-ports-both-ways",
            "trainstack-prod-fsx",
        ),
        (
            "dev",
            "SecurityGroupIngressRule",
            "trainstack-dev-efa-from-fsx-1018",
            "fsx-lustre-ports-both-ways",
            "trainstack-dev-efa",
        ),
    ],
)
def test_removing_a_guardrail_resource_from_a_stack_is_reported(
    planned, stack, removed_type, removed_name, policy, reported
):
    resources = [
        r
        for r in planned(stack)
        if not (r.resource_type.endswith(f":{removed_type}") and r.name == removed_name)
    ]
    assert len(resources) == len(planned(stack)) - 1
    found = [(v.policy, v.urn.rsplit("::", 1)[1]) for v in mandatory(evaluate(resources, stack))]
    assert found == [(policy, reported)]


@pytest.mark.parametrize(
    "changes",
    [
        {
            "trainstack:capacityReservationId": "cr-0123456789abcdef0",
            "trainstack:reservationPlacementGroup": "odcr",
        },
        {"trainstack:capacityReservationId": "cr-0123456789abcdef0", "trainstack:capacityBlock": True},
        {"trainstack:stopGraceSeconds": 900, "trainstack:jobTimeoutHours": 1},
    ],
    ids=["odcr-in-its-placement-group", "capacity-block", "long-grace-short-timeout"],
)
def test_reserved_capacity_and_timing_variants_pass_every_policy(planned, changes):
    assert [
        (v.policy, v.urn, v.message) for v in mandatory(evaluate(planned("prod", **changes), "prod"))
    ] == []
