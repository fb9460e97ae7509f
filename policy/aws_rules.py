"""AWS's own rules across resources: what Batch, EC2 (EFA), FSx for Lustre and KMS refuse or silently break.

Each policy encodes one documented rule or API error, cited in its description's source line; the stacks rely on
every one of them. The mocks accept all of these mistakes, AWS does not: this is where they are caught before
`pulumi up` (the pack runs them on `pulumi preview --policy-pack policy` and `make policy`).

Resources are related through property dependencies (policy/resources.py): a compute environment's launch
template, subnets and placement group flow into `computeResources`; a file system's groups into
`securityGroupIds`. Values that only the update knows (user data built from the file system's DNS name, job
definitions holding ARNs) make the policy report "can't run policy during preview" and run at `pulumi up`.
"""

from __future__ import annotations

import base64
import binascii
import email
import fnmatch
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

from pulumi_policy import (
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from infra.config import DEFAULT_STOP_GRACE_SECONDS
from infra.lustre import LUSTRE_PORTS
from policy import aws_types
from policy.iam import documents, statement_label, statements
from policy.network import EFA_INTERFACE_TYPES, allows_all_traffic_with_itself, covers_tcp, peer_rules
from policy.resources import as_list, feeds, has_value, of_type, referenced

# Batch "Compute environment considerations for MNP": at most five security groups; EC2's default quota of security
# groups per network interface is five as well (Amazon VPC quotas, "Security groups per network interface").
MAX_SECURITY_GROUPS = 5
# ECS agent: SIGTERM -> SIGKILL after ECS_CONTAINER_STOP_TIMEOUT, 30 s when unset (Amazon ECS developer guide,
# "Amazon ECS container agent configuration"; ContainerDefinition.stopTimeout).
ECS_DEFAULT_STOP_TIMEOUT_SECONDS = 30.0
# Batch API JobTimeout.attemptDurationSeconds: "The minimum value for the timeout is 60 seconds."
MIN_ATTEMPT_DURATION_SECONDS = 60
# The variable that carries the trainer's SIGTERM grace (trainer/distributed/torchrun.py --stop-grace-seconds).
STOP_GRACE_VARIABLE = "TRAINSTACK_STOP_GRACE_SECONDS"


# --- reading the resources ---------------------------------------------------------------------------------------


def compute_resources(environment: PolicyResource) -> Mapping[str, Any]:
    return environment.props.get("computeResources") or {}


def launch_templates(environment: PolicyResource) -> list[PolicyResource]:
    return referenced(environment, "computeResources", [aws_types.LAUNCH_TEMPLATE])


def interfaces(template: PolicyResource) -> list[Mapping[str, Any]]:
    return list(template.props.get("networkInterfaces") or [])


def has_efa(template: PolicyResource) -> bool:
    return any(i.get("interfaceType") in EFA_INTERFACE_TYPES for i in interfaces(template))


def is_on_demand_ec2(environment: PolicyResource) -> bool:
    """A managed environment of On-Demand EC2 instances: the only kind multi-node parallel jobs run on."""
    return environment.props.get("type", "MANAGED").upper() == "MANAGED" and (
        str(compute_resources(environment).get("type", "")).upper() == "EC2"
    )


def market_type(template: PolicyResource) -> str | None:
    return (template.props.get("instanceMarketOptions") or {}).get("marketType")


def targets_reservation(template: PolicyResource) -> bool:
    target = (template.props.get("capacityReservationSpecification") or {}).get("capacityReservationTarget")
    return bool(target)


def _decoded(user_data: str) -> str:
    """User data as text: launch templates take it base64-encoded; plain text is returned as it is."""
    try:
        return base64.b64decode(user_data, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return user_data


def is_mime_multipart(user_data: str) -> bool:
    return email.message_from_string(_decoded(user_data)).is_multipart()


def user_data_script(user_data: str) -> str:
    """The shell script(s) in user data as the node runs it: plain, base64, or base64 MIME multi-part."""
    text = _decoded(user_data)
    message = email.message_from_string(text)
    if not message.is_multipart():
        return text
    parts = [
        p for p in message.walk() if p.get_content_type() in ("text/x-shellscript", "text/cloud-boothook")
    ]
    # typeshed's get_payload also covers multipart parts; decoding a text part gives its bytes.
    return "\n".join(cast(bytes, p.get_payload(decode=True)).decode() for p in parts)


_GO_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_STOP_TIMEOUT = re.compile(r"ECS_CONTAINER_STOP_TIMEOUT=[\"']?([0-9.a-zµ]+)")


def go_duration_seconds(value: str) -> float | None:
    """A Go duration (`30s`, `3m`, `1h30m`: what the ECS agent parses) in seconds; None when malformed."""
    parts = _GO_DURATION_PART.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        return None
    return sum(float(number) * _GO_UNITS[unit] for number, unit in parts)


def configured_stop_timeout(script: str) -> float | None:
    """The ECS_CONTAINER_STOP_TIMEOUT (seconds) a node script writes (the last one wins), or None."""
    found = _STOP_TIMEOUT.findall(script)
    return go_duration_seconds(found[-1]) if found else None


def job_containers(definition: PolicyResource) -> list[Mapping[str, Any]]:
    """The containers a job definition runs: its containerProperties, or each node range's container."""
    props = definition.props
    containers = []
    if has_value(props, "containerProperties"):
        containers.append(json.loads(props["containerProperties"]))
    if has_value(props, "nodeProperties"):
        nodes = json.loads(props["nodeProperties"])
        containers += [r.get("container") or {} for r in nodes.get("nodeRangeProperties") or []]
    return containers


def stop_grace_seconds(container: Mapping[str, Any]) -> float:
    environment = {e.get("name"): e.get("value") for e in container.get("environment") or []}
    return float(environment.get(STOP_GRACE_VARIABLE, DEFAULT_STOP_GRACE_SECONDS))


def _vpcs_of_environment(environment: PolicyResource) -> list[PolicyResource]:
    subnets = referenced(environment, "computeResources", [aws_types.SUBNET])
    return [vpc for subnet in subnets for vpc in referenced(subnet, "vpcId", [aws_types.VPC])]


# --- Batch: security groups on the environment or on the template's interfaces, never both ------------------


def validate_security_groups_one_place(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    for environment in of_type(args.resources, [aws_types.BATCH_COMPUTE_ENVIRONMENT]):
        if not has_value(compute_resources(environment), "securityGroupIds"):
            continue
        for template in launch_templates(environment):
            if interfaces(template):
                report_violation(
                    f"Compute environment '{environment.name}' names security_group_ids while its launch template "
                    f"'{template.name}' defines network interfaces: CreateComputeEnvironment answers 400 \"Either "
                    "compute environment Security Groups or Network Interfaces in Launch template are exclusively "
                    'allowed". Remove security_group_ids; put the groups on the interfaces (security_groups=[...]).',
                    environment.urn,
                )


security_groups_one_place = StackValidationPolicy(
    name="batch-security-groups-environment-or-template",
    description=(
        "A Batch compute environment names no security groups when its launch template defines network "
        "interfaces (CreateComputeEnvironment 400; aws/aws-cdk#21577)."
    ),
    validate=validate_security_groups_one_place,
)


# --- Batch: launch template user data in MIME multi-part ----------------------------------------------------


def validate_user_data_mime(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    templates = {
        t.urn: t
        for environment in of_type(args.resources, [aws_types.BATCH_COMPUTE_ENVIRONMENT])
        for t in launch_templates(environment)
    }
    for template in templates.values():
        user_data = template.props.get("userData")
        if user_data and not is_mime_multipart(user_data):
            report_violation(
                f"Launch template '{template.name}' of a Batch compute environment has user data that is not a MIME "
                "multi-part archive: Batch merges its own part into it and refuses any other format. Wrap the "
                "script: Content-Type: multipart/mixed with one text/x-shellscript part (email.mime.multipart).",
                template.urn,
            )


user_data_mime = StackValidationPolicy(
    name="batch-user-data-mime-multipart",
    description=(
        "Launch templates of Batch compute environments carry user data in the MIME multi-part archive format "
        '(EC2 API RequestLaunchTemplateData.UserData; Batch user guide, "Amazon EC2 user data in launch templates").'
    ),
    validate=validate_user_data_mime,
)


# --- Batch MNP: job containers use the VPC default group when the environment names none --------------------


def validate_mnp_default_group(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    defaults = of_type(args.resources, [aws_types.DEFAULT_SECURITY_GROUP])
    for environment in of_type(args.resources, [aws_types.BATCH_COMPUTE_ENVIRONMENT]):
        if not is_on_demand_ec2(environment) or has_value(compute_resources(environment), "securityGroupIds"):
            continue
        if not any(interfaces(t) for t in launch_templates(environment)):
            continue
        for vpc in _vpcs_of_environment(environment):
            groups = [g for g in defaults if feeds(g, "vpcId", vpc)]
            missing = [
                direction
                for direction in ("ingress", "egress")
                if not any(allows_all_traffic_with_itself(g, direction, args.resources) for g in groups)
            ]
            if missing:
                state = (
                    "is not managed by this stack"
                    if not groups
                    else f"lacks all-traffic {' and '.join(missing)} with itself"
                )
                report_violation(
                    f"Compute environment '{environment.name}' names no security groups, so the network interface "
                    "Batch gives each multi-node job container (awsvpc) uses the default security group of VPC "
                    f"'{vpc.name}', which {state}: the containers may not reach each other. "
                    "Manage it: aws.ec2.DefaultSecurityGroup(vpc_id=vpc.id, ingress=[{'protocol': '-1', "
                    "'from_port': 0, 'to_port': 0, 'self': True}], egress=[<the same>, <HTTPS out>]).",
                    environment.urn,
                )


mnp_default_group = StackValidationPolicy(
    name="batch-mnp-containers-default-security-group",
    description=(
        "Multi-node job containers on a compute environment without security groups use the VPC's default group "
        '(Batch user guide, "Compute environment considerations for MNP"): it must allow all traffic with itself.'
    ),
    validate=validate_mnp_default_group,
)


# --- Batch MNP: at most five security groups ---------------------------------------------------------------------


def validate_at_most_five_groups(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    where: list[tuple[str, list[Any]]] = []
    if args.resource_type == aws_types.BATCH_COMPUTE_ENVIRONMENT:
        resources = args.props.get("computeResources") or {}
        where.append(("security_group_ids", as_list(resources.get("securityGroupIds"))))
    if args.resource_type == aws_types.LAUNCH_TEMPLATE:
        where += [
            (f"network_interfaces[{n}].security_groups", as_list(i.get("securityGroups")))
            for n, i in enumerate(args.props.get("networkInterfaces") or [])
        ]
    for label, groups in where:
        if len(groups) > MAX_SECURITY_GROUPS:
            report_violation(
                f"'{args.name}' has {len(groups)} security groups in {label}; AWS allows at most "
                f"{MAX_SECURITY_GROUPS}: merge their rules into fewer groups.",
                None,
            )


at_most_five_groups = ResourceValidationPolicy(
    name="at-most-five-security-groups",
    description=(
        "A Batch compute environment and each launch template network interface name at most five security "
        'groups (Batch user guide, "Compute environment considerations for MNP"; Amazon VPC quotas).'
    ),
    validate=validate_at_most_five_groups,
)


# --- Batch MNP on EFA: a cluster placement group in one zone ----------------------------------------------------


def is_managed_ec2_or_spot(environment: PolicyResource) -> bool:
    """A managed environment of EC2 instances, On-Demand or Spot (not Fargate)."""
    return environment.props.get("type", "MANAGED").upper() == "MANAGED" and (
        str(compute_resources(environment).get("type", "")).upper() in ("EC2", "SPOT")
    )


def validate_efa_placement(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    # Batch user guide, "Elastic Fabric Adapter": "All instances that use an EFA must be in the same cluster
    # placement group" -- Spot environments included, not only the multi-node one.
    for environment in of_type(args.resources, [aws_types.BATCH_COMPUTE_ENVIRONMENT]):
        templates = [t for t in launch_templates(environment) if has_efa(t)]
        if not templates or not is_managed_ec2_or_spot(environment):
            continue
        resources = compute_resources(environment)
        groups = referenced(environment, "computeResources", [aws_types.PLACEMENT_GROUP])
        capacity_block = any(market_type(t) == "capacity-block" for t in templates)
        reserved = [
            t.name for t in templates if targets_reservation(t) and market_type(t) != "capacity-block"
        ]
        if not has_value(resources, "placementGroup") and not capacity_block:
            report_violation(
                f"Compute environment '{environment.name}' launches EFA nodes ({', '.join(t.name for t in templates)}) "
                "without a cluster placement group: set placement_group (the stack's aws.ec2.PlacementGroup("
                "strategy='cluster'), or the group an On-Demand Capacity Reservation was made in).",
                environment.urn,
            )
        for group in groups:
            if group.props.get("strategy") != "cluster":
                report_violation(
                    f"Placement group '{group.name}' of compute environment '{environment.name}' has strategy "
                    f"{group.props.get('strategy')!r}: multi-node EFA jobs need strategy='cluster'.",
                    group.urn,
                )
            if reserved:
                report_violation(
                    f"Compute environment '{environment.name}' targets an On-Demand Capacity Reservation "
                    f"({', '.join(reserved)}) but places nodes in '{group.name}', a group this stack creates: a "
                    "reservation made in a cluster placement group launches only into that group. Set "
                    "placement_group to the reservation's group name instead.",
                    environment.urn,
                )
        zones = {
            s.props.get("availabilityZone")
            for s in referenced(environment, "computeResources", [aws_types.SUBNET])
        }
        if len(zones) > 1:
            report_violation(
                f"Compute environment '{environment.name}' spreads EFA nodes over zones {sorted(map(str, zones))}: "
                "a cluster placement group (and EFA traffic) stays in one Availability Zone; give it one subnet.",
                environment.urn,
            )


efa_placement = StackValidationPolicy(
    name="efa-cluster-placement-single-zone",
    description=(
        "A compute environment of EFA nodes, On-Demand or Spot, uses a cluster placement group in one Availability "
        "Zone: its own, an On-Demand Capacity Reservation's own group, or none for a Capacity Block (Batch user "
        'guide, "Elastic Fabric Adapter" and "Compute environment considerations for MNP"; EC2 user guide, '
        '"Capacity Reservations for cluster placement groups").'
    ),
    validate=validate_efa_placement,
)


# --- Batch MNP: never on Spot -------------------------------------------------------------------------------------


def validate_mnp_on_demand(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    environments = of_type(args.resources, [aws_types.BATCH_COMPUTE_ENVIRONMENT])
    offered = {
        instance
        for environment in environments
        if is_on_demand_ec2(environment)
        for instance in as_list(compute_resources(environment).get("instanceTypes"))
    }
    for definition in of_type(args.resources, [aws_types.BATCH_JOB_DEFINITION]):
        if definition.props.get("type") != "multinode":
            continue
        needed = {kind for c in job_containers(definition) if (kind := c.get("instanceType")) is not None}
        missing = sorted(needed - offered)
        if missing:
            report_violation(
                f"Multi-node job definition '{definition.name}' runs on {', '.join(missing)}, which no managed "
                "On-Demand EC2 compute environment of this stack offers: multi-node parallel jobs do not run on "
                "Spot, Fargate or unmanaged environments. Add the instance type to an EC2 environment.",
                definition.urn,
            )


mnp_on_demand = StackValidationPolicy(
    name="batch-mnp-on-demand-ec2",
    description=(
        "Every multi-node job definition's instance type is offered by a managed On-Demand EC2 compute environment "
        '(Batch user guide, "Compute environment considerations for MNP": not on Spot, Fargate or UNMANAGED).'
    ),
    validate=validate_mnp_on_demand,
)


# --- EC2 EFA: efa-only is never the primary interface ---------------------------------------------------------


def validate_efa_only_not_primary(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type != aws_types.LAUNCH_TEMPLATE:
        return
    for n, interface in enumerate(args.props.get("networkInterfaces") or []):
        primary = (
            float(interface.get("networkCardIndex") or 0) == 0
            and float(interface.get("deviceIndex") or 0) == 0
        )
        if primary and interface.get("interfaceType") == "efa-only":
            report_violation(
                f"Launch template '{args.name}' makes interface {n} (network card 0, device 0: the primary) "
                "'efa-only', which has no IP address and cannot be primary: use interface_type='efa' (or "
                "'interface') there and 'efa-only' on the other cards.",
                None,
            )


efa_only_not_primary = ResourceValidationPolicy(
    name="efa-only-not-primary",
    description=(
        'No launch template makes an efa-only interface the primary one (EC2 user guide, "Elastic Fabric Adapter '
        'for AI/ML and HPC workloads": EFA-only interfaces get no IP address and cannot be the primary interface).'
    ),
    validate=validate_efa_only_not_primary,
)


# --- FSx for Lustre: Lustre ports both ways -------------------------------------------------------------------


def _clients(group: PolicyResource, resources: Sequence[PolicyResource]) -> list[PolicyResource]:
    """Groups that exchange traffic with the file system's group: any rule between the two, either side."""
    rule_types = [aws_types.INGRESS_RULE, aws_types.EGRESS_RULE, aws_types.SECURITY_GROUP_RULE]
    peers: dict[str, PolicyResource] = {}
    for rule in of_type(resources, rule_types):
        sides = referenced(rule, "securityGroupId", aws_types.SECURITY_GROUPS)
        sides += referenced(rule, "referencedSecurityGroupId", aws_types.SECURITY_GROUPS)
        sides += referenced(rule, "sourceSecurityGroupId", aws_types.SECURITY_GROUPS)
        if any(s.urn == group.urn for s in sides):
            peers.update({s.urn: s for s in sides if s.urn != group.urn})
    return list(peers.values())


def validate_lustre_both_ways(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    for file_system in of_type(args.resources, [aws_types.LUSTRE_FILE_SYSTEM]):
        for group in referenced(file_system, "securityGroupIds", aws_types.SECURITY_GROUPS):
            needs = [(group, group, "ingress")]  # FSx refuses to create a file system without it
            for client in _clients(group, args.resources):
                needs += [
                    (group, client, "ingress"),
                    (group, client, "egress"),
                    (client, group, "egress"),
                    (client, group, "ingress"),
                ]
            for owner, peer, direction in needs:
                rules = peer_rules(owner, peer, direction, args.resources)
                missing = [f"{low}-{high}" for low, high in LUSTRE_PORTS if not covers_tcp(rules, low, high)]
                if missing:
                    where = "from" if direction == "ingress" else "to"
                    report_violation(
                        f"Security group '{owner.name}' (file system '{file_system.name}'"
                        f"{'' if owner is group else ' client'}) has no {direction} rule {where} '{peer.name}' "
                        f"for TCP {', '.join(missing)}: Lustre needs 988 and 1018-1023 both ways between the file "
                        "system's group and its clients' groups (Pulumi removes the default allow-all egress). Add "
                        f"aws.vpc.SecurityGroup{direction.capitalize()}Rule(security_group_id=<{owner.name}>, "
                        f"referenced_security_group_id=<{peer.name}>, ip_protocol='tcp', from_port=..., to_port=...).",
                        owner.urn,
                    )


lustre_both_ways = StackValidationPolicy(
    name="fsx-lustre-ports-both-ways",
    description=(
        "An FSx for Lustre file system's security group admits TCP 988 and 1018-1023 from itself and from each "
        "client group and sends them to each client group, whose group does the same in reverse (FSx for Lustre "
        'user guide, "File system access control with Amazon VPC").'
    ),
    validate=validate_lustre_both_ways,
)


# --- Batch jobs: a timeout and a retry strategy on every definition -----------------------------------------


def validate_job_timeout(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type != aws_types.BATCH_JOB_DEFINITION:
        return
    duration = (args.props.get("timeout") or {}).get("attemptDurationSeconds")
    if duration is None or duration < MIN_ATTEMPT_DURATION_SECONDS:
        report_violation(
            f"Job definition '{args.name}' has {'no timeout' if duration is None else f'a {duration:g} s timeout'}: "
            f"a hung job holds its nodes until someone notices. Set timeout={{'attempt_duration_seconds': N}}, "
            f"N >= {MIN_ATTEMPT_DURATION_SECONDS} (Batch's minimum).",
            None,
        )
    if not (args.props.get("retryStrategy") or {}).get("attempts"):
        report_violation(
            f"Job definition '{args.name}' has no retry strategy: a job on a node that AWS retires fails for good. "
            "Set retry_strategy={'attempts': N, 'evaluate_on_exits': [...]}.",
            None,
        )


job_timeout = ResourceValidationPolicy(
    name="batch-job-timeout-and-retries",
    description=(
        "Every Batch job definition sets timeout.attemptDurationSeconds (>= 60, Batch API JobTimeout) and a retry "
        "strategy (Batch API RetryStrategy)."
    ),
    validate=validate_job_timeout,
)


# --- ECS: the agent's stop timeout outlasts the trainer's SIGTERM grace -------------------------------------------


def validate_stop_timeout(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    graces = [
        (definition.name, stop_grace_seconds(container))
        for definition in of_type(args.resources, [aws_types.BATCH_JOB_DEFINITION])
        for container in job_containers(definition)
    ]
    if not graces:
        return
    longest_job, grace = max(graces, key=lambda g: g[1])
    for environment in of_type(args.resources, [aws_types.BATCH_COMPUTE_ENVIRONMENT]):
        for template in launch_templates(environment):
            user_data = template.props.get("userData")
            script = user_data_script(user_data) if user_data else ""
            timeout = configured_stop_timeout(script)
            effective = ECS_DEFAULT_STOP_TIMEOUT_SECONDS if timeout is None else timeout
            if effective <= grace:
                report_violation(
                    f"Launch template '{template.name}' (compute environment '{environment.name}') leaves the ECS "
                    f"agent's stop timeout at {effective:g} s{' (the default)' if timeout is None else ''}, not above "
                    f"the {grace:g} s SIGTERM grace of job definition '{longest_job}' ({STOP_GRACE_VARIABLE}): "
                    "containers are killed before they finish saving. Write ECS_CONTAINER_STOP_TIMEOUT=<grace + "
                    "margin>s to /etc/ecs/ecs.config in the user data.",
                    template.urn,
                )


stop_timeout = StackValidationPolicy(
    name="ecs-stop-timeout-above-stop-grace",
    description=(
        "The ECS agent on every Batch node waits longer than any job's SIGTERM grace before SIGKILL "
        '(ECS_CONTAINER_STOP_TIMEOUT, default 30 s: Amazon ECS developer guide, "Amazon ECS container agent '
        'configuration").'
    ),
    validate=validate_stop_timeout,
)


# --- KMS: grants only for AWS services -------------------------------------------------------------------------

GRANT_CONDITIONS = ("kms:viaservice", "kms:grantisforawsresource")


def _grants_create_grant(action: str) -> bool:
    return fnmatch.fnmatchcase("kms:creategrant", action.lower())


def validate_create_grant(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type not in (aws_types.KMS_KEY, aws_types.KMS_KEY_POLICY):
        return
    for where, document in documents(args.props):
        for index, statement in enumerate(statements(document)):
            if statement.get("Effect") != "Allow":
                continue
            granting = [a for a in as_list(statement.get("Action")) if _grants_create_grant(a)]
            conditions = {key.lower() for test in (statement.get("Condition") or {}).values() for key in test}
            if granting and not conditions.intersection(GRANT_CONDITIONS):
                report_violation(
                    f"{args.name}: {statement_label(where, index, statement)} allows kms:CreateGrant (through "
                    f"{', '.join(repr(a) for a in granting)}) without a kms:ViaService or kms:GrantIsForAWSResource "
                    "condition: any principal it names could grant itself Decrypt. List the actions it needs "
                    "(no kms:Create*); keep kms:CreateGrant in a statement with one of those conditions.",
                    None,
                )


create_grant_for_services = ResourceValidationPolicy(
    name="kms-create-grant-for-aws-services",
    description=(
        "No key policy statement allows kms:CreateGrant (alone or through kms:Create*, kms:* or *) without a "
        'kms:ViaService or kms:GrantIsForAWSResource condition (AWS KMS developer guide, "Controlling access to '
        'grants"; AWS Control Tower CT.KMS.PV.1).'
    ),
    validate=validate_create_grant,
)
