"""What a stack costs on GPUs while no job runs, and the most a job's node start-up costs (estimates from the stack
file and the price lookup; the planner prints them with --stack).

- Batch: the GPU compute environment's minimum is 0 vCPUs (infra/cluster.py), so an idle stack holds no GPU node.
- EKS on demand: Karpenter starts GPU nodes only for admitted jobs and removes them once empty (infra/karpenter.py);
  an idle stack holds none. A job's nodes are billed from launch, and Kueue evicts a job whose pods are not all
  ready within its waitForPodsReady timeout (trainer/contract/gpu_nodes.py), so one attempt's start-up costs at
  most nodes x that timeout.
- An On-Demand Capacity Reservation is billed at the On-Demand rate whether instances run in it or not (EC2 User
  Guide, "Capacity Reservation pricing and billing"), and a Capacity Block is paid for its whole window up front
  (EC2 User Guide, "Capacity Blocks for ML": the price is paid up front at purchase): the stack's nodes cost the same idle as busy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainer.contract.gpu_nodes import PODS_READY_TIMEOUT_MINUTES
from trainer.contract.stack import StackCapacity
from trainer.cost.pricing import Price, PriceUnavailable, PurchaseOption, hourly_price

PriceLookup = Callable[[str, str, PurchaseOption], Price]


@dataclass(frozen=True)
class IdleCost:
    """GPU nodes an idle stack pays for, per hour, and why."""

    nodes: int
    usd_per_hour: float | None  # None: no price for the nodes it holds
    why: str


@dataclass(frozen=True)
class StartupCost:
    """The most one attempt of a job pays for its nodes before they are all ready."""

    minutes: int
    usd: float | None
    why: str


def idle_cost(capacity: StackCapacity, region: str, lookup: PriceLookup = hourly_price) -> IdleCost:
    if capacity.capacity_block or capacity.capacity_reservation:
        option: PurchaseOption = "capacity-block" if capacity.capacity_block else "reservation"
        try:
            rate: float | None = lookup(capacity.instance_type, region, option).usd_per_hour * capacity.nodes
        except PriceUnavailable:
            rate = None
        kind = (
            "a Capacity Block is paid for its window"
            if capacity.capacity_block
            else ("an On-Demand Capacity Reservation is billed whether used or not")
        )
        return IdleCost(capacity.nodes, rate, f"{kind}: its {capacity.nodes} nodes cost the same idle")
    if capacity.orchestrator == "eks":
        return IdleCost(
            0, 0.0, "Karpenter starts GPU nodes only for admitted jobs and removes them once empty"
        )
    return IdleCost(0, 0.0, "the GPU compute environment scales to 0 vCPUs when no job runs")


def startup_cost(
    capacity: StackCapacity, nodes: int, region: str, lookup: PriceLookup = hourly_price
) -> StartupCost | None:
    """On an EKS stack whose nodes Karpenter starts per job: the bound Kueue's waitForPodsReady sets; else None
    (reserved nodes are paid anyway; Batch's start-up is not bounded by the stack)."""
    if capacity.orchestrator != "eks" or capacity.capacity_block or capacity.capacity_reservation:
        return None
    try:
        hourly = lookup(capacity.instance_type, region, "on-demand").usd_per_hour
        usd: float | None = hourly * nodes * PODS_READY_TIMEOUT_MINUTES / 60
    except PriceUnavailable:
        usd = None
    return StartupCost(
        PODS_READY_TIMEOUT_MINUTES,
        usd,
        "nodes are billed from launch; Kueue evicts a job whose pods are not all ready by then",
    )
