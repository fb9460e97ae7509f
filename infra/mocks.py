"""Pulumi mocks for the offline preview and the tests: run the real program with no AWS, no CLI, no plugins.

Every registration is recorded as a `PlannedResource` with its inputs as the engine receives them (camelCase keys,
numbers as floats), the resource options a policy or reviewer cares about (parent, protect, retainOnDelete, dependsOn,
replaceOnChanges), and the
URN with the registration's property dependencies (which resources feed each input), as a policy analyzer sees them.
Computed outputs that the program reads (ARNs, bucket names, FSx DNS and mount names, ECR URLs) are faked per type.
Data-source calls are answered by token; an unknown token raises so that a new, unmocked call is noticed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.runtime.mocks import MockCallArgs, MockMonitor, MockResourceArgs

ACCOUNT_ID = "123456789012"
# Who the offline preview deploys as, unless told (infra/preview.py `preview_caller`).
PREVIEW_CALLER = f"arn:aws:iam::{ACCOUNT_ID}:user/preview"


@dataclass
class PlannedResource:
    type: str
    name: str
    inputs: dict[str, Any]
    parent: str | None = None  # the parent resource's name; None under the stack
    protect: bool = False
    retain_on_delete: bool = False
    custom: bool = True  # False for ComponentResources
    id: str = ""
    outputs: dict[str, Any] = field(default_factory=dict, repr=False)  # as faked: ARNs, names, DNS names
    urn: str = ""
    property_dependencies: dict[str, list[str]] = field(default_factory=dict, repr=False)  # input -> URNs
    dependencies: list[str] = field(default_factory=list, repr=False)  # URNs: depends_on and every input's
    replace_on_changes: list[str] = field(default_factory=list)  # inputs whose change replaces the resource

    def to_json(self) -> dict[str, Any]:
        """The preview's JSON object: option names as the engine spells them."""
        return {
            "type": self.type,
            "name": self.name,
            "inputs": self.inputs,
            "parent": self.parent,
            "protect": self.protect,
            "retainOnDelete": self.retain_on_delete,
        }


# AWS's id prefixes, so that ids in a preview read like the real ones.
ID_PREFIXES = {
    "aws:ec2/vpc:Vpc": "vpc",
    "aws:ec2/subnet:Subnet": "subnet",
    "aws:ec2/securityGroup:SecurityGroup": "sg",
    "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup": "sg",
    "aws:ec2/routeTable:RouteTable": "rtb",
    "aws:ec2/internetGateway:InternetGateway": "igw",
    "aws:ec2/natGateway:NatGateway": "nat",
    "aws:ec2/eip:Eip": "eipalloc",
    "aws:ec2/vpcEndpoint:VpcEndpoint": "vpce",
    "aws:ec2/launchTemplate:LaunchTemplate": "lt",
    "aws:ec2/flowLog:FlowLog": "fl",
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": "sgr",
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": "sgr",
    "aws:fsx/lustreFileSystem:LustreFileSystem": "fs",
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": "dra",
}


def _fake_id(name: str, prefix: str) -> str:
    return f"{prefix}-{hashlib.sha256(name.encode()).hexdigest()[:17]}"


class StackMocks(pulumi.runtime.Mocks):
    """Fakes what AWS would compute for each resource type this program registers."""

    def __init__(self, region: str, caller_arn: str = PREVIEW_CALLER) -> None:
        self.region, self.caller_arn = region, caller_arn
        self.recorded: dict[tuple[str, str], PlannedResource] = {}

    def call(self, args: MockCallArgs) -> tuple[dict, list]:
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            arn = self.caller_arn
            return {"accountId": ACCOUNT_ID, "arn": arn, "userId": "AIDAPREVIEW", "id": ACCOUNT_ID}, []
        raise NotImplementedError(f"no mock for data source {args.token}; add one to infra/mocks.py")

    def new_resource(self, args: MockResourceArgs) -> tuple[str, dict]:
        resource_id, outputs = self._outputs(args.typ, args.name, dict(args.inputs))
        self.recorded[args.typ, args.name] = PlannedResource(
            type=args.typ,
            name=args.name,
            inputs=dict(args.inputs),
            custom=bool(args.custom),  # the mock monitor passes `request.custom or False`: never None here
            id=resource_id,
            outputs=outputs,
        )
        return resource_id, outputs

    def _outputs(self, typ: str, name: str, inputs: dict[str, Any]) -> tuple[str, dict]:
        region, account = self.region, ACCOUNT_ID
        module = typ.split(":")[1].split("/")[0] if typ.startswith("aws:") else ""
        state = {"name": name, **inputs, "arn": f"arn:aws:{module}:{region}:{account}:{name}"}
        resource_id = _fake_id(name, ID_PREFIXES[typ]) if typ in ID_PREFIXES else f"{name}-id"
        if typ == "aws:s3/bucket:Bucket":
            resource_id = state["bucket"] = name
            state["arn"] = f"arn:aws:s3:::{name}"
        elif typ == "aws:kms/key:Key":
            resource_id = state["keyId"] = _fake_id(name, "key")
            state["arn"] = f"arn:aws:kms:{region}:{account}:key/{resource_id}"
        elif typ == "aws:iam/role:Role":
            # Pulumi auto-names a role `<logical name>-<7 random hex>` unless `name` is given (Pulumi docs,
            # "Resource names: Autonaming"); a fixed suffix stands in for the random one, so that policies matching a
            # role by name are checked against the name AWS will see.
            state["name"] = inputs.get("name") or f"{name}-{hashlib.sha256(name.encode()).hexdigest()[:7]}"
            state["arn"] = f"arn:aws:iam::{account}:role/{state['name']}"
        elif typ == "aws:iam/instanceProfile:InstanceProfile":
            state["arn"] = f"arn:aws:iam::{account}:instance-profile/{name}"
        elif typ == "aws:cloudwatch/logGroup:LogGroup":
            state["arn"] = f"arn:aws:logs:{region}:{account}:log-group:{state['name']}"
        elif typ == "aws:ecr/repository:Repository":
            state["repositoryUrl"] = f"{account}.dkr.ecr.{region}.amazonaws.com/{name}"
            state["arn"] = f"arn:aws:ecr:{region}:{account}:repository/{name}"
        elif typ == "aws:fsx/lustreFileSystem:LustreFileSystem":
            state.update(dnsName=f"{resource_id}.fsx.{region}.amazonaws.com", mountName="abcdefgh")
        elif typ == "aws:ec2/launchTemplate:LaunchTemplate":
            state["latestVersion"] = 1
        elif typ == "aws:cloudtrail/trail:Trail":
            state["arn"] = f"arn:aws:cloudtrail:{region}:{account}:trail/{inputs.get('name', name)}"
        elif typ == "aws:eks/cluster:Cluster":
            cluster = inputs.get("name", name)
            state["arn"] = f"arn:aws:eks:{region}:{account}:cluster/{cluster}"
            state["endpoint"] = (
                f"https://{_fake_id(cluster, 'eks')[4:].upper()}.gr7.{region}.eks.amazonaws.com"
            )
            # Base64 of a PEM header: what DescribeCluster's certificateAuthority.data looks like, not a real CA.
            state["certificateAuthority"] = {"data": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="}
            state["vpcConfig"] = {
                **inputs.get("vpcConfig", {}),
                "clusterSecurityGroupId": _fake_id(f"{cluster}-cluster", "sg"),
            }
        elif typ == "aws:batch/jobDefinition:JobDefinition":
            state["arn"] = f"arn:aws:batch:{region}:{account}:job-definition/{inputs.get('name', name)}:1"
        return resource_id, state


class RecordingMonitor(MockMonitor):
    """The mock monitor, also keeping what `Mocks.new_resource` does not see: options, URN, dependencies."""

    mocks: StackMocks

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        recorded = self.mocks.recorded.get((request.type, request.name))
        if recorded is not None:
            under_stack = not request.parent or request.parent.split("::")[2].endswith("pulumi:pulumi:Stack")
            recorded.parent = None if under_stack else request.parent.rsplit("::", 1)[1]
            recorded.protect = bool(request.protect)
            recorded.retain_on_delete = bool(request.retainOnDelete)
            recorded.urn = response.urn
            recorded.dependencies = list(request.dependencies)
            recorded.replace_on_changes = list(request.replaceOnChanges)
            recorded.property_dependencies = {
                key: list(dependencies.urns) for key, dependencies in request.propertyDependencies.items()
            }
        return response


def install(project: str, stack: str, region: str, caller_arn: str = PREVIEW_CALLER) -> StackMocks:
    """Route this process's Pulumi runtime to the mocks (preview mode) and return them for inspection."""
    mocks = StackMocks(region, caller_arn)
    pulumi.runtime.set_mocks(
        mocks, project=project, stack=stack, preview=True, monitor=RecordingMonitor(mocks)
    )
    return mocks
