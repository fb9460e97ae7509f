"""The program with config the checked-in stacks do not use: reserved capacity, a pinned image, bad config."""

from __future__ import annotations

import json

import pulumi
import pytest

from infra.config import read_stack_file
from infra.mocks import StackMocks
from infra.preview import run_program

BLOCK = "cr-0123456789abcdef0"


@pytest.fixture(scope="module")
def capacity_block(variant):
    return variant("prod", **{"trainstack:capacityReservationId": BLOCK, "trainstack:capacityBlock": True})


def test_capacity_block_launches_into_the_block_with_the_capacity_block_market(capacity_block):
    template = capacity_block.launch_template.inputs
    assert template["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert template["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": BLOCK}
    }


def test_capacity_block_replaces_the_placement_group(capacity_block):
    assert capacity_block.all("ec2.PlacementGroup") == []
    resources = capacity_block.one("batch.ComputeEnvironment", "-gpu").inputs["computeResources"]
    assert "placementGroup" not in resources


def test_capacity_reservation_without_block_targets_it_on_demand(variant):
    reserved = variant(
        "prod",
        **{"trainstack:capacityReservationId": BLOCK, "trainstack:reservationPlacementGroup": "odcr-cluster"},
    )
    template = reserved.launch_template.inputs
    assert template["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": BLOCK}
    }
    assert "instanceMarketOptions" not in template
    # The reservation's own cluster placement group (EC2 guide, "Capacity Reservations for cluster placement groups").
    assert reserved.all("ec2.PlacementGroup") == []
    environment = reserved.one("batch.ComputeEnvironment", "-gpu").inputs["computeResources"]
    assert environment["placementGroup"] == "odcr-cluster"


def test_configured_image_replaces_the_latest_placeholder(variant):
    image = "123456789012.dkr.ecr.us-west-2.amazonaws.com/trainstack-prod-trainer:2025-01-01-abc1234"
    assert variant("prod", **{"trainstack:image": image}).node_container["image"] == image


def test_bad_config_stops_the_program_before_any_resource(monkeypatch):
    registered = []
    monkeypatch.setattr(
        StackMocks, "new_resource", lambda self, args: registered.append(args.name) or ("", {})
    )
    values = {**read_stack_file("dev"), "trainstack:instanceType": "g5.xlarge"}
    with pytest.raises(pulumi.RunError, match=r"trainstack:instanceType = 'g5.xlarge': has no EFA"):
        run_program("dev", values)
    assert registered == []


def test_p5en_layout_follows_the_catalog_too(variant):
    p5en = variant("prod", **{"trainstack:instanceType": "p5en.48xlarge"})
    assert len(p5en.launch_template.inputs["networkInterfaces"]) == 16
    assert len(p5en.node_container["linuxParameters"]["devices"]) == 16
    assert json.loads(p5en.one("batch.JobDefinition", "-train").inputs["nodeProperties"])["numNodes"] == 4
