"""cloudsplaining (Salesforce, pinned in requirements/dev.txt) over every IAM policy document of a stack's preview.

Identity policies (role inline policies, managed policies, Identity Center inline policies) go through
`cloudsplaining.scan.policy_document.PolicyDocument` in its default mode (a statement scoped by a resource ARN or a
condition is not flagged): privilege escalation, data exfiltration, credentials exposure, infrastructure modification
and permissions management without constraints, service wildcards, NotAction. Resource policies (key, bucket, topic,
repository policies and role trust policies) go through `ResourcePolicyDocument.internet_accessible_actions`.

A finding is `(document, category, item)`, the document named with the stack's prefix as `<prefix>`. Each must be
fixed or accepted in policy/cloudsplaining-baseline.yaml with its reason; an unaccepted finding fails `make policy`,
and an accepted one that no stack reports any longer is stale (tests/policy/test_cloudsplaining_check.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cloudsplaining.scan.policy_document import PolicyDocument
from cloudsplaining.scan.resource_policy_document import ResourcePolicyDocument

from infra.mocks import PlannedResource

BASELINE = Path(__file__).resolve().parent / "cloudsplaining-baseline.yaml"
IDENTITY_POLICIES = {
    "aws:iam/rolePolicy:RolePolicy": "policy",
    "aws:iam/policy:Policy": "policy",
    "aws:ssoadmin/permissionSetInlinePolicy:PermissionSetInlinePolicy": "inlinePolicy",
}
RESOURCE_POLICIES = {
    "aws:kms/key:Key": "policy",
    "aws:s3/bucketPolicy:BucketPolicy": "policy",
    "aws:sns/topicPolicy:TopicPolicy": "policy",
    "aws:ecr/repositoryPolicy:RepositoryPolicy": "policy",
    "aws:iam/role:Role": "assumeRolePolicy",
}
# PolicyDocument's findings, by the names cloudsplaining's report gives them.
CATEGORIES = {
    "PrivilegeEscalation": "allows_privilege_escalation",
    "DataExfiltration": "allows_data_exfiltration_actions",
    "CredentialsExposure": "credentials_exposure",
    "InfrastructureModification": "infrastructure_modification",
    "PermissionsManagement": "permissions_management_without_constraints",
    "ServiceWildcard": "service_wildcard",
    "NotAction": "contains_statement_using_not_action",
}


@dataclass(frozen=True, order=True)
class Finding:
    document: str  # the resource's name, the stack prefix written <prefix>
    category: str
    item: str  # the action (or the method, for privilege escalation)

    def __str__(self) -> str:
        return f"{self.document}: {self.category} {self.item}"


def _items(value: Any) -> list[str]:
    found = []
    for entry in value:
        if isinstance(entry, dict):  # privilege escalation: {"type": method, "actions": [...]}
            found.append(str(entry.get("type") or entry.get("Sid") or json.dumps(entry, sort_keys=True)))
        else:
            found.append(str(entry))
    return found


def findings(resources: Sequence[PlannedResource], prefix: str) -> list[Finding]:
    """Every finding cloudsplaining reports on the plan's policy documents."""
    found: set[Finding] = set()
    for r in resources:
        name = r.name.replace(prefix, "<prefix>", 1)
        if r.type in IDENTITY_POLICIES and r.inputs.get(IDENTITY_POLICIES[r.type]):
            document = PolicyDocument(json.loads(r.inputs[IDENTITY_POLICIES[r.type]]))
            for category, attribute in CATEGORIES.items():
                found |= {Finding(name, category, item) for item in _items(getattr(document, attribute))}
        if r.type in RESOURCE_POLICIES and r.inputs.get(RESOURCE_POLICIES[r.type]):
            exposed = ResourcePolicyDocument(json.loads(r.inputs[RESOURCE_POLICIES[r.type]]))
            found |= {Finding(name, "InternetAccessible", a) for a in exposed.internet_accessible_actions}
    return sorted(found)


@dataclass(frozen=True)
class Accepted:
    finding: Finding
    reason: str


def baseline(path: Path = BASELINE) -> list[Accepted]:
    entries = yaml.safe_load(path.read_text()) or []
    return [
        Accepted(Finding(e["document"], e["category"], e["item"]), str(e["reason"]).strip()) for e in entries
    ]


def unaccepted(found: Sequence[Finding], accepted: Sequence[Accepted]) -> list[Finding]:
    known = {a.finding for a in accepted if a.reason}
    return [f for f in found if f not in known]
