"""Network guardrails: no ingress from the internet, EFA's self-referencing rules, an S3 gateway endpoint beside NAT.

Security group rules come in three forms, all judged: inline `ingress`/`egress` blocks of a group, the standalone
`vpc.SecurityGroupIngressRule`/`EgressRule` resources (what infra/ uses), and the older `ec2.SecurityGroupRule`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pulumi_policy import (
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from policy import aws_types
from policy.resources import feeds, has_value, of_type, referenced, referrers

ALL_TRAFFIC = ("-1", "all")
EFA_INTERFACE_TYPES = ("efa", "efa-only")
S3_SERVICE = re.compile(r"^com\.amazonaws\.[a-z0-9-]+\.s3$")


# --- no ingress from the internet -----------------------------------------------------------------------------


def _ingress_blocks(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """The CIDR blocks a resource admits traffic from."""
    if resource_type in aws_types.SECURITY_GROUPS:
        return [
            block
            for rule in props.get("ingress") or []
            for key in ("cidrBlocks", "ipv6CidrBlocks")
            for block in rule.get(key) or []
        ]
    if resource_type == aws_types.INGRESS_RULE:
        return [props[key] for key in ("cidrIpv4", "cidrIpv6") if props.get(key)]
    if resource_type == aws_types.SECURITY_GROUP_RULE and props.get("type") == "ingress":
        return [*(props.get("cidrBlocks") or []), *(props.get("ipv6CidrBlocks") or [])]
    return []


def is_internet(block: str) -> bool:
    """0.0.0.0/0 or ::/0, however spelled."""
    return ipaddress.ip_network(block, strict=False).prefixlen == 0


def validate_no_internet_ingress(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    for block in filter(is_internet, _ingress_blocks(args.resource_type, args.props)):
        report_violation(
            f"'{args.name}' admits traffic from {block}: admit the VPC's CIDR or a security group "
            "(referenced_security_group_id) instead; reach nodes through SSM Session Manager, not the internet.",
            None,
        )


no_internet_ingress = ResourceValidationPolicy(
    name="no-internet-ingress",
    description="No security group rule admits traffic from 0.0.0.0/0 or ::/0.",
    validate=validate_no_internet_ingress,
)


# --- EFA: all traffic from and to the group itself ------------------------------------------------------------


Rule = tuple[Any, Any, Any]  # (protocol, from port, to port) as the engine hands them over


def peer_rules(
    group: PolicyResource, peer: PolicyResource, direction: str, resources: Sequence[PolicyResource]
) -> list[Rule]:
    """Every rule of `group` in `direction` ('ingress' or 'egress') whose peer is the group `peer`, in the three
    forms: inline (`self` only: other peers are ids, unknown in a preview), vpc.SecurityGroup*Rule and
    ec2.SecurityGroupRule; peers are matched through property dependencies."""
    itself = peer.urn == group.urn
    found: list[Rule] = []
    if itself:
        found += [
            (r.get("protocol"), r.get("fromPort"), r.get("toPort"))
            for r in group.props.get(direction) or []
            if r.get("self") is True
        ]
    standalone = aws_types.INGRESS_RULE if direction == "ingress" else aws_types.EGRESS_RULE
    for rule in referrers(resources, [standalone], "securityGroupId", group):
        if feeds(rule, "referencedSecurityGroupId", peer):
            found.append((rule.props.get("ipProtocol"), rule.props.get("fromPort"), rule.props.get("toPort")))
    for rule in referrers(resources, [aws_types.SECURITY_GROUP_RULE], "securityGroupId", group):
        props = rule.props
        to_peer = (itself and props.get("self") is True) or feeds(rule, "sourceSecurityGroupId", peer)
        if props.get("type") == direction and to_peer:
            found.append((props.get("protocol"), props.get("fromPort"), props.get("toPort")))
    return found


def allows_all_traffic_with_itself(
    group: PolicyResource, direction: str, resources: Sequence[PolicyResource]
) -> bool:
    """The group has a rule for all protocols whose peer is the group itself, in `direction`."""
    return any(protocol in ALL_TRAFFIC for protocol, _, _ in peer_rules(group, group, direction, resources))


def covers_tcp(rules: Sequence[Rule], low: int, high: int) -> bool:
    """One of `rules` admits TCP ports low..high (all traffic does too)."""
    return any(
        protocol in ALL_TRAFFIC
        or (str(protocol).lower() in ("tcp", "6") and start is not None and start <= low and high <= end)
        for protocol, start, end in rules
    )


def validate_efa_self_traffic(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    groups: dict[str, tuple[PolicyResource, list[str]]] = {}  # URN -> (group, names of its EFA templates)
    for template in of_type(args.resources, [aws_types.LAUNCH_TEMPLATE]):
        interfaces = template.props.get("networkInterfaces") or []
        if not any(i.get("interfaceType") in EFA_INTERFACE_TYPES for i in interfaces):
            continue
        attached = referenced(template, "networkInterfaces", aws_types.SECURITY_GROUPS)
        if not attached:
            report_violation(
                f"Launch template '{template.name}' has EFA interfaces but no security group of this stack on "
                "them, so their self-referencing rules cannot be checked: create the group in this stack and "
                "pass its id (security_groups=[group.id]).",
                template.urn,
            )
        for group in attached:
            groups.setdefault(group.urn, (group, []))[1].append(template.name)

    for group, templates in groups.values():
        for direction, rule, peer in (
            ("ingress", "SecurityGroupIngressRule", "from"),
            ("egress", "SecurityGroupEgressRule", "to"),
        ):
            if not allows_all_traffic_with_itself(group, direction, args.resources):
                report_violation(
                    f"Security group '{group.name}' on the EFA interfaces of {', '.join(templates)} has no "
                    f"all-traffic {direction} rule {peer} itself (EFA's SRD traffic needs it; 0.0.0.0/0 rules "
                    f"do not cover it): add aws.vpc.{rule}(security_group_id=group.id, "
                    "referenced_security_group_id=group.id, ip_protocol='-1').",
                    group.urn,
                )


efa_self_traffic = StackValidationPolicy(
    name="efa-security-group-self-traffic",
    description=(
        "Every security group on an EFA interface allows all traffic inbound from itself and outbound to itself."
    ),
    validate=validate_efa_self_traffic,
)


# --- an S3 gateway endpoint in every VPC with a NAT gateway -----------------------------------------------------


def _vpcs_of(nat: PolicyResource) -> list[PolicyResource]:
    """A zonal NAT gateway's VPC through its subnet; a regional one names its VPC."""
    subnets = referenced(nat, "subnetId", [aws_types.SUBNET])
    vpcs = referenced(nat, "vpcId", [aws_types.VPC])
    return vpcs + [vpc for subnet in subnets for vpc in referenced(subnet, "vpcId", [aws_types.VPC])]


def _is_s3_gateway(endpoint: PolicyResource, resources: Sequence[PolicyResource]) -> bool:
    props = endpoint.props
    routed = has_value(props, "routeTableIds") or bool(
        referrers(resources, [aws_types.VPC_ENDPOINT_ROUTE_TABLE_ASSOCIATION], "vpcEndpointId", endpoint)
    )
    return (
        bool(S3_SERVICE.match(str(props.get("serviceName", ""))))
        and props.get("vpcEndpointType", "Gateway") == "Gateway"  # AWS's default type
        and routed
    )


def validate_s3_gateway_endpoint(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    nat_vpcs: dict[str, tuple[PolicyResource, list[str]]] = {}  # URN -> (VPC, names of its NAT gateways)
    for nat in of_type(args.resources, [aws_types.NAT_GATEWAY]):
        if nat.props.get("connectivityType", "public") != "public":
            continue  # a private NAT gateway does not reach S3's public endpoints
        for vpc in _vpcs_of(nat):
            nat_vpcs.setdefault(vpc.urn, (vpc, []))[1].append(nat.name)

    endpoints = of_type(args.resources, [aws_types.VPC_ENDPOINT])
    for vpc, nats in nat_vpcs.values():
        in_vpc = [e for e in endpoints if feeds(e, "vpcId", vpc)]
        if not any(_is_s3_gateway(endpoint, args.resources) for endpoint in in_vpc):
            report_violation(
                f"VPC '{vpc.name}' sends traffic through NAT gateway(s) {', '.join(nats)} but has no S3 "
                "gateway endpoint, so every dataset, checkpoint and image layer pays NAT processing: add "
                "aws.ec2.VpcEndpoint(vpc_id=vpc.id, service_name='com.amazonaws.<region>.s3', "
                "vpc_endpoint_type='Gateway', route_table_ids=[<private route table ids>]).",
                vpc.urn,
            )


s3_gateway_endpoint = StackValidationPolicy(
    name="s3-gateway-endpoint-with-nat",
    description="Every VPC with a NAT gateway has an S3 gateway endpoint on its route tables (S3 never pays NAT).",
    validate=validate_s3_gateway_endpoint,
)
