"""imdsv2-required and no-public-ip-with-several-interfaces on hand-built launch templates."""

from __future__ import annotations

import pytest

from policy.launch_templates import imdsv2_required, no_public_ip_with_several_interfaces

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
