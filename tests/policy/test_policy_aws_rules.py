"""policy/aws_rules.py: for each AWS rule, resources built from its source that violate it and resources that do not.

Resources are in wire form, as the analyzer receives them (camelCase, numbers as floats), related by property
dependencies; ids are left out as a real preview has them unknown. The fixtures follow the documents each rule
cites: the 400 of aws/aws-cdk#21577 (an EFA launch template with `groups` on its interface beside a compute
environment with `securityGroupIds`), the Batch MNP considerations, the FSx for Lustre port list, the KMS grant
conditions and the ECS agent's stop timeout.
"""

from __future__ import annotations

import base64
import json

import pytest

from infra.config import DEFAULT_STOP_GRACE_SECONDS
from policy import aws_rules
from policy.aws_rules import configured_stop_timeout, go_duration_seconds, user_data_script

T = {
    "env": "aws:batch/computeEnvironment:ComputeEnvironment",
    "job": "aws:batch/jobDefinition:JobDefinition",
    "template": "aws:ec2/launchTemplate:LaunchTemplate",
    "group": "aws:ec2/securityGroup:SecurityGroup",
    "default": "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup",
    "ingress": "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
    "egress": "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule",
    "vpc": "aws:ec2/vpc:Vpc",
    "subnet": "aws:ec2/subnet:Subnet",
    "placement": "aws:ec2/placementGroup:PlacementGroup",
    "fsx": "aws:fsx/lustreFileSystem:LustreFileSystem",
    "key": "aws:kms/key:Key",
}


def efa_interfaces(cards: int = 4, primary: str = "efa") -> list[dict]:
    return [
        {
            "networkCardIndex": float(card),
            "deviceIndex": 0.0,
            "interfaceType": primary if card == 0 else "efa-only",
            "deleteOnTermination": "true",
        }
        for card in range(cards)
    ]


class Cluster:
    """A compute environment on an EFA launch template in one subnet of a VPC, built piece by piece."""

    def __init__(self, resource, **template_props):
        self.resource = resource
        self.vpc = resource(T["vpc"], {"cidrBlock": "10.0.0.0/16"}, name="vpc")
        self.subnet = resource(
            T["subnet"], {"availabilityZone": "us-east-1a"}, "subnet-a", fed_by={"vpcId": [self.vpc]}
        )
        self.group = resource(T["group"], {"description": "efa"}, name="efa")
        self.template = resource(
            T["template"],
            {"networkInterfaces": efa_interfaces(), **template_props},
            name="gpu",
            fed_by={"networkInterfaces": [self.subnet, self.group]},
        )

    def environment(self, extra: dict | None = None, feeds: list | None = None, type_: str = "EC2"):
        resources = {"type": type_, "instanceTypes": ["p5.48xlarge"], "maxVcpus": 192.0, **(extra or {})}
        return self.resource(
            T["env"],
            {"type": "MANAGED", "computeResources": resources},
            name="gpu-env",
            fed_by={"computeResources": [self.template, self.subnet, *(feeds or [])]},
        )

    def default_group(self, ingress_self: bool = True, egress_self: bool = True):
        rule = {"protocol": "-1", "fromPort": 0.0, "toPort": 0.0, "self": True}
        return self.resource(
            T["default"],
            {"ingress": [rule] if ingress_self else [], "egress": [rule] if egress_self else []},
            name="default",
            fed_by={"vpcId": [self.vpc]},
        )


@pytest.fixture
def cluster(resource):
    return Cluster(resource)


# --- batch-security-groups-environment-or-template (aws/aws-cdk#21577) -------------------------------------------


def test_environment_without_groups_beside_template_interfaces_passes(cluster, violations):
    env = cluster.environment()
    assert violations(aws_rules.security_groups_one_place, cluster.template, env) == []


def test_environment_groups_beside_template_interfaces_is_the_400(cluster, violations):
    env = cluster.environment({"securityGroupIds": ["sg-0123"]}, feeds=[cluster.group])
    [(name, message)] = violations(aws_rules.security_groups_one_place, cluster.template, env)
    assert name == "gpu-env"
    assert "Either compute environment Security Groups or Network Interfaces in Launch template" in message


def test_environment_groups_with_a_template_without_interfaces_pass(resource, violations):
    template = resource(T["template"], {"userData": "IyEvYmluL2Jhc2g="}, name="plain")
    env = resource(
        T["env"],
        {"type": "MANAGED", "computeResources": {"type": "EC2", "securityGroupIds": ["sg-1"]}},
        name="env",
        fed_by={"computeResources": [template]},
    )
    assert violations(aws_rules.security_groups_one_place, template, env) == []


# --- batch-mnp-containers-default-security-group (Batch guide, MNP considerations) --------------------------


def test_managed_default_group_with_self_traffic_passes(cluster, violations):
    resources = [
        cluster.vpc,
        cluster.subnet,
        cluster.template,
        cluster.environment(),
        cluster.default_group(),
    ]
    assert violations(aws_rules.mnp_default_group, *resources) == []


def test_unmanaged_default_group_is_reported(cluster, violations):
    resources = [cluster.vpc, cluster.subnet, cluster.template, cluster.environment()]
    [(name, message)] = violations(aws_rules.mnp_default_group, *resources)
    assert name == "gpu-env" and "is not managed by this stack" in message and "'vpc'" in message


def test_locked_default_group_is_reported(cluster, violations):
    locked = cluster.default_group(ingress_self=False, egress_self=False)
    resources = [cluster.vpc, cluster.subnet, cluster.template, cluster.environment(), locked]
    [(_, message)] = violations(aws_rules.mnp_default_group, *resources)
    assert "lacks all-traffic ingress and egress with itself" in message


def test_spot_environments_are_not_judged_since_mnp_jobs_never_run_there(cluster, violations):
    resources = [cluster.vpc, cluster.subnet, cluster.template, cluster.environment(type_="SPOT")]
    assert violations(aws_rules.mnp_default_group, *resources) == []


# --- at-most-five-security-groups --------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 5])
def test_up_to_five_groups_pass(resource, violations, count):
    groups = [f"sg-{n}" for n in range(count)]
    env = resource(T["env"], {"computeResources": {"type": "EC2", "securityGroupIds": groups}})
    template = resource(
        T["template"], {"networkInterfaces": [{"deviceIndex": 0.0, "securityGroups": groups}]}
    )
    assert violations(aws_rules.at_most_five_groups, env, template) == []


def test_six_groups_are_reported_on_environments_and_interfaces(resource, violations):
    groups = [f"sg-{n}" for n in range(6)]
    env = resource(T["env"], {"computeResources": {"type": "EC2", "securityGroupIds": groups}}, name="env")
    template = resource(
        T["template"], {"networkInterfaces": [{"deviceIndex": 0.0, "securityGroups": groups}]}, name="lt"
    )
    found = violations(aws_rules.at_most_five_groups, env, template)
    assert [(name, "6 security groups" in message) for name, message in found] == [
        ("env", True),
        ("lt", True),
    ]
    assert "network_interfaces[0].security_groups" in found[1][1]


# --- efa-cluster-placement-single-zone ---------------------------------------------------------------------------


def test_efa_environment_in_a_cluster_placement_group_passes(cluster, resource, violations):
    group = resource(T["placement"], {"strategy": "cluster"}, name="pg")
    env = cluster.environment({"placementGroup": "trainstack-pg"}, feeds=[group])
    assert violations(aws_rules.efa_placement, cluster.subnet, cluster.template, group, env) == []


def test_efa_environment_without_a_placement_group_is_reported(cluster, violations):
    [(name, message)] = violations(aws_rules.efa_placement, cluster.template, cluster.environment())
    assert name == "gpu-env" and "without a cluster placement group" in message


def test_efa_spot_environment_without_a_placement_group_is_reported(cluster, violations):
    # Batch user guide, "Elastic Fabric Adapter": every instance that uses an EFA in one cluster placement group.
    env = cluster.environment(type_="SPOT")
    [(name, message)] = violations(aws_rules.efa_placement, cluster.template, env)
    assert name == "gpu-env" and "without a cluster placement group" in message


def test_efa_spot_environment_in_a_cluster_placement_group_passes(cluster, resource, violations):
    group = resource(T["placement"], {"strategy": "cluster"}, name="spot-pg")
    env = cluster.environment({"placementGroup": "trainstack-spot"}, feeds=[group], type_="SPOT")
    assert violations(aws_rules.efa_placement, cluster.subnet, cluster.template, group, env) == []


def test_spread_placement_group_is_reported(cluster, resource, violations):
    group = resource(T["placement"], {"strategy": "spread"}, name="pg")
    env = cluster.environment({"placementGroup": "pg"}, feeds=[group])
    [(name, message)] = violations(aws_rules.efa_placement, cluster.template, group, env)
    assert name == "pg" and "strategy='cluster'" in message


def test_odcr_with_its_own_placement_group_name_passes(resource, violations):
    cluster = Cluster(
        resource,
        capacityReservationSpecification={
            "capacityReservationTarget": {"capacityReservationId": "cr-0123456789abcdef0"}
        },
    )
    env = cluster.environment({"placementGroup": "odcr-cluster"})
    assert violations(aws_rules.efa_placement, cluster.template, env) == []


def test_odcr_in_a_new_placement_group_of_the_stack_is_reported(resource, violations):
    cluster = Cluster(
        resource,
        capacityReservationSpecification={
            "capacityReservationTarget": {"capacityReservationId": "cr-0123456789abcdef0"}
        },
    )
    group = resource(T["placement"], {"strategy": "cluster"}, name="pg")
    env = cluster.environment({"placementGroup": "pg"}, feeds=[group])
    [(_, message)] = violations(aws_rules.efa_placement, cluster.template, group, env)
    assert "launches only into that group" in message


def test_capacity_block_needs_no_placement_group(resource, violations):
    cluster = Cluster(
        resource,
        instanceMarketOptions={"marketType": "capacity-block"},
        capacityReservationSpecification={
            "capacityReservationTarget": {"capacityReservationId": "cr-0123456789abcdef0"}
        },
    )
    assert violations(aws_rules.efa_placement, cluster.template, cluster.environment()) == []


def test_efa_environment_over_two_zones_is_reported(cluster, resource, violations):
    other = resource(T["subnet"], {"availabilityZone": "us-east-1b"}, "subnet-b")
    group = resource(T["placement"], {"strategy": "cluster"}, name="pg")
    env = cluster.environment({"placementGroup": "pg"}, feeds=[group, other])
    [(_, message)] = violations(aws_rules.efa_placement, cluster.subnet, other, cluster.template, group, env)
    assert "['us-east-1a', 'us-east-1b']" in message and "one Availability Zone" in message


# --- batch-mnp-on-demand-ec2 ---------------------------------------------------------------------------------------


def multinode(instance: str = "p5.48xlarge", grace: str | None = None, **props):
    environment = [] if grace is None else [{"name": "TRAINSTACK_STOP_GRACE_SECONDS", "value": grace}]
    container = {"image": "trainer:1", "instanceType": instance, "environment": environment}
    nodes = {
        "mainNode": 0,
        "numNodes": 2,
        "nodeRangeProperties": [{"targetNodes": "0:", "container": container}],
    }
    return {"type": "multinode", "nodeProperties": json.dumps(nodes), **props}


def test_multinode_job_on_an_on_demand_environment_passes(cluster, resource, violations):
    job = resource(T["job"], multinode(), name="train")
    assert violations(aws_rules.mnp_on_demand, cluster.environment(), job) == []


def test_multinode_job_offered_only_by_spot_is_reported(cluster, resource, violations):
    job = resource(T["job"], multinode(), name="train")
    [(name, message)] = violations(aws_rules.mnp_on_demand, cluster.environment(type_="SPOT"), job)
    assert name == "train" and "p5.48xlarge" in message and "do not run on Spot" in message


# --- efa-only-not-primary -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("primary", ["efa", "interface"])
def test_efa_or_ena_primary_passes(resource, violations, primary):
    template = resource(T["template"], {"networkInterfaces": efa_interfaces(4, primary)})
    assert violations(aws_rules.efa_only_not_primary, template) == []


def test_efa_only_primary_is_reported(resource, violations):
    template = resource(T["template"], {"networkInterfaces": efa_interfaces(4, "efa-only")}, name="gpu")
    [(name, message)] = violations(aws_rules.efa_only_not_primary, template)
    assert name == "gpu" and "network card 0, device 0" in message


# --- fsx-lustre-ports-both-ways (FSx for Lustre user guide: 988 and 1018-1023) ------------------------------------

LUSTRE = [(988.0, 988.0), (1018.0, 1023.0)]


def lustre_stack(resource, directions: set[str]):
    """A file system's group, a client group, and the Lustre rules named in `directions`."""
    fsx = resource(T["group"], {"description": "fsx"}, name="fsx-sg")
    nodes = resource(T["group"], {"description": "nodes"}, name="nodes-sg")
    file_system = resource(
        T["fsx"], {"deploymentType": "SCRATCH_2"}, name="fs", fed_by={"securityGroupIds": [fsx]}
    )
    wanted = {
        "fsx-from-self": ("ingress", fsx, fsx),
        "fsx-to-self": ("egress", fsx, fsx),
        "fsx-from-nodes": ("ingress", fsx, nodes),
        "fsx-to-nodes": ("egress", fsx, nodes),
        "nodes-to-fsx": ("egress", nodes, fsx),
        "nodes-from-fsx": ("ingress", nodes, fsx),
    }
    rules = [
        resource(
            T[kind],
            {"ipProtocol": "tcp", "fromPort": low, "toPort": high},
            name=f"{label}-{int(low)}",
            fed_by={"securityGroupId": [owner], "referencedSecurityGroupId": [peer]},
        )
        for label, (kind, owner, peer) in wanted.items()
        if label in directions
        for low, high in LUSTRE
    ]
    return [fsx, nodes, file_system, *rules]


ALL_DIRECTIONS = {
    "fsx-from-self",
    "fsx-to-self",
    "fsx-from-nodes",
    "fsx-to-nodes",
    "nodes-to-fsx",
    "nodes-from-fsx",
}


def test_lustre_ports_both_ways_pass(resource, violations):
    assert violations(aws_rules.lustre_both_ways, *lustre_stack(resource, ALL_DIRECTIONS)) == []


@pytest.mark.parametrize(
    ("missing", "reported", "says"),
    [
        ("fsx-to-nodes", "fsx-sg", "no egress rule to 'nodes-sg'"),
        ("nodes-from-fsx", "nodes-sg", "no ingress rule from 'fsx-sg'"),
        ("fsx-from-nodes", "fsx-sg", "no ingress rule from 'nodes-sg'"),
        ("fsx-from-self", "fsx-sg", "no ingress rule from 'fsx-sg'"),
    ],
)
def test_one_way_lustre_rules_are_reported(resource, violations, missing, reported, says):
    [(name, message)] = violations(
        aws_rules.lustre_both_ways, *lustre_stack(resource, ALL_DIRECTIONS - {missing})
    )
    assert name == reported and says in message and "988-988, 1018-1023" in message


def test_lustre_range_must_cover_every_port(resource, violations):
    resources = lustre_stack(resource, ALL_DIRECTIONS - {"fsx-to-nodes"})
    fsx, nodes = resources[0], resources[1]
    short = resource(
        T["egress"],
        {"ipProtocol": "tcp", "fromPort": 988.0, "toPort": 1020.0},
        name="too-short",
        fed_by={"securityGroupId": [fsx], "referencedSecurityGroupId": [nodes]},
    )
    [(_, message)] = violations(aws_rules.lustre_both_ways, *resources, short)
    assert "for TCP 1018-1023" in message


# --- batch-job-timeout-and-retries --------------------------------------------------------------------------------


def test_job_with_timeout_and_retries_passes(resource, violations):
    props = multinode(timeout={"attemptDurationSeconds": 3600.0}, retryStrategy={"attempts": 3.0})
    assert violations(aws_rules.job_timeout, resource(T["job"], props)) == []


@pytest.mark.parametrize(
    ("props", "says"),
    [
        ({"retryStrategy": {"attempts": 3.0}}, "has no timeout"),
        ({"timeout": {"attemptDurationSeconds": 30.0}, "retryStrategy": {"attempts": 3.0}}, "a 30 s timeout"),
        ({"timeout": {"attemptDurationSeconds": 3600.0}}, "has no retry strategy"),
    ],
)
def test_job_without_timeout_or_retries_is_reported(resource, violations, props, says):
    [(_, message)] = violations(aws_rules.job_timeout, resource(T["job"], multinode(**props), name="train"))
    assert says in message


# --- ecs-stop-timeout-above-stop-grace (ECS agent: default 30 s) ------------------------------------------------


def mime_user_data(script: str) -> str:
    """User data as Batch takes it: base64 of a MIME multi-part with one shell script part."""
    mime = (
        'Content-Type: multipart/mixed; boundary="==b=="\nMIME-Version: 1.0\n\n--==b==\n'
        'Content-Type: text/x-shellscript; charset="us-ascii"\n\n'
        f"{script}\n--==b==--\n"
    )
    return base64.b64encode(mime.encode()).decode()


def stop_timeout_stack(resource, script: str | None, grace: str | None):
    props = {"networkInterfaces": efa_interfaces()}
    if script is not None:
        props["userData"] = mime_user_data(script)
    template = resource(T["template"], props, name="gpu")
    env = resource(
        T["env"], {"computeResources": {"type": "EC2"}}, name="env", fed_by={"computeResources": [template]}
    )
    return [template, env, resource(T["job"], multinode(grace=grace), name="train")]


def test_stop_timeout_above_the_jobs_grace_passes(resource, violations):
    script = "#!/bin/bash\necho ECS_CONTAINER_STOP_TIMEOUT=5m >> /etc/ecs/ecs.config"
    assert violations(aws_rules.stop_timeout, *stop_timeout_stack(resource, script, "240")) == []


@pytest.mark.parametrize(
    ("script", "grace", "says"),
    [
        (None, "120", "at 30 s (the default)"),
        (
            "#!/bin/bash\ndnf install -y lustre-client",
            None,
            f"the {DEFAULT_STOP_GRACE_SECONDS} s SIGTERM grace",
        ),
        (
            "#!/bin/bash\necho ECS_CONTAINER_STOP_TIMEOUT=2m >> /etc/ecs/ecs.config",
            "120",
            "at 120 s, not above",
        ),
    ],
)
def test_stop_timeout_at_or_below_the_grace_is_reported(resource, violations, script, grace, says):
    [(name, message)] = violations(aws_rules.stop_timeout, *stop_timeout_stack(resource, script, grace))
    assert name == "gpu" and says in message


# --- batch-user-data-mime-multipart (EC2 API RequestLaunchTemplateData.UserData) -------------------------------


def test_mime_user_data_passes(resource, violations):
    resources = stop_timeout_stack(resource, "#!/bin/bash\ntrue", "120")
    assert violations(aws_rules.user_data_mime, *resources) == []


def test_plain_script_user_data_is_reported(resource, violations):
    plain = resource(
        T["template"],
        {"userData": base64.b64encode(b"#!/bin/bash\ntrue\n").decode()},
        name="plain",
    )
    env = resource(
        T["env"], {"computeResources": {"type": "EC2"}}, name="env", fed_by={"computeResources": [plain]}
    )
    [(name, message)] = violations(aws_rules.user_data_mime, plain, env)
    assert name == "plain" and "not a MIME multi-part archive" in message


def test_user_data_outside_batch_is_not_judged(resource, violations):
    plain = resource(T["template"], {"userData": base64.b64encode(b"#!/bin/bash\ntrue\n").decode()})
    assert violations(aws_rules.user_data_mime, plain) == []


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30.0), ("3m", 180.0), ("1h30m", 5400.0), ("1.5h", 5400.0), ("90", None), ("", None)],
)
def test_go_durations_as_the_ecs_agent_reads_them(text, seconds):
    assert go_duration_seconds(text) == seconds


def test_stop_timeout_is_read_through_base64_mime_and_last_one_wins():
    script = (
        "ECS_CONTAINER_STOP_TIMEOUT=1m\ncat >> /etc/ecs/ecs.config <<EOF\nECS_CONTAINER_STOP_TIMEOUT=3m\nEOF"
    )
    assert configured_stop_timeout(user_data_script(mime_user_data(script))) == 180.0
    assert configured_stop_timeout(user_data_script(script)) == 180.0  # plain text user data


# --- kms-create-grant-for-aws-services (KMS developer guide, "Controlling access to grants") -------------------


def key_policy(*statements: dict) -> dict:
    return {"policy": json.dumps({"Version": "2012-10-17", "Statement": list(statements)})}


ROOT = {"AWS": "arn:aws:iam::123456789012:root"}


@pytest.mark.parametrize(
    "condition",
    [
        {"StringEquals": {"kms:ViaService": ["ec2.us-east-1.amazonaws.com"]}},
        {"Bool": {"kms:GrantIsForAWSResource": "true"}},
    ],
)
def test_create_grant_under_a_service_condition_passes(resource, violations, condition):
    statement = {
        "Effect": "Allow",
        "Principal": ROOT,
        "Action": "kms:CreateGrant",
        "Resource": "*",
        "Condition": condition,
    }
    admin = {
        "Effect": "Allow",
        "Principal": ROOT,
        "Action": ["kms:DescribeKey", "kms:PutKeyPolicy"],
        "Resource": "*",
    }
    assert (
        violations(aws_rules.create_grant_for_services, resource(T["key"], key_policy(admin, statement)))
        == []
    )


@pytest.mark.parametrize("action", ["kms:Create*", "kms:CreateGrant", "kms:*", "*", "KMS:CREATEGRANT"])
def test_create_grant_without_a_condition_is_reported(resource, violations, action):
    statement = {"Sid": "Admins", "Effect": "Allow", "Principal": ROOT, "Action": [action], "Resource": "*"}
    [(name, message)] = violations(
        aws_rules.create_grant_for_services, resource(T["key"], key_policy(statement), name="k")
    )
    assert name == "k" and "statement Admins allows kms:CreateGrant" in message


def test_deny_statements_may_name_create_grant(resource, violations):
    statement = {"Effect": "Deny", "Principal": "*", "Action": "kms:CreateGrant", "Resource": "*"}
    assert violations(aws_rules.create_grant_for_services, resource(T["key"], key_policy(statement))) == []
