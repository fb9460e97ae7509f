"""Karpenter's interruption queue (infra/karpenter_interruption.py) against Karpenter's own CloudFormation at the
pinned version (tests/fixtures/karpenter/), and the order in which the cluster's software meets its permissions:
the Kubernetes provider after the admins' access (infra/eks_access.py), the Karpenter release after its Pod
Identity, all under the Pulumi mocks."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pytest
import yaml

from infra.config import read_stack_file
from infra.eks_access import is_admin
from infra.preview import run_program
from tests.conftest import ROOT

REFERENCE = ROOT / "tests/fixtures/karpenter/v1.14.1-cloudformation.yml"


class CloudFormation(yaml.SafeLoader):
    """CloudFormation's short forms (!Sub, !GetAtt, !Ref) read as {"Fn": value}."""


for _tag in ("!Sub", "!GetAtt", "!Ref"):
    CloudFormation.add_constructor(_tag, lambda loader, node, tag=_tag: {tag: loader.construct_scalar(node)})


def reference() -> dict[str, Any]:
    return yaml.load(REFERENCE.read_text(), Loader=CloudFormation)["Resources"]


def by_name(stack, short_type: str) -> dict[str, Any]:
    return {r.name: r for r in stack.all(short_type)}


def test_the_queue_is_karpenters_reference_queue_named_after_the_cluster(eks_stack):
    ref = reference()["KarpenterInterruptionQueue"]["Properties"]
    queue = eks_stack.one("sqs.Queue", "-karpenter-interruption").inputs
    assert queue["name"] == eks_stack.config.eks_cluster_name  # QueueName: ${ClusterName}
    assert queue["messageRetentionSeconds"] == ref["MessageRetentionPeriod"]
    assert queue["sqsManagedSseEnabled"] is ref["SqsManagedSseEnabled"] is True


def test_the_queue_policy_is_the_references_statement_for_statement(eks_stack):
    ref = reference()["KarpenterInterruptionQueuePolicy"]["Properties"]["PolicyDocument"]
    queue = eks_stack.one("sqs.Queue", "-karpenter-interruption")
    policy = json.loads(eks_stack.one("sqs.QueuePolicy", "-karpenter-interruption").inputs["policy"])
    assert policy["Id"] == ref["Id"]
    arn = queue.outputs["arn"]
    expected = json.loads(
        json.dumps(ref["Statement"]).replace(
            json.dumps({"!GetAtt": "KarpenterInterruptionQueue.Arn"}), json.dumps(arn)
        )
    )
    # CloudFormation writes the Bool condition's value as YAML false; IAM compares the string "false".
    expected[1]["Condition"]["Bool"]["aws:SecureTransport"] = "false"
    assert policy["Statement"] == expected


def test_every_reference_rule_sends_its_events_to_the_queue(eks_stack):
    rules = {r.name: r for r in eks_stack.all("cloudwatch.EventRule") if "-karpenter-" in r.name}
    targets = {t.inputs["rule"]: t.inputs for t in eks_stack.all("cloudwatch.EventTarget")}
    queue_arn = eks_stack.one("sqs.Queue", "-karpenter-interruption").outputs["arn"]
    wanted = [
        resource["Properties"] for resource in reference().values() if resource["Type"] == "AWS::Events::Rule"
    ]
    assert len(wanted) == 5
    sent = [json.loads(rule.inputs["eventPattern"]) for rule in rules.values()]
    assert sorted(map(json.dumps, sent)) == sorted(json.dumps(w["EventPattern"]) for w in wanted)
    for rule in rules.values():
        target = targets[rule.outputs["name"]]
        (ref_target,) = wanted[0]["Targets"]
        assert (target["arn"], target["targetId"]) == (queue_arn, ref_target["Id"])


def test_the_controller_may_receive_and_delete_from_its_queue_only(eks_stack):
    ref = reference()["InterruptionPolicy"]["Properties"]["PolicyDocument"]["!Sub"]
    (ref_statement,) = json.loads(ref.replace("${KarpenterInterruptionQueue.Arn}", "QUEUE"))["Statement"]
    queue_arn = eks_stack.one("sqs.Queue", "-karpenter-interruption").outputs["arn"]
    (statement,) = json.loads(eks_stack.one("iam.RolePolicy", "-karpenter-interruption").inputs["policy"])[
        "Statement"
    ]
    assert statement == {**ref_statement, "Resource": queue_arn}
    controller = eks_stack.one("iam.Role", "-karpenter")
    assert eks_stack.one("iam.RolePolicy", "-karpenter-interruption").inputs["role"] == controller.id
    association = next(
        r for r in eks_stack.all("eks.PodIdentityAssociation") if r.name.endswith("-karpenter")
    )
    assert any(u.endswith("-karpenter-interruption") for u in association.dependencies)


def test_the_release_names_the_queue_and_the_region_and_waits_for_its_pod_identity(eks_stack):
    (release,) = [r for r in eks_stack.plan.resources if r.type.endswith("Release") and r.name == "karpenter"]
    settings = release.inputs["values"]["settings"]
    assert (
        settings["interruptionQueue"] == eks_stack.one("sqs.Queue", "-karpenter-interruption").inputs["name"]
    )
    assert release.inputs["values"]["controller"]["env"] == [
        {"name": "AWS_REGION", "value": eks_stack.config.region}
    ]
    association = next(
        r for r in eks_stack.all("eks.PodIdentityAssociation") if r.name.endswith("-karpenter")
    )
    assert association.urn in release.dependencies


def test_the_kubernetes_provider_waits_for_every_admin_entry_and_association(eks_stack):
    (provider,) = [r for r in eks_stack.plan.resources if r.type == "pulumi:providers:kubernetes"]
    admins = [
        r.urn
        for r in (*eks_stack.all("eks.AccessEntry"), *eks_stack.all("eks.AccessPolicyAssociation"))
        if "-eks-admin-" in r.name
    ]
    assert len(admins) == 2 * len(eks_stack.config.eks_admin_arns) >= 2
    assert set(admins) <= set(provider.dependencies)


@pytest.mark.parametrize(
    ("caller", "admins", "expected"),
    [
        # A session of an admin role (IAM User Guide, "IAM identifiers": the session ARN drops the role's path).
        (
            "arn:aws:sts::123456789012:assumed-role/ml-admin/alice",
            ["arn:aws:iam::123456789012:role/ml-admin"],
            True,
        ),
        (
            "arn:aws:sts::123456789012:assumed-role/ml-admin/alice",
            ["arn:aws:iam::123456789012:role/x/ml-admin"],
            True,
        ),
        (
            "arn:aws:sts::210987654321:assumed-role/ml-admin/alice",
            ["arn:aws:iam::123456789012:role/ml-admin"],
            False,
        ),
        (
            "arn:aws:sts::123456789012:assumed-role/ml-admins/alice",
            ["arn:aws:iam::123456789012:role/ml-admin"],
            False,
        ),
        ("arn:aws:iam::123456789012:user/bob", ["arn:aws:iam::123456789012:user/bob"], True),
        ("arn:aws:iam::123456789012:user/bob", ["arn:aws:iam::123456789012:role/bob"], False),
    ],
)
def test_the_deployer_is_an_admin_as_its_session_or_user_arn(caller, admins, expected):
    assert is_admin(caller, admins) is expected


def test_a_deployer_who_is_not_an_admin_is_refused_naming_the_key():
    stranger = "arn:aws:sts::123456789012:assumed-role/someone-else/session"
    with pytest.raises(Exception) as refused:  # the program's RunError, as pulumi.runtime.test re-raises it
        run_program("eks-dev", read_stack_file("eks-dev"), caller_arn=stranger)
    assert "trainstack:eksAdminArns" in str(refused.value) and stranger in str(refused.value)
    assert isinstance(refused.value, pulumi.RunError) or "RunError" in repr(refused.value)
