"""no-internet-ingress, efa-security-group-self-traffic and s3-gateway-endpoint-with-nat on hand-built resources."""

from __future__ import annotations

import pytest
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

from policy.network import efa_self_traffic, no_internet_ingress, s3_gateway_endpoint

GROUP = "aws:ec2/securityGroup:SecurityGroup"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"

# --- no-internet-ingress --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("type_", "props"),
    [
        (INGRESS, {"ipProtocol": "tcp", "fromPort": 443.0, "toPort": 443.0, "cidrIpv4": "10.0.0.0/16"}),
        (
            GROUP,
            {
                "ingress": [
                    {"protocol": "tcp", "fromPort": 22.0, "toPort": 22.0, "cidrBlocks": ["10.0.0.0/8"]}
                ]
            },
        ),
        (
            RULE,
            {"type": "egress", "protocol": "-1", "fromPort": 0.0, "toPort": 0.0, "cidrBlocks": ["0.0.0.0/0"]},
        ),
        (EGRESS, {"ipProtocol": "tcp", "fromPort": 443.0, "toPort": 443.0, "cidrIpv4": "0.0.0.0/0"}),
    ],
)
def test_ingress_from_private_ranges_and_egress_anywhere_pass(resource, violations, type_, props):
    assert violations(no_internet_ingress, resource(type_, props)) == []


@pytest.mark.parametrize(
    ("type_", "props", "block"),
    [
        (
            INGRESS,
            {"ipProtocol": "tcp", "fromPort": 22.0, "toPort": 22.0, "cidrIpv4": "0.0.0.0/0"},
            "0.0.0.0/0",
        ),
        (INGRESS, {"ipProtocol": "-1", "cidrIpv6": "::/0"}, "::/0"),
        (
            GROUP,
            {"ingress": [{"protocol": "tcp", "fromPort": 22.0, "toPort": 22.0, "cidrBlocks": ["0.0.0.0/0"]}]},
            "0.0.0.0/0",
        ),
        (
            "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup",
            {"ingress": [{"protocol": "-1", "fromPort": 0.0, "toPort": 0.0, "ipv6CidrBlocks": ["::0/0"]}]},
            "::0/0",
        ),
        (
            RULE,
            {
                "type": "ingress",
                "protocol": "tcp",
                "fromPort": 22.0,
                "toPort": 22.0,
                "cidrBlocks": ["0.0.0.0/0"],
            },
            "0.0.0.0/0",
        ),
    ],
)
def test_ingress_from_the_internet_is_a_violation_in_every_rule_form(
    resource, violations, type_, props, block
):
    [(name, message)] = violations(no_internet_ingress, resource(type_, props, name="ssh"))
    assert name == "ssh" and f"admits traffic from {block}" in message


# --- efa-security-group-self-traffic --------------------------------------------------------------------------


@pytest.fixture
def efa_group(resource):
    return resource(GROUP, {"description": "EFA"}, name="efa")


def efa_template(resource, group, interface_type="efa"):
    """A launch template whose interfaces reference `group`; in a real preview its id is still unknown."""
    interfaces = [
        {
            "networkCardIndex": float(card),
            "deviceIndex": 0.0,
            "interfaceType": interface_type,
            "securityGroups": [UNKNOWN_STRING_VALUE],
        }
        for card in range(2)
    ]
    return resource(
        TEMPLATE, {"networkInterfaces": interfaces}, name="gpu", fed_by={"networkInterfaces": [group]}
    )


def self_rule(resource, type_, group, **props):
    """A standalone rule of `group` whose peer is `group`: both inputs fed by the group's (unknown) id."""
    inputs = {
        "securityGroupId": UNKNOWN_STRING_VALUE,
        "referencedSecurityGroupId": UNKNOWN_STRING_VALUE,
        **props,
    }
    feeds = {"securityGroupId": [group], "referencedSecurityGroupId": [group]}
    return resource(type_, inputs, name=f"{type_.rsplit(':', 1)[1]}-self", fed_by=feeds)


def test_efa_group_with_all_traffic_rules_from_and_to_itself_passes(resource, violations, efa_group):
    rules = [
        self_rule(resource, INGRESS, efa_group, ipProtocol="-1"),
        self_rule(resource, EGRESS, efa_group, ipProtocol="-1"),
    ]
    assert violations(efa_self_traffic, efa_template(resource, efa_group), efa_group, *rules) == []


def test_efa_group_with_inline_self_rules_passes(resource, violations):
    rule = {"protocol": "-1", "fromPort": 0.0, "toPort": 0.0, "self": True}
    group = resource(GROUP, {"ingress": [rule], "egress": [rule]}, name="efa")
    assert violations(efa_self_traffic, efa_template(resource, group, "efa-only"), group) == []


def test_efa_group_with_older_security_group_rules_passes(resource, violations, efa_group):
    rules = [
        resource(
            RULE,
            {"type": direction, "protocol": "all", "fromPort": 0.0, "toPort": 0.0, "self": True},
            name=direction,
            fed_by={"securityGroupId": [efa_group]},
        )
        for direction in ("ingress", "egress")
    ]
    assert violations(efa_self_traffic, efa_template(resource, efa_group), efa_group, *rules) == []


def test_efa_group_without_self_egress_is_a_violation_even_with_egress_anywhere(
    resource, violations, efa_group
):
    anywhere = resource(
        EGRESS,
        {"ipProtocol": "-1", "cidrIpv4": "0.0.0.0/0", "securityGroupId": UNKNOWN_STRING_VALUE},
        name="anywhere",
        fed_by={"securityGroupId": [efa_group]},
    )
    ingress = self_rule(resource, INGRESS, efa_group, ipProtocol="-1")
    [(name, message)] = violations(
        efa_self_traffic, efa_template(resource, efa_group), efa_group, ingress, anywhere
    )
    assert (
        name == "efa"
        and "no all-traffic egress rule to itself" in message
        and "SecurityGroupEgressRule(" in message
    )


def test_efa_group_whose_self_rule_is_tcp_only_is_a_violation(resource, violations, efa_group):
    rules = [
        self_rule(resource, INGRESS, efa_group, ipProtocol="tcp", fromPort=0.0, toPort=65535.0),
        self_rule(resource, EGRESS, efa_group, ipProtocol="-1"),
    ]
    [(_, message)] = violations(efa_self_traffic, efa_template(resource, efa_group), efa_group, *rules)
    assert "no all-traffic ingress rule from itself" in message


def test_self_rule_of_another_group_does_not_count(resource, violations, efa_group):
    other = resource(GROUP, {}, name="other")
    rules = [self_rule(resource, type_, other, ipProtocol="-1") for type_ in (INGRESS, EGRESS)]
    found = violations(efa_self_traffic, efa_template(resource, efa_group), efa_group, other, *rules)
    assert [name for name, _ in found] == ["efa", "efa"]


def test_groups_without_efa_interfaces_are_not_judged(resource, violations, efa_group):
    template = efa_template(resource, efa_group, interface_type="interface")
    assert violations(efa_self_traffic, template, efa_group) == []


def test_efa_interfaces_on_a_group_outside_the_stack_are_a_violation(resource, violations):
    interfaces = [{"interfaceType": "efa", "securityGroups": ["sg-0123456789abcdef0"]}]
    template = resource(TEMPLATE, {"networkInterfaces": interfaces}, name="gpu")
    [(name, message)] = violations(efa_self_traffic, template)
    assert name == "gpu" and "no security group of this stack" in message


# --- s3-gateway-endpoint-with-nat -----------------------------------------------------------------------------


@pytest.fixture
def nat_network(resource):
    """A VPC, a public subnet and a NAT gateway in it, related as in a real preview: by dependencies, ids unknown."""
    vpc = resource("aws:ec2/vpc:Vpc", {"cidrBlock": "10.0.0.0/16"}, name="vpc")
    subnet = resource(
        "aws:ec2/subnet:Subnet", {"vpcId": UNKNOWN_STRING_VALUE}, name="public", fed_by={"vpcId": [vpc]}
    )
    nat = resource(
        "aws:ec2/natGateway:NatGateway",
        {"subnetId": UNKNOWN_STRING_VALUE},
        name="nat",
        fed_by={"subnetId": [subnet]},
    )
    return vpc, subnet, nat


def endpoint(resource, vpc, **props):
    inputs = {
        "vpcId": UNKNOWN_STRING_VALUE,
        "serviceName": "com.amazonaws.us-east-1.s3",
        "routeTableIds": [UNKNOWN_STRING_VALUE],
        **props,
    }
    return resource("aws:ec2/vpcEndpoint:VpcEndpoint", inputs, name="s3", fed_by={"vpcId": [vpc]})


def test_vpc_with_nat_and_an_s3_gateway_endpoint_passes(resource, violations, nat_network):
    vpc = nat_network[0]
    assert (
        violations(s3_gateway_endpoint, *nat_network, endpoint(resource, vpc, vpcEndpointType="Gateway"))
        == []
    )


def test_endpoint_routed_by_an_association_resource_passes(resource, violations, nat_network):
    vpc = nat_network[0]
    s3 = endpoint(resource, vpc, routeTableIds=[])
    association = resource(
        "aws:ec2/vpcEndpointRouteTableAssociation:VpcEndpointRouteTableAssociation",
        {"vpcEndpointId": UNKNOWN_STRING_VALUE},
        fed_by={"vpcEndpointId": [s3]},
    )
    assert violations(s3_gateway_endpoint, *nat_network, s3, association) == []


def test_vpc_with_nat_and_no_s3_endpoint_is_a_violation(violations, nat_network):
    [(name, message)] = violations(s3_gateway_endpoint, *nat_network)
    assert name == "vpc" and "NAT gateway(s) nat" in message and "vpc_endpoint_type='Gateway'" in message


@pytest.mark.parametrize(
    "props",
    [
        {"vpcEndpointType": "Interface"},  # an interface endpoint bills per GB too
        {"serviceName": "com.amazonaws.us-east-1.ecr.dkr"},
        {"routeTableIds": []},  # on no route table, nothing uses it
    ],
)
def test_endpoint_that_is_not_a_routed_s3_gateway_is_a_violation(resource, violations, nat_network, props):
    vpc = nat_network[0]
    assert [
        name for name, _ in violations(s3_gateway_endpoint, *nat_network, endpoint(resource, vpc, **props))
    ] == ["vpc"]


def test_s3_endpoint_of_another_vpc_does_not_count(resource, violations, nat_network):
    other = resource("aws:ec2/vpc:Vpc", {}, name="other")
    assert [
        name for name, _ in violations(s3_gateway_endpoint, *nat_network, other, endpoint(resource, other))
    ] == ["vpc"]


def test_vpc_without_nat_needs_no_endpoint(resource, violations):
    assert violations(s3_gateway_endpoint, resource("aws:ec2/vpc:Vpc", {}, name="isolated")) == []
