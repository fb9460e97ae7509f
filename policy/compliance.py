"""`make compliance STACK=<env> [LIVE=1]`: each control (trainer/contract/controls.py), the policies and resources
that implement it, and its status on the stack's offline preview: pass (its policies ran on the resources that implement it and none
failed), fail (a policy failed on a resource, at any enforcement level: the same finding `make policy` prints), accepted
(a control judged per resource does not hold on the resources named, for the reason given), or not covered (with why;
a CIS alarm control is implemented only by the audit alarm on its own metric). With --live and
credentials, Security Hub's view is added per control: its failed findings (GetFindings), or "not evaluated" when
no enabled standard holds the control (GetEnabledStandards, ListStandardsControlAssociations), or "Security Hub
off". Writes runs/compliance/<stack>.json and .md, prints the table.

    python -m policy.compliance --stack dev [--live] [--format json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from infra.audit import AUDIT_NAMESPACE
from infra.config import StackConfigError, load_stack_config, parse_stack_config
from infra.preview import run_program
from policy.offline import evaluate, policy_resources
from trainer.contract.controls import CONTROLS, Control

ROOT = Path(__file__).resolve().parents[1]
# accepted: the control does not hold on the resources named, for the reason given (never counted as a pass).
PASS, FAIL, NOT_COVERED, ACCEPTED = "pass", "fail", "not covered", "accepted"


@dataclass(frozen=True)
class ControlStatus:
    control: str
    title: str
    status: str
    policies: list[str]
    resources: list[str]
    detail: str  # the failing resources and why, or why not covered, or where else it is proven
    aws: str = ""  # with --live: Security Hub's failed findings for the control


def _name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def statuses(stack: str, values: dict[str, Any] | None = None) -> list[ControlStatus]:
    """Every control's status on `stack`'s offline preview (with `values` instead of its stack file, if given)."""
    config = parse_stack_config(stack, values) if values is not None else load_stack_config(stack)
    plan = run_program(stack, values)
    violations = defaultdict(list)
    for violation in evaluate(policy_resources(plan), stack):
        violations[violation.policy].append(violation)
    return [_status(control, plan.resources, violations, config.organization_trail) for control in CONTROLS]


def _present(control: Control, resources: list) -> list:
    """The resources that implement `control`: of its types, and for a CIS alarm control only the audit alarm on its
    metric (the stack's other alarms implement nothing of it)."""
    found = [r for r in resources if r.type in control.resource_types]
    if control.cis_metric:
        found = [
            r
            for r in found
            if (r.inputs.get("namespace"), r.inputs.get("metricName"))
            == (AUDIT_NAMESPACE, control.cis_metric)
        ]
    return found


def _concerns(control: Control, violation: Any, present: list[str]) -> bool:
    """Whether a violation of one of the control's policies is about this control: for a CIS alarm control, one on
    its own alarm or one whose message names the control (cis-metric-filters reports a missing filter so)."""
    if not control.cis_metric:
        return True
    return _name(violation.urn) in present or f"{control.id} " in violation.message


def _status(
    control: Control, resources: list, violations: dict, organization_trail: str | None
) -> ControlStatus:
    implementing = _present(control, resources)
    present = [r.name for r in implementing]

    def status(state: str, detail: str) -> ControlStatus:
        return ControlStatus(control.id, control.title, state, list(control.policies), present, detail=detail)

    failing = [
        v for policy in control.policies for v in violations.get(policy, []) if _concerns(control, v, present)
    ]
    if failing:
        return status(FAIL, "; ".join(f"{_name(v.urn)}: {v.message.splitlines()[-1]}" for v in failing))
    if control.holds_when:  # judged per resource, as Security Hub does
        lacking = [r.name for r in implementing if not r.inputs.get(control.holds_when)]
        if lacking:
            state = ACCEPTED if control.accepted else FAIL
            return status(state, f"no {control.holds_when} on {', '.join(lacking)}: {control.accepted}")
    if present:
        return status(
            PASS, control.evidence or f"checked by {', '.join(control.policies) or 'its resources'}"
        )
    if organization_trail and control.id.startswith(("CloudTrail.", "CloudWatch.")):
        return status(
            NOT_COVERED,
            f"recorded by the organisation trail {organization_trail}; its account holds the trail and alarms",
        )
    return status(NOT_COVERED, control.not_covered or f"the stack has no {', '.join(control.resource_types)}")


def security_hub_evaluated(securityhub: Any, controls: list[str]) -> dict[str, list[str]] | None:
    """For each Security Hub control id, the enabled standards that evaluate it (an empty list: none does); None
    when Security Hub is not enabled. A control is evaluated only in a standard that is enabled and whose
    association with it is ENABLED (Security Hub API, GetEnabledStandards and ListStandardsControlAssociations)."""
    from botocore.exceptions import ClientError

    try:
        enabled = {
            subscription["StandardsArn"]
            for page in securityhub.get_paginator("get_enabled_standards").paginate()
            for subscription in page["StandardsSubscriptions"]
            if subscription["StandardsStatus"] in ("READY", "INCOMPLETE")
        }
        evaluated = {}
        for control in controls:
            pages = securityhub.get_paginator("list_standards_control_associations").paginate(
                SecurityControlId=control
            )
            evaluated[control] = sorted(
                association["StandardsArn"]
                for page in pages
                for association in page["StandardsControlAssociationSummaries"]
                if association["AssociationStatus"] == "ENABLED" and association["StandardsArn"] in enabled
            )
    except ClientError as error:
        if error.response["Error"]["Code"] in ("InvalidAccessException", "AccessDeniedException"):
            return None
        raise
    return evaluated


def security_hub_failures(securityhub: Any) -> dict[str, int] | None:
    """Active failed control findings per control id; None when Security Hub is not enabled in the region."""
    from botocore.exceptions import ClientError

    failed: dict[str, int] = defaultdict(int)
    filters = {
        "ComplianceStatus": [{"Value": "FAILED", "Comparison": "EQUALS"}],
        "RecordState": [{"Value": "ACTIVE", "Comparison": "EQUALS"}],
    }
    try:
        for page in securityhub.get_paginator("get_findings").paginate(Filters=filters):
            for finding in page["Findings"]:
                control = (finding.get("Compliance") or {}).get("SecurityControlId")
                if control:
                    failed[control] += 1
    except ClientError as error:
        if error.response["Error"]["Code"] in ("InvalidAccessException", "AccessDeniedException"):
            return None
        raise
    return dict(failed)


def with_findings(
    rows: list[ControlStatus], failed: dict[str, int] | None, evaluated: dict[str, list[str]] | None = None
) -> list[ControlStatus]:
    """Each row with Security Hub's word on it: off, not a Security Hub control, not evaluated by any enabled
    standard (so no finding means nothing), its failed findings, or none."""

    def aws(control: str) -> str:
        if failed is None or evaluated is None:
            return "Security Hub off"
        if control not in evaluated:
            return "-"  # trainstack's own promise
        if not evaluated[control]:
            return "not evaluated: no enabled standard has it"
        return f"FAILED x{failed[control]}" if control in failed else "no failed finding"

    return [ControlStatus(**{**asdict(row), "aws": aws(row.control)}) for row in rows]


def render_table(rows: list[ControlStatus]) -> str:
    live = any(row.aws for row in rows)
    header = ["control", "status", "policies", *(["Security Hub"] if live else []), "detail"]
    lines = [
        [row.control, row.status, ", ".join(row.policies) or "-", *([row.aws] if live else []), row.detail]
        for row in rows
    ]
    widths = [max(len(str(line[i])) for line in [header, *lines]) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(
            [*(str(v).ljust(w) for v, w in zip(line[:-1], widths, strict=True)), str(line[-1])]
        ).rstrip()
        for line in [header, *lines]
    )


def render_markdown(stack: str, rows: list[ControlStatus]) -> str:
    lines = [
        f"# Compliance report: stack {stack}",
        "",
        "| control | title | status | policies | resources | detail |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r.control} | {r.title} | {r.status} | {', '.join(r.policies)} | {', '.join(r.resources)} | {r.detail} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True)
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument(
        "--live", action="store_true", help="also read Security Hub's findings (needs credentials)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "compliance")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m policy.compliance", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        rows = statuses(args.stack)
    except StackConfigError as error:
        print(f"compliance: {error}", file=sys.stderr)
        return 2
    if args.live:
        import boto3
        from botocore.config import Config

        region = load_stack_config(args.stack).region
        securityhub = boto3.client(
            "securityhub", region_name=region, config=Config(retries={"mode": "adaptive"})
        )
        hub_controls = [row.control for row in rows if not row.control.startswith("trainstack.")]
        rows = with_findings(
            rows, security_hub_failures(securityhub), security_hub_evaluated(securityhub, hub_controls)
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.stack}.json").write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    (args.out / f"{args.stack}.md").write_text(render_markdown(args.stack, rows))
    print(json.dumps([asdict(r) for r in rows], indent=2) if args.format == "json" else render_table(rows))
    return 1 if any(r.status == FAIL for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
