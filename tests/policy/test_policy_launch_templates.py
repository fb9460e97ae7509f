"""imdsv2-required, no-public-ip-with-several-interfaces and launch-template-interfaces-name-no-subnet on hand-built
launch templates, and on every stack's preview."""

from __future__ import annotations

import pytest

from policy.launch_templates import imdsv2_required, no_interface_subnet, no_public_ip_with_several_interfaces
from policy.offline import evaluate

TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"


@pytest.mark.parametrize(
    "metadata",
    [
        {"httpEndpoint": "enabled", "httpTokens": "required", "httpPutResponseHopLimit": 1.0},
        {"httpEndpoint": "disabled"},
    ],
)
def test_template_requiring_imds_tokens_or_without_imds_passes(resource, violations, metadata):
    assert violations(imdsv2_required, resource(TEMPLATE, {"metadataOptions": metadata})) == []


@pytest.mark.parametrize(
    "props", [{}, {"metadataOptions": {"httpEndpoint": "enabled", "httpTokens": "optional"}}]
)
def test_template_allowing_imdsv1_is_a_violation(resource, violations, props):
    [(name, message)] = violations(imdsv2_required, resource(TEMPLATE, props, name="gpu"))
    assert name == "gpu" and "'http_tokens': 'required'" in message


def interfaces(count, public_on=None):
    return [
        {
            "networkCardIndex": float(card),
            "deviceIndex": 0.0,
            "interfaceType": "efa" if card == 0 else "efa-only",
            **(
                {"associatePublicIpAddress": "true" if card == public_on else "false"}
                if card in (0, public_on)
                else {}
            ),
        }
        for card in range(count)
    ]


def test_efa_template_without_public_ip_passes(resource, violations):
    template = resource(TEMPLATE, {"networkInterfaces": interfaces(32)})
    assert violations(no_public_ip_with_several_interfaces, template) == []


def test_single_interface_template_may_ask_for_a_public_ip(resource, violations):
    template = resource(TEMPLATE, {"networkInterfaces": interfaces(1, public_on=0)})
    assert violations(no_public_ip_with_several_interfaces, template) == []


@pytest.mark.parametrize("public_on", [0, 3])
def test_several_interfaces_with_a_public_ip_is_a_violation(resource, violations, public_on):
    template = resource(TEMPLATE, {"networkInterfaces": interfaces(4, public_on=public_on)}, name="gpu")
    [(_, message)] = violations(no_public_ip_with_several_interfaces, template)
    assert f"has 4 network interfaces and asks for a public IP on interface(s) {public_on}" in message


def test_interfaces_without_a_subnet_pass(resource, violations):
    assert violations(no_interface_subnet, resource(TEMPLATE, {"networkInterfaces": interfaces(4)})) == []


def test_an_interface_naming_a_subnet_is_a_violation(resource, violations):
    # The shape the stacks had: every EFA interface with the cluster subnet, which Batch ignores and EKS refuses.
    named = [{**i, "subnetId": "subnet-0123"} for i in interfaces(4)]
    [(name, message)] = violations(
        no_interface_subnet, resource(TEMPLATE, {"networkInterfaces": named}, name="gpu")
    )
    assert name == "gpu" and "network interface(s) 0, 1, 2, 3" in message and "Remove subnet_id" in message


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_no_stack_names_a_subnet_in_a_launch_template(planned, stack):
    found = [
        v for v in evaluate(planned(stack), stack) if v.policy == "launch-template-interfaces-name-no-subnet"
    ]
    assert found == []
