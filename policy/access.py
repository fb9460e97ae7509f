"""`make access STACK=<env>`: every actor of the stack, what it must and must not do, decided from the planned policies.

The offline preview holds every policy document the stack registers. policy/actors.py reads them once
(`StackPolicies`) and lists the needs of each actor the stack creates or relies on, each with the document that says
the actor must make that call, and the calls a team must never be able to make; this module decides every one with
policy/iam_evaluation.py (IAM's and KMS's documented evaluation logic) and prints the table. A row fails when a need is refused or a
must-not is allowed; it names the actor, action, resource and the statement that decided.

`make policy` fails on any failing row (policy/offline.py); `make access` prints the whole table.

What is not here: AWS-managed policies (their text is AWS's; a need that rests on one is not listed), service
control policies and permission boundaries (none in the stack), and whether a service sends the condition keys its
documentation shows (only an account shows that: docs/security.md, "What was verified offline").

    python -m policy.access --stack eks-dev
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi

from infra.config import StackConfig, StackConfigError, load_stack_config
from infra.preview import Plan, run_program
from policy.actors import NEEDS, Need, StackPolicies
from policy.iam_evaluation import Decision, Principal, Request, authorize


@dataclass(frozen=True)
class Row:
    need: Need
    decision: Decision

    @property
    def ok(self) -> bool:
        return self.decision.allowed == self.need.allowed

    def describe(self) -> str:
        need = self.need
        wanted = "needs" if need.allowed else "must not have"
        keys = ", ".join(f"{k}={v}" for k, v in sorted(need.context.items()))
        return (
            f"{need.actor} {wanted} {need.action} on {need.resource}"
            + (f" ({keys})" if keys else "")
            + f": {self.decision.outcome} by {self.decision.by} [{need.source}]"
        )


def principal_of(stack: StackPolicies, actor: str) -> Principal:
    return stack.roles[actor] if actor in stack.roles else stack.service(actor)


def decide(stack: StackPolicies, need: Need) -> Row:
    policy, key = stack.resource_policy(need.resource)
    request = Request(need.action, need.resource, need.context)
    return Row(need, authorize(principal_of(stack, need.actor), request, policy, key=key))


def access_rows(plan: Plan, cfg: StackConfig) -> list[Row]:
    """Every need and must-not of the stack, decided."""
    stack = StackPolicies(plan, cfg)
    return [decide(stack, need) for needs in NEEDS for need in needs(stack)]


def render(rows: Sequence[Row]) -> str:
    lines = [f"{'ok' if row.ok else 'FAIL':4}  {row.describe()}" for row in rows]
    failed = sum(not row.ok for row in rows)
    lines.append(f"{len(rows)} rows, {failed} failing")
    return "\n".join(lines)


def as_json(rows: Sequence[Row]) -> str:
    return json.dumps(
        [
            {
                "actor": r.need.actor,
                "action": r.need.action,
                "resource": r.need.resource,
                "context": dict(r.need.context),
                "must_be_allowed": r.need.allowed,
                "outcome": r.decision.outcome,
                "decided_by": r.decision.by,
                "source": r.need.source,
                "ok": r.ok,
            }
            for r in rows
        ],
        indent=2,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m policy.access", description=__doc__.splitlines()[0])
    parser.add_argument("--stack", required=True, help="the stack whose Pulumi.<stack>.yaml to preview")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    args = parser.parse_args(argv)
    try:
        cfg = load_stack_config(args.stack)
        plan = run_program(args.stack)
    except (StackConfigError, pulumi.RunError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = access_rows(plan, cfg)
    print(render(rows) if args.format == "table" else as_json(rows))
    return 0 if all(row.ok for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
