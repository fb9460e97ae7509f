"""`make policy STACK=<env>`: the pack's policies over a stack's offline preview, reported as the Pulumi CLI does.

Each registration the mocks recorded becomes what the engine hands the analyzer: resource policies get the inputs
(behind pulumi-policy's unknown-checking proxy), the URN and `protect`; stack policies get every resource with its
property dependencies and dependencies (`depends_on`) resolved to the resources they name. Parents are left out: no
policy reads them. Violations print as the "Policies:" section of `pulumi preview --policy-pack policy`; the exit status
is 1 when any violation is mandatory. Then the access check (policy/access.py) over the same preview: each failing row
is printed, and any one fails the run too; and cloudsplaining over every policy document (policy/cloudsplaining_check.py):
each finding not accepted in policy/cloudsplaining-baseline.yaml is printed and fails the run.

    python -m policy.offline --stack dev
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi_policy import (
    EnforcementLevel,
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import unknown_checking_proxy

from infra.config import StackConfigError, load_stack_config
from infra.preview import PROJECT, Plan, run_program
from policy.access import access_rows
from policy.cloudsplaining_check import baseline, findings, unaccepted
from policy.pack import ENFORCEMENT_LEVEL, PACK_NAME, POLICIES

PACK_DIR = Path(__file__).resolve().parent
# The CLI names a local pack by the path given to --policy-pack.
LOCAL_PATH = "policy"


@dataclass(frozen=True)
class Violation:
    policy: str
    enforcement_level: EnforcementLevel
    urn: str
    message: str  # the policy's description, then what is wrong: what the SDK sends the engine


def pack_version() -> str:
    """Python packs take their version from PulumiPolicy.yaml."""
    return str(yaml.safe_load((PACK_DIR / "PulumiPolicy.yaml").read_text())["version"])


def stack_urn(stack: str) -> str:
    return f"urn:pulumi:{stack}::{PROJECT}::pulumi:pulumi:Stack::{PROJECT}-{stack}"


def policy_resource(
    type_: str, inputs: Mapping[str, Any], urn: str, name: str, protect: bool
) -> PolicyResource:
    """A resource as the analyzer receives it: inputs behind the unknown-checking proxy, no dependencies yet."""
    options = PolicyResourceOptions(protect, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])
    return PolicyResource(type_, unknown_checking_proxy(dict(inputs)), urn, name, options, None, None, [], {})


def policy_resources(plan: Plan) -> list[PolicyResource]:
    """The plan's registrations as the analyzer receives them in AnalyzeStack."""
    by_urn = {r.urn: policy_resource(r.type, r.inputs, r.urn, r.name, r.protect) for r in plan.resources}
    for r in plan.resources:
        by_urn[r.urn].property_dependencies = {
            key: [by_urn[urn] for urn in urns if urn in by_urn]
            for key, urns in r.property_dependencies.items()
        }
        by_urn[r.urn].dependencies = [by_urn[urn] for urn in r.dependencies if urn in by_urn]
    return list(by_urn.values())


def evaluate(resources: Sequence[PolicyResource], stack: str) -> list[Violation]:
    """Every policy of the pack over `resources`, at its enforcement level (the pack's unless the policy sets one)."""
    violations: list[Violation] = []
    for policy in POLICIES:
        level = policy.enforcement_level or ENFORCEMENT_LEVEL
        if level == EnforcementLevel.DISABLED:
            continue

        def reporter(default_urn: str, policy=policy, level=level):
            def report_violation(message: str, urn: str | None = None) -> None:
                text = f"{policy.description}\n{message}" if message else policy.description
                violations.append(Violation(policy.name, level, urn or default_urn, text))

            return report_violation

        if isinstance(policy, ResourceValidationPolicy):
            for r in resources:
                args = ResourceValidationArgs(r.resource_type, r.props, r.urn, r.name, r.opts, None)
                policy.validate(args, reporter(r.urn))
        else:
            assert isinstance(policy, StackValidationPolicy)  # pulumi-policy's only other kind of policy
            policy.validate(StackValidationArgs(list(resources)), reporter(stack_urn(stack)))
    return violations


def mandatory(violations: Sequence[Violation]) -> list[Violation]:
    """The violations that stop `pulumi up` (advisory ones only warn)."""
    return [v for v in violations if v.enforcement_level == EnforcementLevel.MANDATORY]


def render(violations: Sequence[Violation], version: str) -> str:
    """The CLI's "Policies:" section: the pack, then each violation sorted by level, policy and URN."""
    mandatory = any(v.enforcement_level == EnforcementLevel.MANDATORY for v in violations)
    mark = "❌" if mandatory else "⚠️" if violations else "✅"
    lines = ["Policies:", f"    {mark} {PACK_NAME}@v{version} (local: {LOCAL_PATH})"]
    for v in sorted(violations, key=lambda v: (v.enforcement_level.value, v.policy, v.urn)):
        qualified_type, name = v.urn.split("::")[2:4]
        lines.append(
            f"        - [{v.enforcement_level.value}]  {v.policy}  ({qualified_type.split('$')[-1]}: {name})"
        )
        lines += [f"          {line}" for line in v.message.splitlines()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m policy.offline", description=__doc__.splitlines()[0])
    parser.add_argument("--stack", required=True, help="the stack whose Pulumi.<stack>.yaml to preview")
    args = parser.parse_args(argv)
    try:
        plan = run_program(args.stack)
        cfg = load_stack_config(args.stack)
    except (StackConfigError, pulumi.RunError) as e:  # a missing stack file, or the program's config error
        print(f"error: {e}", file=sys.stderr)
        return 2
    violations = evaluate(policy_resources(plan), args.stack)
    print(render(violations, pack_version()))
    rows = access_rows(plan, cfg)
    failing = [row for row in rows if not row.ok]
    print(
        f"Access: {len(rows)} rows, {len(failing)} failing (make access STACK={args.stack} prints them all)"
    )
    for row in failing:
        print(f"    - {row.describe()}")
    found = findings(plan.resources, cfg.name_prefix)
    new = unaccepted(found, baseline())
    print(
        f"cloudsplaining: {len(found)} findings, {len(new)} not accepted in policy/cloudsplaining-baseline.yaml"
    )
    for finding in new:
        print(f"    - {finding}")
    return 1 if mandatory(violations) or failing or new else 0


if __name__ == "__main__":
    sys.exit(main())
