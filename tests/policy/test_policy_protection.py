"""prod-data-protected: a prod stack's data resources are protected; other stacks are not judged."""

from __future__ import annotations

import pytest

from policy.offline import evaluate, mandatory
from policy.protection import prod_data_protected

DATA_TYPES = [
    "aws:s3/bucket:Bucket",
    "aws:fsx/lustreFileSystem:LustreFileSystem",
    "aws:kms/key:Key",
    "aws:ecr/repository:Repository",
]


@pytest.mark.parametrize("type_", DATA_TYPES)
def test_protected_data_in_prod_passes(resource, violations, type_):
    assert violations(prod_data_protected, resource(type_, {}, stack="prod", protect=True)) == []


@pytest.mark.parametrize("type_", DATA_TYPES)
def test_unprotected_data_in_prod_is_a_violation(resource, violations, type_):
    [(name, message)] = violations(prod_data_protected, resource(type_, {}, name="data", stack="prod"))
    assert name == "data" and "stack prod but is not protected" in message and "protect=True" in message


@pytest.mark.parametrize("stack", ["dev", "staging", "production-like"])
def test_unprotected_data_outside_prod_is_not_judged(resource, violations, stack):
    assert violations(prod_data_protected, resource("aws:s3/bucket:Bucket", {}, stack=stack)) == []


def test_resources_without_data_are_not_judged_in_prod(resource, violations):
    assert violations(prod_data_protected, resource("aws:ec2/vpc:Vpc", {}, stack="prod")) == []


def test_prod_stack_with_protect_data_off_fails_for_every_data_resource(planned):
    unprotected = planned("prod", **{"trainstack:protectData": False})
    found = {
        v.urn.rsplit("::", 1)[1] for v in evaluate(unprotected, "prod") if v.policy == "prod-data-protected"
    }
    assert found == {
        "trainstack-prod-datasets",
        "trainstack-prod-checkpoints",
        "trainstack-prod-audit-logs",
        "trainstack-prod-fsx",
        "trainstack-prod-key",
        "trainstack-prod-trainer",
    }
    assert [
        v.policy for v in mandatory(evaluate(unprotected, "prod")) if v.policy != "prod-data-protected"
    ] == []
