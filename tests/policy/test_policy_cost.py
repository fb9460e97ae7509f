"""cost-allocation-tags (policy/cost.py): hand-built resources with and without the tags, the provider's default
tags, a compute environment's launched-instance tags, and every checked-in stack's offline preview."""

from __future__ import annotations

import json

import pytest

from infra.config import load_stack_config
from policy.cost import (
    AWS_PROVIDER,
    COST_ALLOCATION_TAG,
    COST_ALLOCATION_TAGS,
    cost_allocation_tags,
    cost_tags_activated_later,
)

NAT = "aws:ec2/natGateway:NatGateway"
FSX = "aws:fsx/lustreFileSystem:LustreFileSystem"
COMPUTE = "aws:batch/computeEnvironment:ComputeEnvironment"
TAGS = {"project": "trainstack", "stack": "dev", "owner": "ml-platform"}


def provider(resource, tags):
    # The provider's inputs carry their maps as JSON, as the mocks record them (tests/infra/test_stacks.py).
    return resource(AWS_PROVIDER, {"defaultTags": json.dumps({"tags": tags})}, name="aws")


def test_a_nat_gateway_without_the_tags_is_a_violation(resource, violations):
    [(name, message)] = violations(cost_allocation_tags, resource(NAT, {"tags": {"owner": "me"}}, name="nat"))
    assert name == "nat" and "NatGateway 'nat' costs money but has no project, stack tag" in message


def test_the_providers_default_tags_count(resource, violations):
    assert violations(cost_allocation_tags, provider(resource, TAGS), resource(FSX, {}, name="fsx")) == []


def test_own_tags_count_without_defaults(resource, violations):
    assert violations(cost_allocation_tags, resource(FSX, {"tags": TAGS})) == []


def test_defaults_missing_the_stack_tag_are_a_violation(resource, violations):
    found = violations(cost_allocation_tags, provider(resource, {"project": "trainstack"}), resource(FSX, {}))
    assert [message for _, message in found] == [
        "LustreFileSystem 'r' costs money but has no stack tag, so its cost escapes the stack's budget and cost "
        "reports: create it with the stack's provider (its default tags) or give it tags=cfg.tags"
    ]


def test_a_compute_environment_must_tag_the_instances_it_launches(resource, violations):
    untagged = resource(COMPUTE, {"computeResources": {"type": "EC2"}}, name="gpu")
    [(name, message)] = violations(cost_allocation_tags, provider(resource, TAGS), untagged)
    assert name == "gpu" and "launches instances without the project, stack tag" in message
    tagged = resource(COMPUTE, {"computeResources": {"type": "EC2", "tags": TAGS}}, name="gpu")
    assert violations(cost_allocation_tags, provider(resource, TAGS), tagged) == []


def test_free_resources_are_not_judged(resource, violations):
    assert violations(cost_allocation_tags, resource("aws:ec2/subnet:Subnet", {})) == []


def test_the_tag_keys_are_the_stacks_own():
    assert set(COST_ALLOCATION_TAGS) <= set(load_stack_config("dev").tags)


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_every_stack_passes(planned, violations, stack):
    assert violations(cost_allocation_tags, *planned(stack)) == []


def test_activating_the_team_tag_in_the_program_is_refused(resource, violations):
    """Round 3's Teams component activated `team` in the `pulumi up` that first applied it: AWS lists a key for
    activation only once it reaches billing data (terraform-provider-aws issue 29068: "empty result")."""
    activation = resource(
        COST_ALLOCATION_TAG, {"tagKey": "team", "status": "Active"}, name="trainstack-prod-team-tag"
    )
    [(name, message)] = violations(cost_tags_activated_later, activation)
    assert name == "trainstack-prod-team-tag" and "up to 24 hours" in message and "payer account" in message


def test_a_stack_with_teams_activates_no_tag(planned, violations):
    teams = [{"name": "vision", "gpuQuota": 32, "members": ["arn:aws:iam::123456789012:role/vision"]}]
    resources = planned("prod", **{"trainstack:teams": json.dumps(teams)})
    assert violations(cost_tags_activated_later, *resources) == []
