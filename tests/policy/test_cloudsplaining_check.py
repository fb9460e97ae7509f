"""cloudsplaining over every checked-in stack's policy documents, against the reviewed baseline."""

from __future__ import annotations

import dataclasses
import json

import pytest

from infra.config import load_stack_config
from policy import cloudsplaining_check as check
from tests.conftest import stack_plan
from trainer.contract.stack import stack_names

MEMBERS = ["arn:aws:iam::123456789012:role/engineers"]
TEAMS = json.dumps([{"name": n, "gpuQuota": 8, "members": MEMBERS} for n in ("vision", "speech")])
VARIANTS = [(name, ()) for name in stack_names()] + [
    ("prod", (("trainstack:teams", TEAMS), ("trainstack:securityHub", "true")))
]


def found_on(stack: str, changes=()) -> list[check.Finding]:
    return check.findings(stack_plan(stack, changes).resources, load_stack_config(stack).name_prefix)


@pytest.mark.parametrize(("stack", "changes"), VARIANTS)
def test_every_finding_on_every_stack_is_accepted_with_a_reason(stack, changes):
    assert check.unaccepted(found_on(stack, changes), check.baseline()) == []


def test_every_accepted_finding_is_still_reported_and_has_a_reason():
    reported = {f for stack, changes in VARIANTS for f in found_on(stack, changes)}
    for accepted in check.baseline():
        assert accepted.reason, accepted
        assert accepted.finding in reported, f"stale baseline entry: {accepted.finding}"


def test_a_role_that_could_escalate_or_leak_credentials_is_reported():
    """The job role with two statements a reviewer must see: PassRole on anything, access keys for anyone."""
    plan = stack_plan("dev")

    def widened(resource):
        if resource.type != "aws:iam/rolePolicy:RolePolicy" or resource.name != "trainstack-dev-job":
            return resource
        document = json.loads(resource.inputs["policy"])
        document["Statement"].append(
            {"Effect": "Allow", "Action": ["iam:PassRole", "iam:CreateAccessKey"], "Resource": "*"}
        )
        return dataclasses.replace(resource, inputs={**resource.inputs, "policy": json.dumps(document)})

    resources = [widened(r) for r in plan.resources]
    new = check.unaccepted(check.findings(resources, "trainstack-dev"), check.baseline())
    assert check.Finding("<prefix>-job", "CredentialsExposure", "iam:CreateAccessKey") in new
    assert check.Finding("<prefix>-job", "PermissionsManagement", "iam:PassRole") in new
    assert all(f.document == "<prefix>-job" for f in new)
