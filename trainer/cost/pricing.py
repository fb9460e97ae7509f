"""Instance prices from AWS, not from memory: On-Demand from the AWS Price List API, Spot from EC2's price
history, Capacity Blocks from EC2's offerings; a checked-in snapshot (dated, with its source) when there are no
credentials. `hourly_price` is what the planner and the ledger call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PurchaseOption = Literal["on-demand", "spot", "capacity-block", "reservation"]
PURCHASE_OPTIONS: tuple[PurchaseOption, ...] = ("on-demand", "spot", "capacity-block", "reservation")


@dataclass(frozen=True)
class Price:
    instance_type: str
    region: str
    option: PurchaseOption
    usd_per_hour: float  # one instance for one hour
    source: str  # "live: AWS Price List API ..." or "snapshot 2026-12-04: <source>"
    as_of: str  # ISO date (or timestamp) the price was read or published


def hourly_price(instance_type: str, region: str, option: PurchaseOption) -> Price:
    """One instance-hour of `instance_type` in `region` bought as `option`: live from AWS when credentials are
    present, else from the checked-in snapshot (its source says which)."""
    raise NotImplementedError("filled in by the pricing lookups below")
