"""The access check (policy/access.py) on every checked-in stack, and each earlier fault of its class put back.

Each fault test takes a stack's real offline preview, reverts one fix in the planned document (the statement the
fix added, or the conditions it added), and expects the row that guards it to fail, naming the actor, the action
and the policy that decided. The evaluator's key-policy and resource-policy logic is checked on the KMS developer
guide's and the IAM User Guide's own examples at the end.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from infra.config import load_stack_config, parse_stack_config, read_stack_file
from infra.mocks import ACCOUNT_ID
from policy import access, actors
from policy.iam_evaluation import Policy, Principal, Request, authorize
from tests.conftest import stack_plan
from tests.policy.conftest import without_statements
from trainer.contract.stack import stack_names

MEMBERS = [f"arn:aws:iam::{ACCOUNT_ID}:role/engineers"]
TEAMS = [{"name": n, "gpuQuota": 16, "members": MEMBERS} for n in ("vision", "speech")]
PROD_TEAMS = (("trainstack:teams", json.dumps(TEAMS)),)


def rows_of(stack: str, changes: tuple[tuple[str, Any], ...] = (), edit=None) -> list[access.Row]:
    plan = stack_plan(stack, changes)
    cfg = parse_stack_config(stack, {**read_stack_file(stack), **dict(changes)})
    if edit is not None:
        plan = dataclasses.replace(plan, resources=[edit(r) for r in plan.resources])
    return access.access_rows(plan, cfg)


def failing(rows: list[access.Row]) -> list[access.Row]:
    return [row for row in rows if not row.ok]


@pytest.mark.parametrize("stack", stack_names())
def test_every_checked_in_stack_passes_its_access_check(stack):
    rows = rows_of(stack)
    assert rows and not failing(rows), "\n".join(row.describe() for row in failing(rows))


def test_config_delivers_to_its_bucket_under_the_key():
    rows = rows_of("prod", (("trainstack:securityHub", True),))
    config = [row for row in rows if row.need.actor == "config.amazonaws.com"]
    assert {row.need.action for row in config} == {"s3:GetBucketAcl", "s3:PutObject", "kms:GenerateDataKey"}
    assert all(row.ok for row in config) and "trainstack-prod-config/" in config[1].need.resource


def test_a_team_stack_checks_its_workflow_and_must_nots():
    rows = rows_of("prod", PROD_TEAMS)
    assert not failing(rows), "\n".join(row.describe() for row in failing(rows))
    actions = {(row.need.actor, row.need.action, row.need.allowed) for row in rows}
    for needed in ("batch:SubmitJob", "batch:RegisterJobDefinition", "s3:PutObject", "iam:PassRole"):
        assert ("trainstack-prod-team-vision", needed, True) in actions
        assert ("trainstack-prod-team-vision", needed, False) in actions


def test_karpenter_without_the_key_statements_cannot_encrypt_the_root_volume():
    """Item 1: the controller's policy as it was (no kms action): every EBS need on the key fails."""
    edit = without_statements(
        "trainstack-eks-dev-karpenter", "AllowRootVolumeKeyThroughEC2", "AllowRootVolumeGrantThroughEC2"
    )
    failed = failing(rows_of("eks-dev", edit=edit))
    assert {row.need.action for row in failed} == {
        "kms:CreateGrant",
        "kms:Decrypt",
        "kms:DescribeKey",
        "kms:GenerateDataKeyWithoutPlaintext",
        "kms:ReEncryptFrom",
    }
    assert all(row.need.actor == "trainstack-eks-dev-karpenter" for row in failed)
    assert (
        "delegates to IAM; nothing allows it in trainstack-eks-dev-karpenter (inline)" in failed[0].describe()
    )


def test_karpenter_grant_without_grant_is_for_aws_resource_is_refused():
    rows = rows_of("eks-dev")
    stack = actors.StackPolicies(stack_plan("eks-dev"), load_stack_config("eks-dev"))
    grant = next(r for r in rows if r.need.action == "kms:CreateGrant" and "karpenter" in r.need.actor)
    bare = dataclasses.replace(
        grant.need, context={**grant.need.context, "kms:GrantIsForAWSResource": "false"}
    )
    assert not access.decide(stack, bare).decision.allowed


def test_the_eks_control_plane_encrypts_secrets_without_relying_on_kms_via_service():
    """Issue 46 item 7: the cluster role's own KMS calls carry no kms:ViaService (undocumented for EKS), so the key
    policy names the role. Without that statement, its identity policy alone does not reach the key: every need fails
    on the key policy, which delegates to IAM only for calls through the stack's services."""
    rows = rows_of("eks-dev")
    cluster = [row for row in rows if row.need.actor == "trainstack-eks-dev-eks-cluster"]
    assert {row.need.action for row in cluster} == {
        "kms:Encrypt",
        "kms:Decrypt",
        "kms:DescribeKey",
        "kms:ListGrants",
    }
    assert all(row.ok and "kms:ViaService" not in row.need.context for row in cluster)
    failed = failing(
        rows_of("eks-dev", edit=without_statements("trainstack-eks-dev-key", "EksClusterRoleEncryptsSecrets"))
    )
    # DescribeKey and ListGrants stay allowed: the key administrators' statement delegates them to IAM for any
    # principal of the account, and the role's identity policy allows them.
    assert {(row.need.actor, row.need.action) for row in failed} == {
        ("trainstack-eks-dev-eks-cluster", action) for action in ("kms:Encrypt", "kms:Decrypt")
    }


def test_only_a_role_named_as_pulumi_names_the_cluster_role_reaches_the_key_directly():
    """The statement matches `<prefix>-eks-cluster-` and Pulumi's 7 characters, not every name that starts so."""
    stack = actors.StackPolicies(stack_plan("eks-dev"), load_stack_config("eks-dev"))
    role = stack.roles["trainstack-eks-dev-eks-cluster"]
    assert role.arn.rsplit("/", 1)[1].startswith(
        "trainstack-eks-dev-eks-cluster-"
    )  # the mock names it as Pulumi
    policy, _ = stack.resource_policy(stack.stack_key)
    request = Request("kms:Decrypt", stack.stack_key, {"kms:CallerAccount": ACCOUNT_ID})
    assert authorize(role, request, policy, key=True).allowed
    for name in (
        "trainstack-eks-dev-eks-cluster-admin",
        "trainstack-eks-dev-eks-cluster",
        "trainstack-eks-dev-eks-clusterx1234567",
    ):
        other = dataclasses.replace(role, arn=f"arn:aws:iam::{ACCOUNT_ID}:role/{name}")
        assert not authorize(other, request, policy, key=True).allowed, name


def test_cloudtrail_without_its_decrypt_statement_fails_the_check():
    """Round 4's fault: the trail key without CloudTrail's kms:Decrypt (bucket key on the log bucket)."""
    failed = failing(
        rows_of("prod", edit=without_statements("trainstack-prod-key", "CloudTrailDecryptsForBucketKey"))
    )
    assert [(row.need.actor, row.need.action) for row in failed] == [
        ("cloudtrail.amazonaws.com", "kms:Decrypt")
    ]
    assert "trainstack-prod-key (key policy)" in failed[0].decision.by


def unconditioned_register(resource):
    """The team policy's RegisterJobDefinition as it was: no condition."""
    if resource.name != "trainstack-prod-team-access" or "policy" not in resource.inputs:
        return resource
    document = json.loads(resource.inputs["policy"])
    for statement in document["Statement"]:
        if statement.get("Sid") == "RegisterJobDefinitions":
            statement.pop("Condition")
    return dataclasses.replace(resource, inputs={**resource.inputs, "policy": json.dumps(document)})


def test_a_team_registering_a_privileged_shared_definition_fails_the_check():
    """Item 9: without the Batch condition keys any team could plant a privileged or foreign-image revision."""
    failed = failing(rows_of("prod", PROD_TEAMS, edit=unconditioned_register))
    assert failed and {row.need.action for row in failed} == {"batch:RegisterJobDefinition"}
    assert all(not row.need.allowed for row in failed)
    contexts = [row.need.context for row in failed if row.need.actor.endswith("-vision")]
    assert any(c.get("batch:Privileged") == "true" for c in contexts)
    assert any(c.get("batch:User") == "root" for c in contexts)
    assert any(c["batch:Image"].startswith("public.ecr.aws/") for c in contexts)
    assert "RegisterJobDefinitions" in failed[0].decision.by


def test_the_team_workflow_without_its_prefix_statement_fails_the_check():
    failed = failing(
        rows_of(
            "prod", PROD_TEAMS, edit=without_statements("trainstack-prod-team-access", "ReadWriteOwnPrefixes")
        )
    )
    assert failed and all(row.need.allowed and row.need.action.startswith("s3:") for row in failed)
    assert "no statement allows it in trainstack-prod-team-access" in failed[0].decision.by


# The KMS developer guide's "Default key policy" (Allows access to the AWS account and enables IAM policies) and
# the IAM policy that then grants a user the key ("Using IAM policies with AWS KMS", example "Allow a user to use a
# KMS key"): the key policy alone, the IAM policy alone, and both.
KEY = f"arn:aws:kms:us-west-2:{ACCOUNT_ID}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
DEFAULT_KEY_POLICY = Policy(
    "key",
    {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "Enable IAM User Permissions",
                "Effect": "Allow",
                "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT_ID}:root"},
                "Action": "kms:*",
                "Resource": "*",
            }
        ],
    },
)
USE_KEY = Policy(
    "identity",
    {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["kms:Decrypt", "kms:Encrypt"], "Resource": [KEY]}],
    },
)
ROLE = f"arn:aws:iam::{ACCOUNT_ID}:role/ExampleRole"


def test_a_key_policy_that_delegates_needs_an_identity_policy_too():
    request = Request("kms:Decrypt", KEY)
    assert authorize(
        Principal(ROLE, ACCOUNT_ID, policies=[USE_KEY]), request, DEFAULT_KEY_POLICY, key=True
    ).allowed
    assert not authorize(Principal(ROLE, ACCOUNT_ID), request, DEFAULT_KEY_POLICY, key=True).allowed
    only_others = Policy(
        "key", {"Statement": [{**DEFAULT_KEY_POLICY.document["Statement"][0], "Action": "kms:Describe*"}]}
    )
    assert not authorize(
        Principal(ROLE, ACCOUNT_ID, policies=[USE_KEY]), request, only_others, key=True
    ).allowed


def test_a_bucket_policy_naming_a_role_allows_it_without_an_identity_policy():
    """IAM User Guide, "Policy evaluation logic": within an account, an allow in the resource-based policy suffices
    when it names the principal; one naming the account leaves it to the identity policy."""
    bucket = "arn:aws:s3:::amzn-s3-demo-bucket"
    statement = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"{bucket}/*"}
    request = Request("s3:GetObject", f"{bucket}/a")
    named = Policy("bucket", {"Statement": [{**statement, "Principal": {"AWS": ROLE}}]})
    account = Policy(
        "bucket", {"Statement": [{**statement, "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT_ID}:root"}}]}
    )
    assert authorize(Principal(ROLE, ACCOUNT_ID), request, named).allowed
    assert not authorize(Principal(ROLE, ACCOUNT_ID), request, account).allowed
    deny = Policy(
        "bucket",
        {"Statement": [{**statement, "Effect": "Deny", "Principal": "*"}, named.document["Statement"][0]]},
    )
    assert authorize(Principal(ROLE, ACCOUNT_ID), request, deny).outcome == "explicitly denied"


def test_access_prints_the_table_and_fails_only_on_a_failing_row(capsys):
    assert access.main(["--stack", "eks-dev"]) == 0
    out = capsys.readouterr().out
    assert "trainstack-eks-dev-karpenter needs kms:CreateGrant" in out and out.rstrip().endswith("0 failing")


def test_access_refuses_an_unknown_stack(capsys):
    assert access.main(["--stack", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
