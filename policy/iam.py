"""IAM policy documents: no statement allows every action, none allows `Resource: "*"` beyond AWS's own exceptions.

Documents are found wherever a resource takes one (`policy`, `assumeRolePolicy`, `inlinePolicies[].policy`): role,
user and group policies, managed policies, bucket, key and repository policies. Deny statements are guardrails and
may use wildcards (the TLS-only bucket policy denies `s3:*`).

- Action: an Allow statement may not name `"*"` nor a whole service (`"s3:*"`): both grant actions nobody reviewed,
  including ones AWS adds later. `NotAction` in an Allow statement grants everything it does not list, so it counts
  as a wildcard too. Prefix patterns (`kms:Get*`) stay allowed: they name one verb family.
- Resource: an Allow statement of an identity policy (one without `Principal`) may use `"*"` (or `NotResource`)
  only for the actions in `infra.identity.WILDCARD_RESOURCE_ACTIONS`, which AWS grants on `"*"` alone. Resource
  policies (bucket, key) are exempt: there `"*"` means the resource the policy is attached to.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from pulumi_policy import ReportViolation, ResourceValidationArgs, ResourceValidationPolicy

from infra.iam import WILDCARD_RESOURCE_ACTIONS
from policy.resources import as_list

DOCUMENT_INPUTS = ("policy", "assumeRolePolicy")
# IAM action names are case-insensitive.
WILDCARD_RESOURCE_ALLOWED = frozenset(action.lower() for action in WILDCARD_RESOURCE_ACTIONS)


def parse_document(value: Any) -> Mapping[str, Any] | None:
    """A policy document given as JSON text (or an object); None for anything else (an ECR lifecycle policy)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, Mapping) and "Statement" in value else None


def statements(document: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return as_list(document["Statement"])


def documents(props: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(where, document) for every IAM policy document among a resource's inputs."""
    candidates = [(key, props.get(key)) for key in DOCUMENT_INPUTS]
    candidates += [
        (f"inlinePolicies[{i}]", inline.get("policy"))
        for i, inline in enumerate(props.get("inlinePolicies") or [])
    ]
    for where, value in candidates:
        document = parse_document(value)
        if document is not None:
            yield where, document


def statement_label(where: str, index: int, statement: Mapping[str, Any]) -> str:
    return f"{where} statement {statement.get('Sid') or index}"


def is_service_wildcard(action: str) -> bool:
    return action == "*" or action.endswith(":*")


def validate_no_wildcard_action(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    for where, document in documents(args.props):
        for index, statement in enumerate(statements(document)):
            if statement.get("Effect") != "Allow":
                continue
            label = statement_label(where, index, statement)
            if "NotAction" in statement:
                report_violation(
                    f"{args.name}: {label} allows every action but those in NotAction: "
                    "list the actions it needs under Action instead.",
                    None,
                )
            wildcards = [a for a in as_list(statement.get("Action")) if is_service_wildcard(a)]
            if wildcards:
                report_violation(
                    f"{args.name}: {label} allows {', '.join(repr(a) for a in wildcards)}: "
                    "list the actions it needs (e.g. 's3:GetObject').",
                    None,
                )


def validate_no_wildcard_resource(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    for where, document in documents(args.props):
        for index, statement in enumerate(statements(document)):
            if statement.get("Effect") != "Allow" or "Principal" in statement or "NotPrincipal" in statement:
                continue
            label = statement_label(where, index, statement)
            if "NotResource" in statement:
                report_violation(
                    f"{args.name}: {label} allows its actions on every resource but those in NotResource: "
                    "name the resources (ARNs) under Resource instead.",
                    None,
                )
            if "*" not in as_list(statement.get("Resource")):
                continue
            scoped = [
                a for a in as_list(statement.get("Action")) if a.lower() not in WILDCARD_RESOURCE_ALLOWED
            ]
            if scoped:
                report_violation(
                    f"{args.name}: {label} allows {', '.join(scoped)} on Resource '*': name the resources "
                    "(ARNs) in a statement of their own. Only these actions may use '*', since AWS grants them "
                    f"on nothing else: {', '.join(WILDCARD_RESOURCE_ACTIONS)}.",
                    None,
                )


no_wildcard_action = ResourceValidationPolicy(
    name="iam-no-wildcard-action",
    description='No IAM policy statement allows every action ("*") or every action of a service ("s3:*").',
    validate=validate_no_wildcard_action,
)

no_wildcard_resource = ResourceValidationPolicy(
    name="iam-no-wildcard-resource",
    description=(
        'No identity policy statement allows actions on Resource "*", except the few actions AWS grants '
        "on nothing else (infra/identity.py WILDCARD_RESOURCE_ACTIONS)."
    ),
    validate=validate_no_wildcard_resource,
)
