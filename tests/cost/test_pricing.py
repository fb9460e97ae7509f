"""Prices from AWS through botocore's Stubber (requests and responses checked against botocore's pricing and ec2
service models), and the dated snapshot when there are no credentials."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path

import boto3
import botocore
import pytest
from botocore.stub import ANY, Stubber

from trainer.contract.catalog import EFA_INSTANCE_TYPES
from trainer.cost.pricing import (
    SNAPSHOT,
    AwsClients,
    PriceUnavailable,
    capacity_block_hours,
    hourly_price,
    snapshot_price,
    transfer_rates,
)

BOTOCORE_DATA = Path(botocore.__file__).parent / "data"


def _example_price_list_item() -> dict:
    """The Price List document of botocore's own GetProducts example (data/pricing/2017-10-15/examples-1.json)."""
    examples = json.loads((BOTOCORE_DATA / "pricing/2017-10-15/examples-1.json").read_text())
    return json.loads(examples["examples"]["GetProducts"][0]["output"]["PriceList"][0])


def price_list_item(instance_type: str, region_code: str, usd: str) -> str:
    """botocore's example document turned into an instance-hour product: same keys, our attributes and price."""
    item = copy.deepcopy(_example_price_list_item())
    item["product"]["productFamily"] = "Compute Instance"
    item["product"]["attributes"].update(
        instanceType=instance_type, regionCode=region_code, operatingSystem="Linux", tenancy="Shared"
    )
    (term,) = item["terms"]["OnDemand"].values()
    (dimension,) = term["priceDimensions"].values()
    dimension.update(unit="Hrs", pricePerUnit={"USD": usd})
    return json.dumps(item)


def _client(service: str, region: str):
    return boto3.session.Session().client(
        service, region_name=region, aws_access_key_id="testing", aws_secret_access_key="testing"
    )


@pytest.fixture
def clients():
    pricing, ec2 = _client("pricing", "us-east-1"), _client("ec2", "us-west-2")
    with Stubber(pricing) as pricing_stub, Stubber(ec2) as ec2_stub:
        yield AwsClients(pricing, ec2), pricing_stub, ec2_stub
        pricing_stub.assert_no_pending_responses()
        ec2_stub.assert_no_pending_responses()


def _filters(instance_type: str, region: str) -> dict[str, str]:
    return {
        "serviceCode": "AmazonEC2",
        "preInstalledSw": "NA",
        "operatingSystem": "Linux",
        "capacitystatus": "Used",
        "marketoption": "OnDemand",
        "tenancy": "Shared",
        "productFamily": "Compute Instance",
        "regionCode": region,
        "instanceType": instance_type,
    }


def _expected_get_products(instance_type: str, region: str, token: str | None = None) -> dict:
    params = {
        "ServiceCode": "AmazonEC2",
        "Filters": [
            {"Type": "TERM_MATCH", "Field": field, "Value": value}
            for field, value in _filters(instance_type, region).items()
        ],
        "MaxResults": 100,
    }
    return {**params, "NextToken": token} if token else params


def test_on_demand_price_is_read_from_the_price_list_json_with_linux_shared_tenancy_filters(clients):
    aws, pricing, _ = clients
    response = {
        "FormatVersion": "aws_v1",
        "PriceList": [price_list_item("p5.48xlarge", "us-west-2", "55.04")],
    }
    pricing.add_response("get_products", response, _expected_get_products("p5.48xlarge", "us-west-2"))
    price = hourly_price("p5.48xlarge", "us-west-2", "on-demand", clients=aws)
    assert price.usd_per_hour == 55.04
    assert price.live and price.source.startswith("live: AWS Price List API")
    assert "published 2017-09-01T18:22:01Z" in price.source  # the document's own publicationDate


def test_on_demand_follows_next_token_across_pages(clients):
    aws, pricing, _ = clients
    first = {"PriceList": [], "NextToken": "page-2"}
    second = {"PriceList": [price_list_item("p4d.24xlarge", "us-west-2", "21.957642")]}
    pricing.add_response("get_products", first, _expected_get_products("p4d.24xlarge", "us-west-2"))
    pricing.add_response(
        "get_products", second, _expected_get_products("p4d.24xlarge", "us-west-2", "page-2")
    )
    assert hourly_price("p4d.24xlarge", "us-west-2", "on-demand", clients=aws).usd_per_hour == 21.957642


def test_two_different_on_demand_prices_are_refused_rather_than_one_picked(clients):
    aws, pricing, _ = clients
    items = [price_list_item("p5.48xlarge", "us-west-2", usd) for usd in ("55.04", "98.32")]
    pricing.add_response(
        "get_products", {"PriceList": items}, _expected_get_products("p5.48xlarge", "us-west-2")
    )
    with pytest.raises(PriceUnavailable, match=r"2 On-Demand prices .*\(55.04, 98.32\)"):
        hourly_price("p5.48xlarge", "us-west-2", "on-demand", clients=aws)


def test_a_reservation_is_priced_at_the_on_demand_rate_and_says_so(clients):
    aws, pricing, _ = clients
    response = {"PriceList": [price_list_item("p5.48xlarge", "us-west-2", "55.04")]}
    pricing.add_response("get_products", response, _expected_get_products("p5.48xlarge", "us-west-2"))
    price = hourly_price("p5.48xlarge", "us-west-2", "reservation", clients=aws)
    assert price.usd_per_hour == 55.04 and "billed at the On-Demand rate" in price.source


def test_spot_takes_each_zones_latest_price_and_the_cheapest_zone(clients):
    aws, _, ec2 = clients
    # Shaped like botocore's DescribeSpotPriceHistory example (data/ec2/2016-11-15/examples-1.json).
    history = [
        ("us-west-2a", "30.100000", datetime(2026, 12, 4, 20, 0, tzinfo=UTC)),
        ("us-west-2a", "12.000000", datetime(2026, 12, 1, 8, 0, tzinfo=UTC)),  # older: superseded
        ("us-west-2b", "24.500000", datetime(2026, 12, 4, 19, 0, tzinfo=UTC)),
    ]
    response = {
        "SpotPriceHistory": [
            {
                "AvailabilityZone": zone,
                "InstanceType": "p5.48xlarge",
                "ProductDescription": "Linux/UNIX",
                "SpotPrice": usd,
                "Timestamp": stamp,
            }
            for zone, usd, stamp in history
        ]
    }
    expected = {"InstanceTypes": ["p5.48xlarge"], "ProductDescriptions": ["Linux/UNIX"], "StartTime": ANY}
    ec2.add_response("describe_spot_price_history", response, expected)
    price = hourly_price("p5.48xlarge", "us-west-2", "spot", clients=aws)
    assert price.usd_per_hour == 24.5
    assert "us-west-2b" in price.source and price.as_of.startswith("2026-12-04T19:00")


def test_capacity_block_rate_is_the_upfront_fee_over_its_instance_hours(clients):
    aws, _, ec2 = clients
    offering = {
        "InstanceType": "p5.48xlarge",
        "AvailabilityZone": "us-west-2b",
        "InstanceCount": 1,
        "StartDate": datetime(2026, 12, 6, 11, 30, tzinfo=UTC),
        "EndDate": datetime(2026, 12, 7, 11, 30, tzinfo=UTC),
        "CapacityBlockDurationHours": 24,
        "CapacityBlockDurationMinutes": 0,
        "CurrencyCode": "USD",
        "Tenancy": "default",
    }
    offerings = [
        {**offering, "CapacityBlockOfferingId": "cb-0123456789abcdef0", "UpfrontFee": "943.92"},
        {**offering, "CapacityBlockOfferingId": "cb-0fedcba9876543210", "UpfrontFee": "1200.00"},
    ]
    expected = {"InstanceType": "p5.48xlarge", "InstanceCount": 1, "CapacityDurationHours": 24}
    ec2.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": offerings}, expected)
    price = hourly_price("p5.48xlarge", "us-west-2", "capacity-block", clients=aws)
    assert price.usd_per_hour == pytest.approx(943.92 / 24)
    assert "cb-0123456789abcdef0" in price.source


def test_no_capacity_block_offered_is_a_clear_error(clients):
    aws, _, ec2 = clients
    ec2.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": []}, None)
    with pytest.raises(PriceUnavailable, match=r"no Capacity Block of p6-b200\.48xlarge"):
        hourly_price("p6-b200.48xlarge", "us-west-2", "capacity-block", clients=aws)


def test_a_denied_live_lookup_falls_back_to_the_snapshot_and_says_why(clients):
    aws, pricing, _ = clients
    pricing.add_client_error("get_products", "AccessDeniedException", "not authorized to pricing:GetProducts")
    price = hourly_price("p5.48xlarge", "us-east-1", "on-demand", clients=aws)
    assert not price.live and price.usd_per_hour == 55.04
    assert price.source.startswith("snapshot 2026-12-04 (live lookup failed:")
    assert "AccessDeniedException" in price.source


def test_without_credentials_the_snapshot_answers_with_its_date_and_source(no_credentials):
    price = hourly_price("p5.48xlarge", "us-east-1", "on-demand")
    assert price.usd_per_hour == 55.04 and price.as_of == "2026-07-20"
    assert price.source.startswith("snapshot 2026-12-04 (no AWS credentials): aws/karpenter-provider-aws")
    block = hourly_price("p4d.24xlarge", "us-west-2", "capacity-block")
    assert block.usd_per_hour == 14.75 and "capacityblocks/pricing" in block.source


def test_without_credentials_spot_is_refused_with_what_to_do(no_credentials):
    with pytest.raises(PriceUnavailable, match="snapshot keeps none; run with AWS credentials"):
        hourly_price("p5.48xlarge", "us-east-1", "spot")


def test_a_region_the_snapshot_lacks_names_what_it_has_and_the_way_out():
    with pytest.raises(PriceUnavailable, match=r"us-west-2 .*snapshot has us-east-1: .*--price-per-hour"):
        snapshot_price("p5.48xlarge", "us-west-2", "on-demand", why="no AWS credentials")


def test_an_unknown_purchase_option_is_refused_with_the_valid_ones():
    with pytest.raises(
        ValueError, match="'savings-plan': give one of on-demand, spot, capacity-block, reservation"
    ):
        hourly_price("p5.48xlarge", "us-east-1", "savings-plan")


def test_the_snapshot_names_only_catalog_instance_types_with_positive_prices():
    snapshot = json.loads(SNAPSHOT.read_text())
    for option in ("on-demand", "capacity-block"):
        for region, prices in snapshot[option]["usd_per_hour"].items():
            for name, usd in prices.items():
                assert usd > 0, (option, region, name)
                assert name in EFA_INSTANCE_TYPES or name.startswith("g5."), name
    rates, source = transfer_rates()
    assert set(rates) == {"s3-to-fsx-same-region", "cross-az", "nat-gateway", "inter-region"}
    assert "vpc/pricing" in source and "as of" in source


@pytest.mark.parametrize(
    ("hours", "billed"),
    [(1, 24), (24, 24), (25, 48), (14 * 24, 14 * 24), (14 * 24 + 1, 21 * 24), (40 * 24, 42 * 24)],
)
def test_a_capacity_block_bills_whole_days_up_to_14_then_whole_weeks(hours, billed):
    assert capacity_block_hours(hours) == billed


def test_credentials_give_live_clients_for_the_price_list_and_the_stacks_region(no_credentials, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    clients = AwsClients.from_credentials("us-west-2")
    assert clients is not None
    assert clients.pricing.meta.region_name == "us-east-1" and clients.ec2.meta.region_name == "us-west-2"


def test_without_credentials_there_are_no_clients(no_credentials):
    assert AwsClients.from_credentials("us-west-2") is None


def test_an_unreachable_endpoint_falls_back_to_the_snapshot_and_says_why(no_credentials, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # the discard port: nothing listens
    price = hourly_price("p5.48xlarge", "us-east-1", "on-demand")
    assert not price.live and price.usd_per_hour == 55.04
    assert "live lookup failed: Could not connect to the endpoint URL" in price.source


def test_the_inference_pools_price_comes_from_the_snapshot_with_its_source():
    from trainer.cost.pricing import endpoint_price, pool_cost

    price = endpoint_price("ml.g5.2xlarge", "us-east-1")
    assert (price.usd_per_hour, price.as_of) == (1.52, "2026-03-15")
    assert "aws.amazon.com/sagemaker/ai/pricing/" in price.source and not price.live
    line = pool_cost("ml.g5.2xlarge", "us-east-1", 1, 2, now=1)
    assert line.startswith(
        "1..2 x ml.g5.2xlarge at $1.52/hour each: $1.52/hour now (1 in service); $1.52-$3.04/hour"
    )
    assert "no SageMaker real-time inference price for ml.g5.2xlarge in eu-west-1" in pool_cost(
        "ml.g5.2xlarge", "eu-west-1", 1, 2
    )
