"""Instance prices from AWS, not from memory: On-Demand from the AWS Price List API, Spot from EC2's price
history, Capacity Blocks from EC2's offerings; a checked-in snapshot (dated, with its source) when there are no
credentials. `hourly_price` is what the planner and the ledger call.

The response shapes are botocore's service models (data/pricing/2017-10-15, data/ec2/2016-11-15); the Price List
item is the JSON document of botocore's GetProducts example. docs/cost.md says what only a real account can show.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

PurchaseOption = Literal["on-demand", "spot", "capacity-block", "reservation"]
PURCHASE_OPTIONS: tuple[PurchaseOption, ...] = ("on-demand", "spot", "capacity-block", "reservation")

SNAPSHOT = Path(__file__).with_name("prices.json")
# The Price List Query API has two endpoints, us-east-1 and ap-south-1, each with every Region's prices (SDK
# reference for the pricing client, "Service Endpoint").
PRICE_LIST_REGION = "us-east-1"
# The filters that select one Linux, shared-tenancy On-Demand instance price (karpenter-provider-aws v1.14.0,
# pkg/providers/pricing/pricing.go fetchOnDemandPricing, plus the instance type).
ON_DEMAND_FILTERS = {
    "serviceCode": "AmazonEC2",
    "preInstalledSw": "NA",
    "operatingSystem": "Linux",
    "capacitystatus": "Used",
    "marketoption": "OnDemand",
    "tenancy": "Shared",
    "productFamily": "Compute Instance",
}
# A plan asks for four prices: an unreachable endpoint should cost seconds, not the jobs' ten adaptive retries.
LOOKUP_CONFIG = {"retries": {"mode": "adaptive", "max_attempts": 3}, "connect_timeout": 5, "read_timeout": 15}
# Spot prices for Linux instances in a VPC (EC2 API DescribeSpotPriceHistory, ProductDescription values).
SPOT_PRODUCT = "Linux/UNIX"
# A Capacity Block lasts 1-14 days in 1-day steps, then 7-day steps up to 182 days; up to 64 instances
# (botocore ec2 model, DescribeCapacityBlockOfferingsRequest CapacityDurationHours and InstanceCount).
CAPACITY_BLOCK_DAYS_DAILY = 14
CAPACITY_BLOCK_MAX_DAYS = 182
CAPACITY_BLOCK_MAX_INSTANCES = 64
# The offering the live lookup asks for: one instance for one day, the shortest block.
CAPACITY_BLOCK_PROBE_HOURS = 24


class PriceUnavailable(LookupError):
    """No price for this instance type, Region and purchase option; the message says what to do instead."""


@dataclass(frozen=True)
class Price:
    instance_type: str
    region: str
    option: PurchaseOption
    usd_per_hour: float  # one instance for one hour
    source: str  # "live: AWS Price List API ..." or "snapshot 2026-12-04: <source>"
    as_of: str  # ISO date (or timestamp) the price was read or published

    @property
    def live(self) -> bool:
        return self.source.startswith("live:")


def hourly_price(
    instance_type: str,
    region: str,
    option: PurchaseOption,
    *,
    clients: AwsClients | None = None,
) -> Price:
    """One instance-hour of `instance_type` in `region` bought as `option`: live from AWS when credentials are
    present (or `clients` are given), else from the checked-in snapshot (its source says which and why)."""
    if option not in PURCHASE_OPTIONS:
        raise ValueError(f"purchase option {option!r}: give one of {', '.join(PURCHASE_OPTIONS)}")
    if clients is None:
        clients = clients_for(region)
    if clients is None:
        return snapshot_price(instance_type, region, option, why="no AWS credentials")
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return live_price(instance_type, region, option, clients)
    except (
        BotoCoreError,
        ClientError,
    ) as error:  # denied, throttled, unreachable: the snapshot still answers
        return snapshot_price(instance_type, region, option, why=f"live lookup failed: {error}")


@dataclass(frozen=True)
class AwsClients:
    """The two boto3 clients the live lookups use; tests hand in clients wrapped in botocore's Stubber."""

    pricing: Any
    ec2: Any

    @classmethod
    def from_credentials(cls, region: str) -> AwsClients | None:
        """Clients for `region` when boto3 finds credentials (environment, profile, instance role), else None."""
        from botocore.config import Config

        from trainer.aws.clients import session as new_session

        session = new_session()
        if session.get_credentials() is None:
            return None
        config = Config(**LOOKUP_CONFIG)
        return cls(
            session.client("pricing", region_name=PRICE_LIST_REGION, config=config),
            session.client("ec2", region_name=region, config=config),
        )


@functools.cache
def clients_for(region: str) -> AwsClients | None:
    """Once per process and Region: finding no credentials can take boto3 seconds (it asks instance metadata)."""
    return AwsClients.from_credentials(region)


def live_price(instance_type: str, region: str, option: PurchaseOption, clients: AwsClients) -> Price:
    now = datetime.now(UTC)
    # EC2 User Guide AWSEC2/latest/UserGuide/capacity-reservations-pricing-billing.html: the On-Demand rate.
    if option in ("on-demand", "reservation"):
        usd, published = on_demand_from_price_list(clients.pricing, instance_type, region)
        source = (
            f"live: AWS Price List API (AmazonEC2 On-Demand, Linux, shared tenancy, published {published})"
        )
        if option == "reservation":
            source += "; an On-Demand Capacity Reservation is billed at the On-Demand rate"
        return Price(instance_type, region, option, usd, source, now.date().isoformat())
    if option == "spot":
        usd, zone, stamp = spot_from_history(clients.ec2, instance_type, now)
        source = f"live: EC2 DescribeSpotPriceHistory ({SPOT_PRODUCT}, lowest zone {zone} at {stamp})"
        return Price(instance_type, region, option, usd, source, stamp)
    usd, offering = capacity_block_from_offerings(clients.ec2, instance_type)
    source = f"live: EC2 DescribeCapacityBlockOfferings ({offering}, upfront fee over its hours)"
    return Price(instance_type, region, option, usd, source, now.date().isoformat())


def on_demand_from_price_list(pricing: Any, instance_type: str, region: str) -> tuple[float, str]:
    """The USD price per hour from GetProducts' PriceList (JSON strings), and the list's publication date."""
    filters = [
        {"Type": "TERM_MATCH", "Field": field, "Value": value}
        for field, value in {**ON_DEMAND_FILTERS, "regionCode": region, "instanceType": instance_type}.items()
    ]
    prices: set[float] = set()
    published = ""
    token: str | None = None
    while True:
        page = pricing.get_products(
            ServiceCode="AmazonEC2",
            Filters=filters,
            MaxResults=100,
            **({"NextToken": token} if token else {}),
        )
        for document in page.get("PriceList", []):
            item = json.loads(document)
            published = item.get("publicationDate", published)
            for term in item.get("terms", {}).get("OnDemand", {}).values():
                for dimension in term.get("priceDimensions", {}).values():
                    usd = float(dimension.get("pricePerUnit", {}).get("USD", "0"))
                    if dimension.get("unit") == "Hrs" and usd > 0:
                        prices.add(usd)
        token = page.get("NextToken")
        if not token:
            break
    if not prices:
        raise PriceUnavailable(
            f"the AWS Price List has no On-Demand Linux price for {instance_type} in {region}"
        )
    if len(prices) > 1:
        raise PriceUnavailable(
            f"the AWS Price List has {len(prices)} On-Demand prices for {instance_type} in {region} "
            f"({', '.join(f'{p:g}' for p in sorted(prices))}); the filters no longer select one product"
        )
    return prices.pop(), published


def spot_from_history(ec2: Any, instance_type: str, now: datetime) -> tuple[float, str, str]:
    """The lowest current Spot price over the Region's zones: (USD per hour, zone, timestamp)."""
    page = ec2.describe_spot_price_history(
        InstanceTypes=[instance_type], ProductDescriptions=[SPOT_PRODUCT], StartTime=now
    )
    latest: dict[str, tuple[datetime, float]] = {}
    for record in page.get("SpotPriceHistory", []):
        zone, stamp = record["AvailabilityZone"], record["Timestamp"]
        if zone not in latest or stamp > latest[zone][0]:
            latest[zone] = (stamp, float(record["SpotPrice"]))
    if not latest:
        raise PriceUnavailable(f"EC2 reports no Spot price for {instance_type} in this Region")
    zone = min(latest, key=lambda z: latest[z][1])
    stamp, usd = latest[zone]
    return usd, zone, stamp.isoformat()


def capacity_block_from_offerings(ec2: Any, instance_type: str) -> tuple[float, str]:
    """The cheapest one-instance, one-day Capacity Block: its upfront fee per instance-hour, and its id."""
    page = ec2.describe_capacity_block_offerings(
        InstanceType=instance_type, InstanceCount=1, CapacityDurationHours=CAPACITY_BLOCK_PROBE_HOURS
    )
    rates = []
    for offering in page.get("CapacityBlockOfferings", []):
        if offering.get("CurrencyCode", "USD") != "USD":
            continue
        hours = offering["CapacityBlockDurationHours"] + offering.get("CapacityBlockDurationMinutes", 0) / 60
        rate = float(offering["UpfrontFee"]) / (hours * offering["InstanceCount"])
        rates.append((rate, offering["CapacityBlockOfferingId"]))
    if not rates:
        raise PriceUnavailable(f"EC2 offers no Capacity Block of {instance_type} for one day in this Region")
    return min(rates)


def snapshot_price(instance_type: str, region: str, option: PurchaseOption, why: str) -> Price:
    """The checked-in price (trainer/cost/prices.json), its source saying it is a snapshot and why."""
    snapshot = json.loads(SNAPSHOT.read_text())
    section = snapshot["on-demand" if option == "reservation" else option] if option != "spot" else None
    if section is None:
        raise PriceUnavailable(
            f"no Spot price for {instance_type} in {region} ({why}): Spot prices change every few minutes "
            "and the snapshot keeps none; run with AWS credentials"
        )
    usd = section["usd_per_hour"].get(region, {}).get(instance_type)
    if usd is None:
        known = sorted(f"{r}: {', '.join(sorted(types))}" for r, types in section["usd_per_hour"].items())
        raise PriceUnavailable(
            f"no {option} price for {instance_type} in {region} ({why}); the snapshot has {'; '.join(known)}. "
            "Run with AWS credentials, or give the price (plan --price-per-hour)"
        )
    source = f"snapshot {snapshot['snapshot_date']} ({why}): {section['source']}"
    if option == "reservation":
        source += "; an On-Demand Capacity Reservation is billed at the On-Demand rate"
    return Price(instance_type, region, option, float(usd), source, section["as_of"])


def endpoint_price(instance_type: str, region: str) -> Price:
    """One SageMaker real-time inference instance-hour (the inference pool, docs/serving-stack.md), from the
    snapshot only: SageMaker's prices are not looked up live yet."""
    snapshot = json.loads(SNAPSHOT.read_text())
    section = snapshot["sagemaker-hosting"]
    usd = section["usd_per_hour"].get(region, {}).get(instance_type)
    if usd is None:
        known = sorted(f"{r}: {', '.join(sorted(types))}" for r, types in section["usd_per_hour"].items())
        raise PriceUnavailable(
            f"no SageMaker real-time inference price for {instance_type} in {region}; the snapshot has "
            f"{'; '.join(known)}"
        )
    source = f"snapshot {snapshot['snapshot_date']}: {section['source']}"
    return Price(instance_type, region, "on-demand", float(usd), source, section["as_of"])


HOURS_PER_MONTH = 730  # AWS's pricing pages' month (8,760 hours / 12)


def pool_cost(instance_type: str, region: str, low: int, high: int, now: int | None = None) -> str:
    """The inference pool's dollars: per hour and per month between its minimum and maximum instances (and now,
    given the instances in service), with the price's source; what `plan --stack` and `make status` print."""
    try:
        price = endpoint_price(instance_type, region)
    except PriceUnavailable as error:
        return f"{low}..{high} x {instance_type}: {error}"
    rate = price.usd_per_hour
    current = f"${now * rate:,.2f}/hour now ({now} in service); " if now is not None else ""
    return (
        f"{low}..{high} x {instance_type} at ${rate:,.2f}/hour each: {current}${low * rate:,.2f}-${high * rate:,.2f}"
        f"/hour, ${low * rate * HOURS_PER_MONTH:,.0f}-${high * rate * HOURS_PER_MONTH:,.0f}/month "
        f"({price.source}, as of {price.as_of})"
    )


def transfer_rates() -> tuple[dict[str, float], str]:
    """AWS's published per-GB data-transfer rates the plan prices (USD per GB), and their source and date."""
    section = json.loads(SNAPSHOT.read_text())["data-transfer"]
    return dict(section["usd_per_gb"]), f"{section['source']}, as of {section['as_of']}"


def capacity_block_hours(hours: float) -> float:
    """The hours a Capacity Block covering `hours` of training is billed for: whole days up to 14, then weeks."""
    days = math.ceil(hours / 24)
    if days > CAPACITY_BLOCK_DAYS_DAILY:
        days = 7 * math.ceil(days / 7)
    return days * 24.0
