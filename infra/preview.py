"""Offline preview: run the real Pulumi program under mocks with a stack's config; print what it would create.

No AWS credentials, no Pulumi CLI, no provider plugins. `--format table` groups resources by component with their
key settings; `--format json` prints one object per resource, `{"type", "name", "inputs", "parent", "protect",
"retainOnDelete"}`, inputs as the engine receives them (camelCase, numbers as floats), for reviews and policies.

    python -m infra.preview --stack dev [--format table|json]
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi.runtime import settings
from pulumi.runtime.config import set_all_config
from pulumi.runtime.stack import Stack
from rich.console import Console
from rich.table import Table

from infra.config import ROOT, StackConfigError, read_stack_file
from infra.mocks import PREVIEW_CALLER, PlannedResource, install

PROJECT = "trainstack"
PROGRAM = ROOT / "infra" / "__main__.py"

# Inputs worth a glance in the table, in this order, when a resource has them.
KEY_SETTINGS = (
    "cidrBlock",
    "availabilityZone",
    "serviceName",
    "deploymentType",
    "storageCapacity",
    "perUnitStorageThroughput",
    "dataCompressionType",
    "fileSystemPath",
    "dataRepositoryPath",
    "strategy",
    "type",
    "imageTagMutability",
    "enableKeyRotation",
    "retentionInDays",
    "ipProtocol",
    "fromPort",
    "toPort",
    "cidrIpv4",
    # EKS stacks: the cluster's minor, the node groups' capacity, the charts' pins.
    "amiType",
    "capacityType",
    "chart",
    "version",
)


@dataclass
class Plan:
    stack: str
    resources: list[PlannedResource]
    outputs: dict[str, Any]


def cli_config(values: Mapping[str, Any]) -> dict[str, str]:
    """Config as the Pulumi CLI hands it to a program: strings, with lists and maps as JSON."""

    def as_cli_string(value: Any) -> str:
        if isinstance(value, list | dict):
            return json.dumps(value)
        return str(value).lower() if isinstance(value, bool) else str(value)

    return {key: as_cli_string(value) for key, value in values.items()}


def preview_caller(values: Mapping[str, Any]) -> str:
    """Offline there is no deployer: an EKS stack's preview deploys as a session of its first admin role (or as its
    first admin user), as `pulumi up` must (infra/eks_access.py); any other stack as a stand-in user."""
    admins = list(values.get("trainstack:eksAdminArns") or [])
    if not admins:
        return PREVIEW_CALLER
    parts = admins[0].split(":", 5)  # arn:aws:iam::<account>:role/<path/name>
    account, (kind, name) = parts[4], parts[5].split("/", 1)
    return (
        f"arn:aws:sts::{account}:assumed-role/{name.rsplit('/', 1)[-1]}/preview"
        if kind == "role"
        else admins[0]
    )


def run_program(stack: str, values: Mapping[str, Any] | None = None, caller_arn: str | None = None) -> Plan:
    """Run infra/__main__.py under the mocks with Pulumi.<stack>.yaml's config (or `values`), deploying as
    `caller_arn` (default: `preview_caller`).

    Bad config raises pulumi.RunError (the program's StackConfigError message) before it registers any resource;
    a missing stack file raises StackConfigError.
    """
    values = read_stack_file(stack) if values is None else values
    settings.reset_options(project=PROJECT, stack=stack, preview=True)
    region = str(values.get("aws:region", "us-east-1"))
    mocks = install(PROJECT, stack, region, caller_arn or preview_caller(values))
    set_all_config(cli_config(values))
    exported: dict[str, Any] = {}

    @pulumi.runtime.test
    def program() -> pulumi.Output:
        runpy.run_path(str(PROGRAM), run_name="__main__")
        root = settings.get_root_resource()
        assert isinstance(root, Stack)  # set_mocks made the stack, and only a Stack sets the root resource
        return pulumi.Output.from_input(root.outputs).apply(exported.update)

    program()
    # Registration order varies from run to run (RPCs run in threads); a stable order keeps previews diffable.
    resources = sorted(mocks.recorded.values(), key=lambda r: (r.parent or "", r.type, r.name))
    return Plan(stack, resources, exported)


def as_json(plan: Plan) -> str:
    return json.dumps([resource.to_json() for resource in plan.resources], indent=2, default=str)


def key_settings(resource: PlannedResource) -> str:
    inputs = resource.inputs
    shown = [
        f"{key}={inputs[key]:g}" if isinstance(inputs[key], float) else f"{key}={inputs[key]}"
        for key in KEY_SETTINGS
        if key in inputs
    ]
    if resource.type == "aws:ec2/launchTemplate:LaunchTemplate":
        interfaces = inputs.get("networkInterfaces", [])
        efa = sum(i.get("interfaceType") in ("efa", "efa-only") for i in interfaces)
        shown.append(f"EFA interfaces={efa} IMDS tokens={inputs['metadataOptions']['httpTokens']}")
    if resource.type == "aws:batch/computeEnvironment:ComputeEnvironment":
        cr = inputs["computeResources"]
        shown.append(
            f"{cr['type']} {','.join(cr['instanceTypes'])} vCPUs {cr['minVcpus']:g}..{cr['maxVcpus']:g}"
        )
    if resource.type == "aws:batch/jobDefinition:JobDefinition":
        shown.append(
            f"nodes={json.loads(inputs['nodeProperties'])['numNodes'] if 'nodeProperties' in inputs else 1}"
        )
    if resource.protect or resource.retain_on_delete:
        shown.append("[bold]protected, retained on delete[/bold]")
    return " ".join(shown)


def short_type(type_: str) -> str:
    """`aws:ec2/launchTemplate:LaunchTemplate` -> `ec2.LaunchTemplate`, as the Python SDK names the class."""
    package, module, cls = type_.split(":")
    return f"{module.split('/')[0]}.{cls}" if package == "aws" else type_


def render_table(plan: Plan, console: Console) -> None:
    components = [r for r in plan.resources if not r.custom]
    for component in components:
        children = [r for r in plan.resources if r.parent == component.name and r.custom]
        table = Table(title=f"{component.type} [dim]{component.name}[/dim] ({len(children)} resources)")
        for column in ("type", "name", "key settings"):
            table.add_column(column, overflow="fold")
        for child in children:
            table.add_row(short_type(child.type), child.name, key_settings(child))
        console.print(table)
    console.print("[bold]Stack outputs[/bold]")
    for name, value in plan.outputs.items():
        console.print(f"  {name} = {value}", soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.preview", description=__doc__.splitlines()[0])
    parser.add_argument("--stack", required=True, help="the stack whose Pulumi.<stack>.yaml to use")
    # outputs: the stack outputs alone, as `pulumi stack output --json` prints them (make render reads them).
    parser.add_argument("--format", choices=("table", "json", "outputs"), default="table")
    args = parser.parse_args(argv)
    try:
        plan = run_program(args.stack)
    except (StackConfigError, pulumi.RunError) as e:  # a missing stack file, or the program's config error
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(as_json(plan))
    elif args.format == "outputs":
        print(json.dumps(plan.outputs, indent=2, default=str))
    else:
        # Piped into a file or a pull request comment: wide enough that types and names do not wrap.
        render_table(plan, Console() if sys.stdout.isatty() else Console(width=160))
    return 0


if __name__ == "__main__":
    sys.exit(main())
