"""iam-no-wildcard-action and iam-no-wildcard-resource on hand-built policy documents."""

from __future__ import annotations

import json

import pytest

from infra.iam import WILDCARD_RESOURCE_ACTIONS
from policy.iam import no_wildcard_action, no_wildcard_resource

ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
BUCKET_ARN = "arn:aws:s3:::checkpoints"


def role_policy(resource, *statements, type_=ROLE_POLICY, key="policy"):
    return resource(
        type_, {key: json.dumps({"Version": "2012-10-17", "Statement": list(statements)})}, name="job"
    )


def allow(actions, resources, **extra):
    return {"Sid": "S", "Effect": "Allow", "Action": actions, "Resource": resources, **extra}


def test_statement_naming_actions_and_resources_passes(resource, violations):
    policy = role_policy(resource, allow(["s3:GetObject", "s3:PutObject"], [f"{BUCKET_ARN}/*"]))
    assert violations(no_wildcard_action, policy) == violations(no_wildcard_resource, policy) == []


@pytest.mark.parametrize("action", ["*", "s3:*", ["s3:GetObject", "kms:*"]])
def test_allowing_every_action_or_a_whole_service_is_a_violation(resource, violations, action):
    [(name, message)] = violations(no_wildcard_action, role_policy(resource, allow(action, [BUCKET_ARN])))
    assert (
        name == "job" and "policy statement S allows '" in message and "list the actions it needs" in message
    )


def test_allow_with_not_action_is_a_violation(resource, violations):
    statement = {"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"}
    assert any("NotAction" in m for _, m in violations(no_wildcard_action, role_policy(resource, statement)))


def test_deny_with_wildcards_is_a_guardrail_not_a_violation(resource, violations):
    deny = {"Effect": "Deny", "Principal": "*", "Action": "s3:*", "Resource": "*"}
    policy = role_policy(resource, deny, type_="aws:s3/bucketPolicy:BucketPolicy")
    assert violations(no_wildcard_action, policy) == []


def test_prefix_patterns_are_not_wildcard_actions(resource, violations):
    assert (
        violations(no_wildcard_action, role_policy(resource, allow(["kms:Get*", "kms:List*"], ["*"]))) == []
    )


def test_wildcard_action_in_a_role_inline_policy_and_trust_policy_is_found(resource, violations):
    document = json.dumps({"Statement": [allow("*", "*")]})
    role = resource(
        "aws:iam/role:Role",
        {"assumeRolePolicy": document, "inlinePolicies": [{"name": "x", "policy": document}]},
    )
    found = [m.split(" allows")[0] for _, m in violations(no_wildcard_action, role)]
    assert found == ["r: assumeRolePolicy statement S", "r: inlinePolicies[0] statement S"]


def test_allow_listed_actions_may_use_resource_star(resource, violations):
    policy = role_policy(resource, allow(list(WILDCARD_RESOURCE_ACTIONS), "*"))
    assert violations(no_wildcard_resource, policy) == []


def test_allow_list_is_matched_case_insensitively(resource, violations):
    assert (
        violations(no_wildcard_resource, role_policy(resource, allow("ECR:getAuthorizationToken", ["*"])))
        == []
    )


def test_resource_star_for_an_action_outside_the_allow_list_is_a_violation(resource, violations):
    policy = role_policy(resource, allow(["ecr:GetAuthorizationToken", "s3:GetObject"], "*"))
    [(_, message)] = violations(no_wildcard_resource, policy)
    assert "allows s3:GetObject on Resource '*'" in message and "ecr:GetAuthorizationToken, ecs:" in message


def test_allow_with_not_resource_is_a_violation(resource, violations):
    statement = {"Effect": "Allow", "Action": "s3:GetObject", "NotResource": BUCKET_ARN}
    [(_, message)] = violations(no_wildcard_resource, role_policy(resource, statement))
    assert "NotResource" in message


def test_key_policy_resource_star_means_the_key_itself(resource, violations):
    statement = allow(["kms:Decrypt"], "*", Principal={"AWS": "arn:aws:iam::123456789012:root"})
    assert violations(no_wildcard_resource, role_policy(resource, statement, type_="aws:kms/key:Key")) == []


def test_json_that_is_no_policy_document_is_ignored(resource, violations):
    lifecycle = resource("aws:ecr/lifecyclePolicy:LifecyclePolicy", {"policy": json.dumps({"rules": []})})
    assert violations(no_wildcard_action, lifecycle) == violations(no_wildcard_resource, lifecycle) == []
