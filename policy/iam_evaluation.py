"""Policy evaluation as IAM does it, offline: the engine of the access check (policy/access.py) and of the tests
that decide a role's access.

The package index holds no maintained evaluator (principalmapper 1.1.5 fails to import on Python 3.10+), and moto
5.2.5's engine (`moto.iam.access_control.IAMPolicy`) evaluates only `StringEquals`, substitutes no policy variables
and reads a condition on a key the request lacks as an explicit deny, so this one follows the IAM User Guide:

- "Policy evaluation logic": an explicit Deny in any statement wins, else an Allow, else the implicit deny; a
  request on several resources (SubmitJob: a queue and a job definition) needs each allowed.
- "IAM JSON policy elements: Action / Resource": `*` and `?` wildcards; actions match case-insensitively.
- "IAM policy elements: Variables and tags": `${aws:PrincipalTag/<key>}` (or `${aws:username}`) is the request's
  value of that key, given as `variables`; a statement whose variable has no value matches nothing.
- "IAM JSON policy elements: Condition operators": every operator of a statement and every key of an operator must
  hold (AND), any value of a key may (OR); `...IfExists` holds when the key is absent; `Null` tests presence;
  a negated operator holds for an absent key, a positive one fails. "Single-valued vs. multivalued context keys":
  `ForAllValues:` holds when every request value matches (and when the key is absent or empty), `ForAnyValue:`
  when one does. Condition keys are case-insensitive, values case-sensitive (except ...IgnoreCase).

- "Policy evaluation logic" / "Cross-account policy evaluation logic", within one account: a request is allowed
  when an identity-based policy OR a resource-based policy allows it and no policy denies it. A resource policy
  whose Principal is the account (`arn:aws:iam::<account>:root`) grants nothing by itself: it leaves the decision
  to the account's identity policies (IAM User Guide, "AWS JSON policy elements: Principal", AWS account
  principals). A service principal has no identity policy: only the resource policy can allow it.
- AWS KMS developer guide, "Determining access to an AWS KMS key" / "Default key policy": a key's policy is
  required. A principal may use the key when the key policy allows it directly, or when the key policy allows the
  account (delegation to IAM) and an identity policy allows it too; an identity policy alone never suffices.

Operators the stacks' policies do not use are refused, so a new one cannot pass unevaluated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Context = Mapping[str, str | Sequence[str]]
VARIABLE = re.compile(r"\$\{([^}]+)\}")


@dataclass(frozen=True)
class Request:
    """One authorisation: an action on a resource, with the request's condition keys."""

    action: str
    resource: str
    context: Context = field(default_factory=dict)

    def __str__(self) -> str:
        keys = ", ".join(f"{k}={v}" for k, v in sorted(self.context.items()))
        return f"{self.action} on {self.resource}" + (f" ({keys})" if keys else "")


def _wildcard(pattern: str, value: str, case_sensitive: bool = True) -> bool:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, 0 if case_sensitive else re.IGNORECASE) is not None


def _substitute(value: str, variables: Mapping[str, str]) -> str | None:
    """A policy string with its variables replaced; None when one has no value."""
    known = {name.lower(): v for name, v in variables.items()}
    missing = False

    def replace(match: re.Match[str]) -> str:
        nonlocal missing
        if match.group(1).lower() in known:
            return known[match.group(1).lower()]
        missing = True
        return ""

    result = VARIABLE.sub(replace, value)
    return None if missing else result


def _as_list(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


_STRING_TESTS = {
    "StringEquals": lambda want, got: want == got,
    "StringEqualsIgnoreCase": lambda want, got: want.lower() == got.lower(),
    "StringLike": lambda want, got: _wildcard(want, got),
    "ArnEquals": lambda want, got: want == got,
    "ArnLike": lambda want, got: _wildcard(want, got),
    "Bool": lambda want, got: want.lower() == got.lower(),
    "NumericEquals": lambda want, got: float(want) == float(got),
    "NumericLessThan": lambda want, got: float(got) < float(want),
    "NumericGreaterThanEquals": lambda want, got: float(got) >= float(want),
}
_NEGATED = {"StringNotEquals": "StringEquals", "StringNotLike": "StringLike", "ArnNotLike": "ArnLike"}


def _lookup(context: Context, key: str) -> list[str] | None:
    for name, value in context.items():
        if name.lower() == key.lower():
            return [value] if isinstance(value, str) else list(value)
    return None


def _condition_holds(operator: str, key: str, wanted: list[str], context: Context) -> bool:
    got = _lookup(context, key)
    if operator == "Null":
        (want,) = wanted
        return (got is None or got == []) == (want.lower() == "true")
    qualifier, _, base = operator.rpartition(":")
    if_exists = base.endswith("IfExists")
    base = base.removesuffix("IfExists")
    negated = base in _NEGATED
    test = _STRING_TESTS.get(_NEGATED.get(base, base))
    if test is None or qualifier not in ("", "ForAllValues", "ForAnyValue"):
        raise ValueError(
            f"condition operator {operator!r} is not evaluated here; add it from the IAM User Guide"
        )
    if qualifier == "ForAllValues":
        return not got or all(any(test(w, g) for w in wanted) != negated for g in got)
    if got is None:
        return if_exists or negated
    if qualifier == "ForAnyValue":
        return any(any(test(w, g) for w in wanted) != negated for g in got)
    matches = any(test(w, g) for w in wanted for g in got)
    return not matches if negated else matches


def _statement_applies(statement: Mapping[str, Any], request: Request, variables: Mapping[str, str]) -> bool:
    if "NotAction" in statement:
        if any(_wildcard(a, request.action, False) for a in _as_list(statement["NotAction"])):
            return False
    elif not any(_wildcard(a, request.action, False) for a in _as_list(statement["Action"])):
        return False
    resources = [_substitute(r, variables) for r in _as_list(statement.get("Resource", "*"))]
    if not any(r is not None and _wildcard(r, request.resource) for r in resources):
        return False
    for operator, keys in statement.get("Condition", {}).items():
        for key, values in keys.items():
            wanted = [_substitute(v, variables) for v in _as_list(values)]
            if not _condition_holds(operator, key, [w for w in wanted if w is not None], request.context):
                return False
    return True


def _statements(document: str | Mapping[str, Any]) -> list[Mapping[str, Any]]:
    parsed = json.loads(document) if isinstance(document, str) else document
    found = parsed["Statement"]
    return list(found) if isinstance(found, list) else [found]


def decide(
    documents: Sequence[str | Mapping[str, Any]], request: Request, variables: Mapping[str, str]
) -> str:
    """ "allowed", "explicitly denied" or "implicitly denied" (no statement allows it)."""
    statements = [s for document in documents for s in _statements(document)]
    applying = [s for s in statements if _statement_applies(s, request, variables)]
    if any(s["Effect"] == "Deny" for s in applying):
        return "explicitly denied"
    return "allowed" if applying else "implicitly denied"


ALLOWED, EXPLICIT_DENY, IMPLICIT_DENY = "allowed", "explicitly denied", "implicitly denied"


@dataclass(frozen=True)
class Policy:
    """A named policy document: a role's inline or managed policy, or a bucket's, topic's or key's policy."""

    name: str
    document: str | Mapping[str, Any]


@dataclass(frozen=True)
class Principal:
    """Who asks: an IAM role of the account (its ARN, tags and identity policies) or an AWS service principal."""

    arn: str  # a role's ARN, or the service principal's name (cloudtrail.amazonaws.com)
    account: str
    service: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)
    policies: Sequence[Policy] = ()

    @property
    def variables(self) -> dict[str, str]:
        return {f"aws:PrincipalTag/{key}": value for key, value in self.tags.items()}

    def request_context(self, request: Request) -> Request:
        """The request with the keys AWS adds for every call by this principal (IAM User Guide, "AWS global
        condition context keys": aws:PrincipalArn, aws:PrincipalAccount, aws:PrincipalTag/<key> for an IAM
        principal; none of them for a service principal)."""
        if self.service:
            return request
        added: dict[str, str | Sequence[str]] = {
            "aws:PrincipalArn": self.arn,
            "aws:PrincipalAccount": self.account,
            **self.variables,
        }
        return Request(request.action, request.resource, {**added, **request.context})


@dataclass(frozen=True)
class Decision:
    """The outcome and the statement that decided it (`policy name/Sid`), or why nothing allowed it."""

    outcome: str
    by: str

    @property
    def allowed(self) -> bool:
        return self.outcome == ALLOWED


def _principal_kind(statement: Mapping[str, Any], principal: Principal) -> str | None:
    """How a resource-policy statement's Principal names `principal`: "direct", "account" (delegation) or None."""
    if "NotPrincipal" in statement:
        raise ValueError("NotPrincipal is not evaluated here; add it from the IAM User Guide")
    named = statement.get("Principal")
    if named == "*":
        return "direct"
    if not isinstance(named, Mapping):
        return None
    if principal.service:
        return "direct" if principal.arn in _as_list(named.get("Service", [])) else None
    for value in _as_list(named.get("AWS", [])):
        if value == "*" or value == principal.arn:
            return "direct"
        if value in (principal.account, f"arn:aws:iam::{principal.account}:root"):
            return "account"
    return None


def _label(policy: Policy, index: int, statement: Mapping[str, Any]) -> str:
    return f"{policy.name}/{statement.get('Sid') or index}"


def _applying(
    policies: Sequence[Policy], request: Request, variables: Mapping[str, str]
) -> list[tuple[str, Mapping[str, Any]]]:
    return [
        (_label(policy, i, s), s)
        for policy in policies
        for i, s in enumerate(_statements(policy.document))
        if _statement_applies(s, request, variables)
    ]


def authorize(
    principal: Principal, request: Request, resource_policy: Policy | None, *, key: bool = False
) -> Decision:
    """Whether `principal` may make `request`, through its identity policies and the resource's policy (a KMS key's
    when `key`), as the module docstring's documents decide it within one account."""
    request = principal.request_context(request)
    variables = principal.variables
    identity = [] if principal.service else _applying(principal.policies, request, variables)
    resource: list[tuple[str, Mapping[str, Any], str]] = []
    if resource_policy is not None:
        for label, s in _applying([resource_policy], request, variables):
            kind = _principal_kind(s, principal)
            if kind is not None:
                resource.append((label, s, kind))
    for label, s in [*identity, *((label, s) for label, s, _ in resource)]:
        if s["Effect"] == "Deny":
            return Decision(EXPLICIT_DENY, label)
    identity_allow = next((label for label, s in identity if s["Effect"] == "Allow"), None)
    direct = next((label for label, s, kind in resource if s["Effect"] == "Allow" and kind == "direct"), None)
    delegated = next(
        (label for label, s, kind in resource if s["Effect"] == "Allow" and kind == "account"), None
    )
    if direct is not None:
        return Decision(ALLOWED, direct)
    if key:
        if resource_policy is None:
            raise ValueError("a KMS key always has a key policy")
        if delegated is None:
            return Decision(
                IMPLICIT_DENY, f"{resource_policy.name}: no statement allows it or delegates to IAM"
            )
        if identity_allow is None:
            names = ", ".join(p.name for p in principal.policies) or "no identity policy"
            return Decision(IMPLICIT_DENY, f"{delegated} delegates to IAM; nothing allows it in {names}")
        return Decision(ALLOWED, f"{delegated} + {identity_allow}")
    if identity_allow is not None:
        return Decision(ALLOWED, identity_allow)
    where = [p.name for p in principal.policies] + ([resource_policy.name] if resource_policy else [])
    return Decision(IMPLICIT_DENY, "no statement allows it in " + (", ".join(where) or "any policy"))
