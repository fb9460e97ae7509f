"""`make policy STACK=<env>`: the offline runner's report, in the Pulumi CLI's format, and its exit status."""

from __future__ import annotations

import dataclasses

from pulumi_policy import EnforcementLevel, StackValidationPolicy

from policy.offline import Violation, evaluate, main, pack_version, render
from policy.pack import PACK_NAME
from tests.conftest import stack_plan
from tests.policy.conftest import without_statements


def test_a_stack_with_only_advisory_findings_warns_and_exits_0(capsys):
    # dev subscribes nobody to its alarm topic (alarmEmails unset): cis-alarms-heard is advisory.
    assert main(["--stack", "dev"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Policies:\n    ⚠️ {PACK_NAME}@v{pack_version()} (local: policy)\n")
    assert "[advisory]  cis-alarms-heard" in out and "[mandatory]" not in out
    assert out.endswith(
        "Access: 31 rows, 0 failing (make access STACK=dev prints them all)\n"
        "cloudsplaining: 3 findings, 0 not accepted in policy/cloudsplaining-baseline.yaml\n"
    )


def test_violations_print_as_the_cli_prints_them():
    urn = "urn:pulumi:dev::trainstack::trainstack:cluster:Cluster$aws:ec2/launchTemplate:LaunchTemplate::gpu"
    violation = Violation(
        "imdsv2-required", EnforcementLevel.MANDATORY, urn, "Launch templates ...\nLine two."
    )
    assert render([violation], "1.2.3").splitlines() == [
        "Policies:",
        f"    ❌ {PACK_NAME}@v1.2.3 (local: policy)",
        "        - [mandatory]  imdsv2-required  (aws:ec2/launchTemplate:LaunchTemplate: gpu)",
        "          Launch templates ...",
        "          Line two.",
    ]


def test_advisory_violations_alone_warn(capsys):
    violation = Violation(
        "x", EnforcementLevel.ADVISORY, "urn:pulumi:dev::p::pulumi:pulumi:Stack::p-dev", "m"
    )
    assert render([violation], "1.0.0").splitlines()[1] == f"    ⚠️ {PACK_NAME}@v1.0.0 (local: policy)"


def test_mandatory_violation_exits_1_and_names_policy_resource_and_fix(planned, capsys, monkeypatch):
    unprotected = planned("prod", **{"trainstack:protectData": False})
    # planned once per session already
    monkeypatch.setattr("policy.offline.run_program", lambda stack: stack_plan("prod"))
    monkeypatch.setattr("policy.offline.policy_resources", lambda plan: unprotected)
    assert main(["--stack", "prod"]) == 1
    out = capsys.readouterr().out
    assert "❌" in out
    assert (
        "- [mandatory]  prod-data-protected  (aws:fsx/lustreFileSystem:LustreFileSystem: trainstack-prod-fsx)"
        in out
    )
    assert "pass opts=pulumi.ResourceOptions(protect=True, retain_on_delete=True)" in out


def test_a_failing_access_row_exits_1_and_names_actor_action_and_policy(capsys, monkeypatch):
    """Karpenter's controller policy without its key statements (issue 46 item 1): the pack passes, access fails."""
    plan = stack_plan("eks-dev")
    edit = without_statements(
        "trainstack-eks-dev-karpenter", "AllowRootVolumeKeyThroughEC2", "AllowRootVolumeGrantThroughEC2"
    )
    edited = dataclasses.replace(plan, resources=[edit(r) for r in plan.resources])
    monkeypatch.setattr("policy.offline.run_program", lambda stack: edited)
    assert main(["--stack", "eks-dev"]) == 1
    out = capsys.readouterr().out
    assert "[mandatory]" not in out and "Access: 77 rows, 5 failing" in out
    assert "- trainstack-eks-dev-karpenter needs kms:CreateGrant on arn:aws:kms:" in out
    assert "nothing allows it in trainstack-eks-dev-karpenter (inline)" in out


def test_stack_violation_that_names_no_resource_is_reported_on_the_stack(monkeypatch):
    whole_stack = StackValidationPolicy(
        "whole-stack", "A rule about the stack.", lambda args, report: report("m")
    )
    monkeypatch.setattr("policy.offline.POLICIES", [whole_stack])
    [violation] = evaluate([], "dev")
    assert violation.urn == "urn:pulumi:dev::trainstack::pulumi:pulumi:Stack::trainstack-dev"
    assert violation.message == "A rule about the stack.\nm"


def test_unknown_stack_exits_2_and_names_the_stacks(capsys):
    assert main(["--stack", "qa"]) == 2
    assert "no stack file Pulumi.qa.yaml" in capsys.readouterr().err
