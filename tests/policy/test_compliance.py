"""`make compliance`: every control has a row on every stack, its status comes from the policy pack over the
offline preview, and Security Hub's findings (botocore Stubber, shaped by the SecurityHub API model) join it."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber
from pulumi_policy import EnforcementLevel

from infra.config import read_stack_file
from infra.mocks import ACCOUNT_ID
from policy import compliance
from policy.offline import Violation, evaluate, policy_resources
from tests.conftest import stack_plan
from trainer.contract.controls import CONTROLS

ORG_TRAIL = "arn:aws:cloudtrail:us-east-1:111122223333:trail/org-trail"


CIS_ALARM_CONTROLS = ["CloudWatch.1", "CloudWatch.2", "CloudWatch.4", "CloudWatch.5", "CloudWatch.7"]
UNBUILT_CIS_ALARMS = ["CloudWatch.3", "CloudWatch.6", *(f"CloudWatch.{n}" for n in range(8, 15))]


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_every_control_has_a_row_and_only_unheard_alarms_fail(stack):
    rows = compliance.statuses(stack)
    assert [r.control for r in rows] == [c.id for c in CONTROLS]
    failed = [r for r in rows if r.status == compliance.FAIL]
    # No checked-in stack subscribes anyone to its alarm topic (alarmEmails is commented out): CIS's audit step
    # wants a subscriber (Security Hub controls for CloudWatch: "Create at least one subscriber to the topic").
    assert [r.control for r in failed] == CIS_ALARM_CONTROLS
    assert all(
        f"the {r.control} alarm's topic has no subscriber" in r.detail and r.detail.count(": ") == 2
        for r in failed
    )
    statuses = {compliance.PASS, compliance.NOT_COVERED, compliance.FAIL, compliance.ACCEPTED}
    assert {r.status for r in rows} <= statuses
    by_id = {r.control: r for r in rows}
    # Issue 46 item 10: S3.15 does not hold on the datasets and checkpoints buckets (no Object Lock, by design):
    # accepted with the reason, never a pass.
    assert by_id["S3.15"].status == compliance.ACCEPTED
    assert f"trainstack-{stack}-checkpoints, trainstack-{stack}-datasets:" in by_id["S3.15"].detail
    assert "audit-logs," not in by_id["S3.15"].detail
    assert by_id["CloudTrail.1"].status == compliance.PASS and by_id["CloudTrail.1"].resources
    assert (
        by_id["trainstack.teams"].detail
        == "the stack has no trainstack:teams (on Batch or EKS): it is single-tenant"
    )
    assert all(r.detail for r in rows if r.status == compliance.NOT_COVERED)


def test_with_a_subscriber_the_cis_alarm_controls_pass():
    values = {**read_stack_file("dev"), "trainstack:alarmEmails": ["oncall@example.com"]}
    by_id = {r.control: r for r in compliance.statuses("dev", values)}
    for control in CIS_ALARM_CONTROLS:
        assert by_id[control].status == compliance.PASS
        assert by_id[control].detail == "checked by cis-metric-filters, cis-alarms-heard"


def test_the_cis_alarms_the_stack_does_not_build_are_listed_not_covered_with_why():
    by_id = {r.control: r for r in compliance.statuses("dev")}
    for control in UNBUILT_CIS_ALARMS:
        assert by_id[control].status == compliance.NOT_COVERED
        assert by_id[control].detail.startswith("the stack builds no metric filter or alarm for it")


def test_a_violation_fails_its_control_naming_the_resource():
    (control,) = [c for c in CONTROLS if c.id == "S3.14"]
    urn = "urn:pulumi:dev::trainstack::aws:s3/bucket:Bucket::trainstack-dev-datasets"
    violation = Violation(
        "s3-versioning", EnforcementLevel.MANDATORY, urn, "S3 buckets keep versions.\nis not versioned"
    )
    from infra.mocks import PlannedResource

    bucket = PlannedResource("aws:s3/bucket:Bucket", "trainstack-dev-datasets", {})
    row = compliance._status(control, [bucket], {"s3-versioning": [violation]}, None)
    assert (row.status, row.detail) == (compliance.FAIL, "trainstack-dev-datasets: is not versioned")


def test_teams_and_the_organization_trail_change_the_rows():
    values = {
        **read_stack_file("staging"),
        "trainstack:organizationTrail": ORG_TRAIL,
        "trainstack:teams": [
            {"name": "vision", "gpuQuota": 8, "members": [f"arn:aws:iam::{ACCOUNT_ID}:root"]}
        ],
    }
    by_id = {r.control: r for r in compliance.statuses("staging", values)}
    assert by_id["trainstack.teams"].status == compliance.PASS
    assert "tests/infra/test_teams.py" in by_id["trainstack.teams"].detail
    assert (
        by_id["CloudTrail.1"].status == compliance.NOT_COVERED and ORG_TRAIL in by_id["CloudTrail.1"].detail
    )
    # Issue 46 item 10: the stack builds no CIS alarm then; its other alarms implement none of the controls.
    for control in CIS_ALARM_CONTROLS:
        assert by_id[control].status == compliance.NOT_COVERED, by_id[control]
        assert ORG_TRAIL in by_id[control].detail and by_id[control].resources == []


@pytest.mark.parametrize("stack", ["dev", "eks-dev"])
def test_make_compliance_fails_exactly_the_controls_whose_findings_make_policy_prints(stack):
    """Issue 46 item 10: a control fails in `make compliance` when, and only when, `make policy` prints a violation
    of one of its policies on it (any enforcement level); the stack-wide violations name their control."""
    rows = compliance.statuses(stack)
    printed = evaluate(policy_resources(stack_plan(stack)), stack)
    for row in rows:
        (control,) = [c for c in CONTROLS if c.id == row.control]
        found = [
            v
            for v in printed
            if v.policy in control.policies and compliance._concerns(control, v, row.resources)
        ]
        assert (row.status == compliance.FAIL) == bool(found), row


def test_eks_dev_with_teams_is_not_called_single_tenant():
    # eks-dev shares its cluster between two teams (Pulumi.eks-dev.yaml): namespaces and RBAC, no Batch share.
    by_id = {r.control: r for r in compliance.statuses("eks-dev")}
    assert by_id["trainstack.teams"].status == compliance.PASS
    assert "tests/infra/test_eks_teams.py" in by_id["trainstack.teams"].detail
    assert by_id["trainstack.eks-teams"].status == compliance.PASS


def securityhub() -> tuple[object, Stubber]:
    client = boto3.client(
        "securityhub", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    return client, Stubber(client)


def finding(control: str) -> dict:
    """A GetFindings entry (AwsSecurityFinding) with the fields the model requires and the control's id."""
    return {
        "SchemaVersion": "2018-10-08",
        "Id": f"arn:aws:securityhub:us-east-1:{ACCOUNT_ID}:security-control/{control}/finding/1",
        "ProductArn": "arn:aws:securityhub:us-east-1::product/aws/securityhub",
        "GeneratorId": f"security-control/{control}",
        "AwsAccountId": ACCOUNT_ID,
        "CreatedAt": "2026-12-03T00:00:00Z",
        "UpdatedAt": "2026-12-03T00:00:00Z",
        "Title": control,
        "Description": control,
        "Resources": [{"Type": "AwsS3Bucket", "Id": "arn:aws:s3:::trainstack-dev-datasets"}],
        "Compliance": {"Status": "FAILED", "SecurityControlId": control},
    }


FSBP = "arn:aws:securityhub:us-east-1::standards/aws-foundational-security-best-practices/v/1.0.0"
CIS_1_2 = "arn:aws:securityhub:::ruleset/cis-aws-foundations-benchmark/v/1.2.0"
CIS_1_4 = "arn:aws:securityhub:us-east-1::standards/cis-aws-foundations-benchmark/v/1.4.0"


def standards_of(control: str) -> list[str]:
    """Which standards hold a control (Security Hub User Guide, fsbp-standard.md and cis-aws-foundations-benchmark.md,
    archived awsdocs/aws-security-hub-user-guide 47bfe2f): FSBP has no CloudWatch.x and no CloudTrail.6/.7."""
    if control.startswith("CloudWatch."):
        return [CIS_1_2] if control in ("CloudWatch.2", "CloudWatch.3") else [CIS_1_2, CIS_1_4]
    if control in ("CloudTrail.6", "CloudTrail.7"):
        return [CIS_1_2, CIS_1_4]
    return [FSBP]


def stub_standards(stubber: Stubber, enabled: list[str], controls: list[str]) -> None:
    """GetEnabledStandards and one ListStandardsControlAssociations per control, shaped by the API model."""
    stubber.add_response(
        "get_enabled_standards",
        {
            "StandardsSubscriptions": [
                {
                    "StandardsSubscriptionArn": f"{arn}/subscription",
                    "StandardsArn": arn,
                    "StandardsInput": {},
                    "StandardsStatus": "READY",
                }
                for arn in enabled
            ]
        },
    )
    for control in controls:
        associations = [
            {
                "StandardsArn": arn,
                "SecurityControlId": control,
                "SecurityControlArn": f"arn:aws:securityhub:us-east-1:{ACCOUNT_ID}:security-control/{control}",
                "AssociationStatus": "ENABLED",
            }
            for arn in standards_of(control)
        ]
        stubber.add_response(
            "list_standards_control_associations",
            {"StandardsControlAssociationSummaries": associations},
            {"SecurityControlId": control},
        )


def test_live_findings_are_counted_per_control_and_unevaluated_controls_say_so():
    """The stack's switch enables FSBP only: Security Hub never evaluates CloudWatch.1 there, so its lack of a
    failed finding means nothing (round 3 printed "no failed finding")."""
    rows = compliance.statuses("dev")
    hub = [r.control for r in rows if not r.control.startswith("trainstack.")]
    client, stubber = securityhub()
    stubber.add_response("get_findings", {"Findings": [finding("S3.14"), finding("S3.14"), finding("KMS.4")]})
    stub_standards(stubber, [FSBP], hub)
    with stubber:
        failed = compliance.security_hub_failures(client)
        evaluated = compliance.security_hub_evaluated(client, hub)
    stubber.assert_no_pending_responses()
    assert failed == {"S3.14": 2, "KMS.4": 1}
    by_id = {r.control: r.aws for r in compliance.with_findings(rows, failed, evaluated)}
    assert (by_id["S3.14"], by_id["S3.5"]) == ("FAILED x2", "no failed finding")
    for control in ("CloudWatch.1", "CloudWatch.7", "CloudTrail.6", "CloudTrail.7"):
        assert by_id[control] == "not evaluated: no enabled standard has it"
    assert by_id["trainstack.residency"] == "-"
    assert (
        "Security Hub"
        in compliance.render_table(compliance.with_findings(rows, failed, evaluated)).splitlines()[0]
    )


def test_with_cis_enabled_the_alarm_controls_are_evaluated():
    client, stubber = securityhub()
    stub_standards(stubber, [FSBP, CIS_1_4], ["CloudWatch.1", "CloudWatch.2"])
    with stubber:
        evaluated = compliance.security_hub_evaluated(client, ["CloudWatch.1", "CloudWatch.2"])
    assert evaluated == {"CloudWatch.1": [CIS_1_4], "CloudWatch.2": []}  # .2 is in CIS v1.2.0 only


def test_security_hub_off_is_said_not_failed():
    client, stubber = securityhub()
    stubber.add_client_error(
        "get_findings", "InvalidAccessException", "Account is not subscribed to AWS Security Hub"
    )
    with stubber:
        assert compliance.security_hub_failures(client) is None
    assert compliance.with_findings(compliance.statuses("dev"), None)[0].aws == "Security Hub off"


def test_make_compliance_writes_the_report_and_prints_the_table(tmp_path, capsys):
    assert compliance.main(["--stack", "dev", "--out", str(tmp_path)]) == 1  # the unheard CIS alarms fail
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["control", "status", "policies"] and len(table) == len(CONTROLS) + 1
    assert len(json.loads((tmp_path / "dev.json").read_text())) == len(CONTROLS)
    assert (tmp_path / "dev.md").read_text().startswith("# Compliance report: stack dev")


def test_security_hub_switch_covers_config_1():
    by_id = {
        r.control: r
        for r in compliance.statuses("dev", {**read_stack_file("dev"), "trainstack:securityHub": True})
    }
    assert by_id["Config.1"].status == compliance.PASS and by_id["Config.1"].resources == [
        "trainstack-dev-config"
    ]
