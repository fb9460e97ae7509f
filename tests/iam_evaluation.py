"""Identity-policy evaluation as IAM does it, for the tests that decide a role's access offline.

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


def decide(
    documents: Sequence[str | Mapping[str, Any]], request: Request, variables: Mapping[str, str]
) -> str:
    """ "allowed", "explicitly denied" or "implicitly denied" (no statement allows it)."""
    statements: list[Mapping[str, Any]] = []
    for document in documents:
        parsed = json.loads(document) if isinstance(document, str) else document
        found = parsed["Statement"]
        statements += found if isinstance(found, list) else [found]
    applying = [s for s in statements if _statement_applies(s, request, variables)]
    if any(s["Effect"] == "Deny" for s in applying):
        return "explicitly denied"
    return "allowed" if applying else "implicitly denied"
