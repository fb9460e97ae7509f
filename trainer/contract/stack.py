"""Which cluster a stack describes, read from its checked-in `Pulumi.<env>.yaml`: the part of a stack's config
that the trainer's tools (the planner's --stack, the JobSet's grace and timeout) need without Pulumi. infra/config.py
validates the whole file, reading it through read_stack_file and taking its defaults for these keys from here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "trainstack"
DEFAULT_INSTANCE_TYPE = "p5.48xlarge"
DEFAULT_NODE_COUNT = 1
# A hung job must not hold the nodes forever; a longer run resubmits and resumes from its newest checkpoint.
DEFAULT_JOB_TIMEOUT_HOURS = 72
# FSx for Lustre SSD: capacity of 1.2 TiB, or a multiple of 2.4 TiB (Amazon FSx for Lustre User Guide, "Storage
# capacity"); PERSISTENT_2's throughput tiers in MB/s per TiB, and SCRATCH_2's baseline (the same guide, "Performance
# characteristics of SSD and HDD storage classes", docs.aws.amazon.com/fsx/latest/LustreGuide/ssd-storage.html).
DEFAULT_FSX_DEPLOYMENT_TYPE: Literal["SCRATCH_2", "PERSISTENT_2"] = "SCRATCH_2"
FSX_FIRST_STEP_GIB, FSX_STEP_GIB = 1200, 2400
FSX_PERSISTENT_2_THROUGHPUTS = (125, 250, 500, 1000)
DEFAULT_FSX_PERSISTENT_2_MB_S_PER_TIB = 250  # the tier a PERSISTENT_2 stack gets when its file names none
FSX_SCRATCH_2_MB_S_PER_TIB = 200


class StackFileError(ValueError):
    """No such stack file."""


def stack_names(root: Path = ROOT) -> list[str]:
    """The stacks checked in as `Pulumi.<stack>.yaml`."""
    return sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in root.glob("Pulumi.*.yaml"))


def read_stack_file(stack: str, root: Path = ROOT) -> dict[str, Any]:
    """The `config:` mapping of `Pulumi.<stack>.yaml`, unvalidated."""
    path = root / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        known = ", ".join(stack_names(root)) or "none"
        raise StackFileError(f"no stack file {path.name} in {root}; stacks: {known}")
    document = yaml.safe_load(path.read_text()) or {}
    return dict(document.get("config") or {})


def stack_job_limits(stack: str, stop_grace_default: int, root: Path = ROOT) -> tuple[int, int]:
    """The stack's `trainstack:stopGraceSeconds` and `trainstack:jobTimeoutHours` (its defaults where left out)."""
    values = read_stack_file(stack, root)
    return (
        int(values.get(f"{NAMESPACE}:stopGraceSeconds", stop_grace_default)),
        int(values.get(f"{NAMESPACE}:jobTimeoutHours", DEFAULT_JOB_TIMEOUT_HOURS)),
    )


def stack_cluster(stack: str, root: Path = ROOT) -> tuple[str, int]:
    """The stack's instance type and node count (the stack's own defaults where its file leaves them out)."""
    values = read_stack_file(stack, root)
    return (
        str(values.get(f"{NAMESPACE}:instanceType", DEFAULT_INSTANCE_TYPE)),
        int(values.get(f"{NAMESPACE}:nodeCount", DEFAULT_NODE_COUNT)),
    )


@dataclass(frozen=True)
class StackStorage:
    """A stack's FSx for Lustre file system: deployment type, capacity and throughput tier."""

    deployment_type: str  # SCRATCH_2 | PERSISTENT_2
    capacity_gib: int
    mb_s_per_tib: int  # the tier for PERSISTENT_2, the baseline for SCRATCH_2

    @property
    def bytes_per_s(self) -> float:
        return self.capacity_gib / 1024 * self.mb_s_per_tib * 1e6


def stack_storage(stack: str, root: Path = ROOT) -> StackStorage:
    """The stack file's FSx keys (the stack's defaults where its file leaves them out)."""
    values = read_stack_file(stack, root)
    kind = str(values.get(f"{NAMESPACE}:fsxDeploymentType", DEFAULT_FSX_DEPLOYMENT_TYPE))
    per_tib = FSX_SCRATCH_2_MB_S_PER_TIB
    if kind == "PERSISTENT_2":
        per_tib = int(values.get(f"{NAMESPACE}:fsxThroughputPerTib", DEFAULT_FSX_PERSISTENT_2_MB_S_PER_TIB))
    return StackStorage(
        kind, int(values.get(f"{NAMESPACE}:fsxStorageCapacityGib", FSX_FIRST_STEP_GIB)), per_tib
    )


@dataclass(frozen=True)
class StackCapacity:
    """How a stack holds its GPU nodes: the orchestrator, and whether a reservation or Capacity Block backs them."""

    orchestrator: str  # batch | eks
    instance_type: str
    nodes: int
    capacity_reservation: bool
    capacity_block: bool


def stack_capacity(stack: str, root: Path = ROOT) -> StackCapacity:
    """The stack file's GPU capacity keys (the stack's defaults where its file leaves them out)."""
    values = read_stack_file(stack, root)
    instance, nodes = stack_cluster(stack, root)
    return StackCapacity(
        orchestrator=str(values.get(f"{NAMESPACE}:orchestrator", "batch")),
        instance_type=instance,
        nodes=nodes,
        capacity_reservation=bool(values.get(f"{NAMESPACE}:capacityReservationId")),
        capacity_block=bool(values.get(f"{NAMESPACE}:capacityBlock", False)),
    )
