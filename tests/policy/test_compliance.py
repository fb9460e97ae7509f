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
from policy.offline import Violation
from trainer.contract.controls import CONTROLS

ORG_TRAIL = "arn:aws:cloudtrail:us-east-1:111122223333:trail/org-trail"


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_every_control_has_a_row_and_no_stack_fails(stack):
    rows = compliance.statuses(stack)
    assert [r.control for r in rows] == [c.id for c in CONTROLS]
    assert {r.status for r in rows} <= {compliance.PASS, compliance.NOT_COVERED}
    by_id = {r.control: r for r in rows}
    assert by_id["CloudTrail.1"].status == compliance.PASS and by_id["CloudTrail.1"].resources
    assert by_id["trainstack.teams"].detail == "the stack has no trainstack:teams: it is single-tenant"
    assert all(r.detail for r in rows if r.status == compliance.NOT_COVERED)


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


def test_live_findings_are_counted_per_control():
    client, stubber = securityhub()
    stubber.add_response("get_findings", {"Findings": [finding("S3.14"), finding("S3.14"), finding("KMS.4")]})
    with stubber:
        failed = compliance.security_hub_failures(client)
    assert failed == {"S3.14": 2, "KMS.4": 1}
    rows = compliance.with_findings(compliance.statuses("dev"), failed)
    by_id = {r.control: r.aws for r in rows}
    assert (by_id["S3.14"], by_id["S3.5"]) == ("FAILED x2", "no failed finding")
    assert "Security Hub" in compliance.render_table(rows).splitlines()[0]


def test_security_hub_off_is_said_not_failed():
    client, stubber = securityhub()
    stubber.add_client_error(
        "get_findings", "InvalidAccessException", "Account is not subscribed to AWS Security Hub"
    )
    with stubber:
        assert compliance.security_hub_failures(client) is None
    assert compliance.with_findings(compliance.statuses("dev"), None)[0].aws == "Security Hub off"


def test_make_compliance_writes_the_report_and_prints_the_table(tmp_path, capsys):
    assert compliance.main(["--stack", "dev", "--out", str(tmp_path)]) == 0
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
