"""Each Batch job definition tells its jobs' ledgers what their nodes are bought as (TRAINSTACK_PURCHASE_OPTION,
trainer/cost/ledger.py local_rate), so a Spot node is not charged at the On-Demand price: the Spot queue's
single-node definition says spot, the GPU queue's multi-node one on-demand, or its reserved capacity's kind."""

from __future__ import annotations

import json

import pytest

from trainer.config.schema import BudgetConfig
from trainer.cost.ledger import local_rate
from trainer.cost.pricing import PURCHASE_OPTIONS

from .conftest import planned

BLOCK = "cr-0123456789abcdef0"


def _environment(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["environment"]}


def test_the_spot_definition_says_spot_and_the_main_one_on_demand():
    dev = planned("dev")  # trainstack:spot: true
    main = {k: v for k, v in dev.node_container.items() if k != "instanceType"}  # a node range's key only
    spot = json.loads(dev.one("batch.JobDefinition", "-spot").inputs["containerProperties"])
    assert _environment(main)["TRAINSTACK_PURCHASE_OPTION"] == "on-demand"
    assert _environment(spot)["TRAINSTACK_PURCHASE_OPTION"] == "spot"
    # Otherwise the same container: only what the nodes cost differs.
    unpriced = [
        {**c, "environment": [e for e in c["environment"] if e["name"] != "TRAINSTACK_PURCHASE_OPTION"]}
        for c in (main, spot)
    ]
    assert unpriced[0] == unpriced[1]


@pytest.mark.parametrize(
    ("changes", "option"),
    [
        ({"trainstack:capacityReservationId": BLOCK, "trainstack:capacityBlock": True}, "capacity-block"),
        (
            {
                "trainstack:capacityReservationId": BLOCK,
                "trainstack:reservationPlacementGroup": "odcr-cluster",
            },
            "reservation",
        ),
    ],
)
def test_reserved_capacity_is_priced_as_what_it_is(variant, changes, option):
    container = variant("prod", **changes).node_container
    assert _environment(container)["TRAINSTACK_PURCHASE_OPTION"] == option


@pytest.mark.parametrize("option", ["spot", "on-demand", "capacity-block", "reservation"])
def test_the_ledger_takes_each_value_a_definition_sets(option):
    """The values are the price list's, and a Batch job's ledger prices its node-hours under them."""
    assert option in PURCHASE_OPTIONS
    environ = {
        "AWS_BATCH_JOB_ID": "job",
        "TRAINSTACK_INSTANCE_TYPE": "p5.48xlarge",
        "TRAINSTACK_PURCHASE_OPTION": option,
        "AWS_REGION": "us-east-1",
    }
    assert local_rate(BudgetConfig(price_per_hour=10.0), environ).option == option


def test_an_eks_stack_has_no_spot_capacity():
    """On EKS no Spot node exists to be priced: the config refuses trainstack:spot there (infra/config.py), and the
    Karpenter NodePool asks for on-demand (or reserved) capacity only (infra/karpenter.py capacity_types)."""
    from infra.config import load_stack_config
    from infra.karpenter import capacity_types

    config = load_stack_config("eks-dev")
    assert config.spot is False and "spot" not in capacity_types(config)


def test_an_eks_stack_exports_what_its_gpu_nodes_are_bought_as(variant):
    """Its JobSets' pods hand it to their ledgers (trainer/jobs/jobset.py; tests/jobs/test_jobset.py)."""
    assert planned("eks-dev").plan.outputs["purchase_option"] == "on-demand"
    changes = {"trainstack:capacityReservationId": BLOCK, "trainstack:capacityBlock": True}
    assert variant("eks-dev", **changes).plan.outputs["purchase_option"] == "capacity-block"
