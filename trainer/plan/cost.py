"""A plan's dollars: each purchase option's price for the run's node-hours, cost per million tokens, the cheapest
option that meets a deadline, the data transfer the run implies, and its energy and emissions (estimates)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trainer.contract.catalog import InstanceType
from trainer.cost.energy import GRID_KG_CO2E_PER_KWH, emissions_kg, energy_kwh
from trainer.cost.pricing import (
    CAPACITY_BLOCK_MAX_INSTANCES,
    PURCHASE_OPTIONS,
    Price,
    PriceUnavailable,
    PurchaseOption,
    capacity_block_hours,
    hourly_price,
    transfer_rates,
)
from trainer.data.indexed import token_dtype

GIVEN = "given"  # the option label of a price typed with --price-per-hour
PriceLookup = Callable[[str, str, PurchaseOption], Price]


@dataclass(frozen=True)
class OptionCost:
    """One purchase option for a run: what it costs, or why it cannot carry the run."""

    instance_type: str
    option: str  # a PurchaseOption, or GIVEN
    nodes: int
    hours: float  # wall-clock hours to train the tokens
    tokens: float
    price: Price | None
    problem: str | None = None  # why this option cannot carry the run (no price, not allowed)

    @property
    def billed_hours(self) -> float:
        """Hours paid per node: a Capacity Block is bought in whole days (then weeks), the rest by the second."""
        return capacity_block_hours(self.hours) if self.option == "capacity-block" else self.hours

    @property
    def dollars(self) -> float | None:
        if self.price is None or self.problem:
            return None
        return self.billed_hours * self.nodes * self.price.usd_per_hour

    @property
    def usd_per_million_tokens(self) -> float | None:
        dollars = self.dollars
        return None if dollars is None else dollars / (self.tokens / 1e6)

    def meets(self, deadline_hours: float | None) -> bool:
        return self.dollars is not None and (deadline_hours is None or self.hours <= deadline_hours)


def _not_allowed(option: str, nodes: int) -> str | None:
    # AWS Batch user guide batch/latest/userguide/mnp-ce.html: MNP jobs aren't supported on Spot environments.
    if option == "spot" and nodes > 1:
        return "Batch multi-node parallel jobs do not run on Spot"
    if option == "capacity-block" and nodes > CAPACITY_BLOCK_MAX_INSTANCES:
        return f"a Capacity Block holds at most {CAPACITY_BLOCK_MAX_INSTANCES} instances"
    return None


def purchase_options(
    instance: InstanceType,
    nodes: int,
    tokens: float,
    tokens_per_s: float,
    region: str,
    price_per_hour: float | None = None,
    lookup: PriceLookup = hourly_price,
) -> list[OptionCost]:
    """Every purchase option for `tokens` at `tokens_per_s` on `nodes` x `instance` in `region`; with
    `price_per_hour` only that price (a local or negotiated rate)."""
    hours = tokens / tokens_per_s / 3600
    if price_per_hour is not None:
        given = Price(instance.name, region, "on-demand", price_per_hour, "given: --price-per-hour", "")
        return [OptionCost(instance.name, GIVEN, nodes, hours, tokens, given)]
    costs = []
    for option in PURCHASE_OPTIONS:
        try:
            price: Price | None = lookup(instance.name, region, option)
            problem = _not_allowed(option, nodes)
        except PriceUnavailable as error:
            price, problem = None, str(error)
        costs.append(OptionCost(instance.name, option, nodes, hours, tokens, price, problem))
    return costs


def cheapest(costs: list[OptionCost], deadline_hours: float | None = None) -> OptionCost | None:
    """The cheapest option that can carry the run and finishes by the deadline (None: none does)."""
    meeting = [c for c in costs if c.meets(deadline_hours)]
    return min(meeting, key=lambda c: c.dollars or 0.0) if meeting else None


@dataclass(frozen=True)
class TransferCost:
    path: str
    gigabytes: float
    usd_per_gb: float
    applies: bool  # whether this stack's layout moves the data this way

    @property
    def dollars(self) -> float:
        return self.gigabytes * self.usd_per_gb


# What each priced path means for the stack (infra/: one Region, S3 gateway endpoint, FSx and the nodes in one AZ).
TRANSFER_PATHS = {
    "s3-to-fsx-same-region": ("S3 -> FSx, same Region (FSx imports the dataset once)", True),
    "cross-az": ("the same bytes across Availability Zones (FSx in another AZ than the nodes)", False),
    "nat-gateway": ("the same bytes through a NAT gateway (no S3 gateway endpoint)", False),
    "inter-region": ("the same bytes from a bucket in another Region", False),
}


def dataset_gigabytes(tokens: float, vocab_size: int) -> float:
    """Bytes of the tokenized dataset the run reads: megatron's indexed-dataset token width for the vocabulary."""
    return tokens * np.dtype(token_dtype(vocab_size)).itemsize / 1e9


def transfer_costs(gigabytes: float) -> tuple[list[TransferCost], str]:
    """The run's dataset priced along each path AWS bills per GB, and the rates' source."""
    rates, source = transfer_rates()
    costs = [
        TransferCost(label, gigabytes, rates[key], applies)
        for key, (label, applies) in TRANSFER_PATHS.items()
    ]
    return costs, source


@dataclass(frozen=True)
class EnergyEstimate:
    kwh: float
    kg_co2e: float | None  # None: the Region is not in the intensity table


def energy_estimate(instance: InstanceType, nodes: int, hours: float, region: str) -> EnergyEstimate:
    kwh = energy_kwh(instance.name, nodes * hours)
    return EnergyEstimate(kwh, emissions_kg(kwh, region) if region in GRID_KG_CO2E_PER_KWH else None)
