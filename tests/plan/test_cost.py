"""The plan's dollars: each purchase option from the real price lookup (the snapshot without credentials, botocore's
Stubber for the live Spot answer), the deadline, --compare, data transfer and the energy estimate."""

from __future__ import annotations

import dataclasses
import functools
from datetime import UTC, datetime

import boto3
import pytest
from botocore.stub import ANY, Stubber

from trainer.__main__ import main as trainer_main
from trainer.contract.catalog import instance_type
from trainer.contract.gpu_nodes import PODS_READY_TIMEOUT_MINUTES
from trainer.contract.stack import stack_capacity
from trainer.cost.energy import PUE
from trainer.cost.idle import idle_cost, startup_cost
from trainer.cost.pricing import AwsClients, hourly_price
from trainer.plan.cost import cheapest, dataset_gigabytes, energy_estimate, purchase_options, transfer_costs

from .conftest import LLAMA3_8B

P5 = instance_type("p5.48xlarge")
# A search over the micro-batch size alone: the CLI tests plan in a second, not a minute.
SMALL_SEARCH = ["--set", "schedule.micro_batch_size=auto"]


@pytest.fixture(autouse=True)
def _offline(no_credentials):
    """Every test here plans offline (tests/conftest.py no_credentials)."""


def test_each_option_costs_its_hourly_price_times_node_hours_from_the_snapshot():
    tokens, tokens_per_s = 1e12, 500_000.0
    costs = {c.option: c for c in purchase_options(P5, 4, tokens, tokens_per_s, "us-east-1")}
    hours = tokens / tokens_per_s / 3600
    assert costs["on-demand"].dollars == pytest.approx(hours * 4 * 55.04)
    assert costs["on-demand"].usd_per_million_tokens == pytest.approx(hours * 4 * 55.04 / 1e6)
    assert costs["reservation"].dollars == costs["on-demand"].dollars
    # 556 hours is 23.2 days: a Capacity Block is bought for 28 days (weeks beyond 14 days).
    assert costs["capacity-block"].billed_hours == 28 * 24
    assert costs["capacity-block"].dollars == pytest.approx(28 * 24 * 4 * 39.33)
    assert costs["spot"].dollars is None and "run with AWS credentials" in (costs["spot"].problem or "")


def _stubbed_spot_lookup(usd: str):
    """hourly_price with live EC2 clients whose DescribeSpotPriceHistory answer is stubbed (botocore's model)."""
    session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing")
    pricing, ec2 = (
        session.client("pricing", region_name="us-east-1"),
        session.client("ec2", region_name="us-east-1"),
    )
    stub = Stubber(ec2)
    record = {
        "AvailabilityZone": "us-east-1a",
        "InstanceType": "p5.48xlarge",
        "ProductDescription": "Linux/UNIX",
        "SpotPrice": usd,
        "Timestamp": datetime(2026, 12, 4, 20, tzinfo=UTC),
    }
    stub.add_response(
        "describe_spot_price_history",
        {"SpotPriceHistory": [record]},
        {**dict.fromkeys(("InstanceTypes", "ProductDescriptions", "StartTime"), ANY)},
    )
    stub.activate()
    live = functools.partial(hourly_price, clients=AwsClients(pricing, ec2))

    def lookup(name, region, option):
        return live(name, region, option) if option == "spot" else hourly_price(name, region, option)

    return lookup, stub


def test_spot_is_priced_live_but_refused_for_a_multi_node_run_and_allowed_on_one_node():
    lookup, stub = _stubbed_spot_lookup("20.000000")
    (spot,) = [
        c for c in purchase_options(P5, 4, 1e12, 5e5, "us-east-1", lookup=lookup) if c.option == "spot"
    ]
    assert spot.price is not None and spot.price.live and spot.price.usd_per_hour == 20.0
    assert spot.dollars is None and spot.problem == "Batch multi-node parallel jobs do not run on Spot"
    lookup, stub = _stubbed_spot_lookup("20.000000")
    (spot,) = [
        c for c in purchase_options(P5, 1, 1e12, 5e5, "us-east-1", lookup=lookup) if c.option == "spot"
    ]
    assert spot.problem is None and spot.dollars == pytest.approx(1e12 / 5e5 / 3600 * 20.0)
    stub.assert_no_pending_responses()


def test_a_capacity_block_over_64_nodes_is_refused():
    (block,) = [c for c in purchase_options(P5, 65, 1e12, 5e6, "us-east-1") if c.option == "capacity-block"]
    assert block.dollars is None and block.problem == "a Capacity Block holds at most 64 instances"


def test_the_deadline_picks_the_cheapest_option_that_finishes_in_time():
    costs = purchase_options(P5, 4, 1e12, 5e5, "us-east-1")
    assert cheapest(costs).option == "capacity-block"  # 28 days of blocks at 39.33 beat 23.2 days at 55.04
    assert cheapest(costs, deadline_hours=30 * 24).option == "capacity-block"
    assert cheapest(costs, deadline_hours=20 * 24) is None  # the run takes 23.2 days whatever is bought


def test_a_given_price_replaces_the_lookup():
    (given,) = purchase_options(P5, 2, 1e9, 1e5, "us-west-2", price_per_hour=10.0)
    assert given.option == "given" and given.dollars == pytest.approx(1e9 / 1e5 / 3600 * 2 * 10.0)


def test_the_dataset_is_four_bytes_a_token_for_llama3s_vocabulary_and_two_below_65500():
    assert dataset_gigabytes(1e12, 128_256) == pytest.approx(4000.0)
    assert dataset_gigabytes(1e12, 32_000) == pytest.approx(2000.0)


def test_transfer_is_free_on_the_stacks_path_and_priced_per_gb_on_the_others():
    costs, source = transfer_costs(4000.0)
    dollars = {c.path.split(" (")[0]: (c.dollars, c.applies) for c in costs}
    assert dollars["S3 -> FSx, same Region"] == (0.0, True)
    assert dollars["the same bytes through a NAT gateway"] == (pytest.approx(180.0), False)
    assert dollars["the same bytes across Availability Zones"] == (pytest.approx(80.0), False)
    assert "vpc/pricing" in source


def test_energy_estimate_counts_every_node_hour():
    estimate = energy_estimate(P5, 4, 100.0, "us-west-2")
    assert estimate.kwh == pytest.approx(4 * 100 * 10.2 * PUE)
    assert estimate.kg_co2e == pytest.approx(estimate.kwh * 0.322167)
    assert energy_estimate(P5, 4, 100.0, "il-central-1").kg_co2e is None


def _plan(*args: str) -> list[str]:
    return ["plan", "--config", str(LLAMA3_8B), "--top", "1", "--tokens", "1e12", *SMALL_SEARCH, *args]


def test_plan_prints_dollars_per_option_with_the_snapshots_date_and_the_estimates(capsys):
    assert trainer_main(_plan("--instance", "p5.48xlarge", "--nodes", "4")) == 0
    out = capsys.readouterr().out
    assert "snapshot 2026-12-04 (no AWS credentials): aws/karpenter-provider-aws" in out
    for line in ("on-demand", "capacity-block", "reservation", "cheapest: ", "$/M tokens"):
        assert line in out
    assert "energy (estimate: nodes at maximum power, PUE 1.135)" in out
    assert "emissions (estimate, us-east-1 grid intensity of 2024-02-11)" in out


def test_plan_exits_1_when_no_option_meets_the_deadline(capsys):
    assert trainer_main(_plan("--instance", "p5.48xlarge", "--nodes", "4", "--deadline", "1")) == 1
    assert "no purchase option finishes within 1 days: the run takes" in capsys.readouterr().out


def test_compare_ranks_the_instance_types_and_picks_the_cheapest_within_the_deadline(capsys):
    bf16 = ["--set", "fp8.format=null", "--set", "fp8.recipe=delayed"]  # the A100 types have no FP8
    args = _plan("--instance", "p5.48xlarge", "--nodes", "4", "--compare", "--deadline", "30", *bf16)
    assert trainer_main(args) == 0
    out = capsys.readouterr().out.split("\ncompare", 1)[1]
    rows = [row for row in map(str.split, out.splitlines()) if len(row) > 2 and row[1].endswith("xlarge")]
    ranked = [row[1] for row in rows if row[0].isdigit()]
    days = [float(row[2]) for row in rows if row[0].isdigit()]
    assert ranked[0] == "p6-b200.48xlarge" and days == sorted(days)
    assert {row[1] for row in rows} == {
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p5.48xlarge",
        "p5e.48xlarge",
        "p5en.48xlarge",
        "p6-b200.48xlarge",
    }
    assert next(row for row in rows if row[0] == "-")[:5] == ["-", "p4d.24xlarge", "no", "layout", "fits"]
    # p5's capacity block is cheaper but takes 31.9 days; B200 On-Demand finishes in 14.
    assert "cheapest within 30 days: p6-b200.48xlarge on-demand" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stack", "prod", "--region", "us-east-1"], "give --stack or --region, not both"),
        (
            ["--instance", "p5.48xlarge", "--nodes", "1", "--compare", "--price-per-hour", "9"],
            "--compare prices each",
        ),
    ],
)
def test_conflicting_cost_arguments_exit_2(capsys, args, message):
    assert trainer_main(_plan(*args)) == 2
    assert message in capsys.readouterr().err


def test_an_idle_eks_stack_costs_nothing_on_gpus_and_a_start_up_at_most_the_pods_ready_timeout():
    eks = stack_capacity("eks-dev")
    assert (eks.orchestrator, eks.nodes, eks.capacity_reservation) == ("eks", 2, False)
    idle = idle_cost(eks, "us-east-1")
    assert (idle.nodes, idle.usd_per_hour) == (0, 0.0)
    startup = startup_cost(eks, 2, "us-east-1")
    assert startup is not None and startup.minutes == PODS_READY_TIMEOUT_MINUTES == 30
    assert startup.usd == pytest.approx(2 * 55.04 * 0.5)
    batch = stack_capacity("dev")
    assert idle_cost(batch, "us-east-1").usd_per_hour == 0.0 and startup_cost(batch, 2, "us-east-1") is None


@pytest.mark.parametrize(("block", "option"), [(False, "reservation"), (True, "capacity-block")])
def test_reserved_nodes_cost_the_same_idle(block, option):
    reserved = dataclasses.replace(stack_capacity("eks-dev"), capacity_reservation=True, capacity_block=block)
    idle = idle_cost(reserved, "us-east-1")
    assert idle.nodes == 2
    assert idle.usd_per_hour == pytest.approx(
        2 * hourly_price("p5.48xlarge", "us-east-1", option).usd_per_hour
    )
    assert startup_cost(reserved, 2, "us-east-1") is None


def test_plan_with_an_eks_stack_prints_its_idle_and_start_up_cost(capsys):
    assert (
        trainer_main(
            [
                "plan",
                "--config",
                str(LLAMA3_8B),
                "--top",
                "1",
                "--tokens",
                "1e12",
                *SMALL_SEARCH,
                "--stack",
                "eks-dev",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "idle stack: 0 GPU nodes, $0.00/hour on GPUs (Karpenter starts GPU nodes only for admitted jobs"
        in out
    )
    assert "node start-up per attempt: at most 30 min x 2 nodes = $55" in out
