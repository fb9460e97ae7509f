"""The instance catalog: one table of facts per GPU instance type.

The launch template (EFA layout), the Batch job definition (vCPUs, memory, GPUs, uverbs devices), the stack
config validation, the trainer's MFU and the planner all read this table; nothing else keeps its own copy.
EFA and network-card counts match EC2 `describe-instance-types` (`EfaInfo.MaximumEfaInterfaces`,
`MaximumNetworkCards`); tests check them against the data that moto ships. Peak FLOP/s are NVIDIA's dense
(no sparsity) bf16 tensor-core figures for the SXM parts, and the dense FP8 ones (half the datasheets' "with
sparsity" figures): NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: FP8 3,958 TFLOPS with sparsity), NVIDIA
H200 Tensor Core GPU datasheet (H200 SXM: FP8 3,958 TFLOPS with sparsity), NVIDIA HGX B200 datasheet (per B200:
FP8/FP6 9 PFLOPS with sparsity). A100 and A10G have no FP8 tensor cores (0). MXFP8 (one scale per 32 values)
needs Blackwell, SM 10.0 (TransformerEngine docs, features/low_precision_training/mxfp8).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# TransformerEngine's FP8 recipes, as config fp8.recipe names them.
FP8Recipe = Literal["delayed", "tensorwise", "mxfp8"]


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpu_model: str
    gpus: int
    gpu_memory_gib: int  # per GPU
    vcpus: int
    memory_gib: int
    network_cards: int
    efa_interfaces: int  # EfaInfo.MaximumEfaInterfaces; 0 = no EFA
    network_gbps: int  # aggregate EFA/ENA bandwidth per instance
    peak_bf16_tflops_per_gpu: float  # dense
    nvlink_gbytes_per_s: float  # per GPU, one direction, through NVSwitch
    peak_fp8_tflops_per_gpu: float = 0.0  # dense; 0: no FP8 tensor cores
    # The TransformerEngine FP8 recipes (config fp8.recipe) the GPU runs.
    fp8_recipes: tuple[FP8Recipe, ...] = ()

    @property
    def has_efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def bus_bandwidth_floor(self) -> BusBandwidthFloor | None:
        """The preflight's all-reduce floor across nodes (EFA types only)."""
        return BUS_BANDWIDTH_FLOORS.get(self.name)

    @property
    def uverbs_devices(self) -> list[str]:
        """The /dev/infiniband/uverbsN device nodes an EFA instance exposes, one per EFA interface."""
        return [f"/dev/infiniband/uverbs{i}" for i in range(self.efa_interfaces)]


# Per-tensor scaling: current (tensorwise) or from an amax history.
HOPPER_FP8: tuple[FP8Recipe, ...] = ("tensorwise", "delayed")
# The first is the planner's choice for the GPU.
BLACKWELL_FP8: tuple[FP8Recipe, ...] = ("mxfp8", "tensorwise", "delayed")

INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in (
        InstanceType("p4d.24xlarge", "A100", 8, 40, 96, 1152, 4, 4, 400, 312.0, 300.0),
        InstanceType("p4de.24xlarge", "A100", 8, 80, 96, 1152, 4, 4, 400, 312.0, 300.0),
        InstanceType("p5.48xlarge", "H100", 8, 80, 192, 2048, 32, 32, 3200, 989.0, 450.0, 1979.0, HOPPER_FP8),
        InstanceType(
            "p5e.48xlarge", "H200", 8, 141, 192, 2048, 32, 32, 3200, 989.0, 450.0, 1979.0, HOPPER_FP8
        ),
        InstanceType(
            "p5en.48xlarge", "H200", 8, 141, 192, 2048, 16, 16, 3200, 989.0, 450.0, 1979.0, HOPPER_FP8
        ),
        InstanceType(
            "p6-b200.48xlarge", "B200", 8, 179, 192, 2048, 8, 8, 3200, 2250.0, 900.0, 4500.0, BLACKWELL_FP8
        ),
        # GPU types without EFA, listed so that choosing one for the cluster gets a precise error.
        InstanceType("g5.xlarge", "A10G", 1, 22, 4, 16, 1, 0, 10, 70.0, 0.0),
        InstanceType("g5.2xlarge", "A10G", 1, 22, 8, 32, 1, 0, 10, 70.0, 0.0),
    )
}

# The preflight times an all-reduce of this many bytes on GPUs (trainer/preflight/command.py) and compares its
# nccl-tests bus bandwidth with the floor below, which is taken at the same message size.
ALLREDUCE_MESSAGE_BYTES = 256 * 2**20
# A floor is this fraction of the lowest published 2-node nccl-tests all_reduce_perf bus bandwidth at that size:
# published runs differ by software versions (NCCL, aws-ofi-nccl, EFA installer), so the lowest one is what a
# healthy cluster has been shown to reach, and the margin absorbs the preflight's short timing.
FLOOR_FRACTION = 0.75
NCCL_TESTS_README = "awslabs/awsome-distributed-training micro-benchmarks/nccl-tests/README.md"
NCCL_TESTS_BATCH_README = (
    "awslabs/awsome-distributed-training micro-benchmarks/nccl-tests/aws-batch/README.md"
)


@dataclass(frozen=True)
class BusBandwidthFloor:
    floor_gbps: float  # nccl-tests busbw, GB/s, of an ALLREDUCE_MESSAGE_BYTES all-reduce across >= 2 nodes
    published_gbps: tuple[
        float, ...
    ]  # the published 2-node figures it derives from, at ALLREDUCE_MESSAGE_BYTES
    source: str


def _floor(published: tuple[float, ...], source: str) -> BusBandwidthFloor:
    return BusBandwidthFloor(round(FLOOR_FRACTION * min(published), 1), published, source)


# p4de and p5: published figures (tests/fixtures/nccl_tests_allreduce_published.json holds the rows). No published
# figure was found for p4d, p5e, p5en or p6-b200: each takes the floor of the published type with the same EFA
# bandwidth per instance (network_gbps, checked against describe-instance-types' NetworkPerformance), which is
# conservative where the newer GPUs and NVLink only raise the bus bandwidth.
_P4DE = _floor((69.89,), f"{NCCL_TESTS_README}: 2x p4de.24xlarge")
_P5 = _floor(
    (342.81, 167.17, 418.91),
    f"{NCCL_TESTS_README}: 2x p5.48xlarge (Slurm; EKS with EFA installer 1.28.0); {NCCL_TESTS_BATCH_README}: p5",
)


def _borrowed(published: str, floor: BusBandwidthFloor) -> BusBandwidthFloor:
    return BusBandwidthFloor(floor.floor_gbps, (), f"none published; {published}'s floor ({floor.source})")


BUS_BANDWIDTH_FLOORS: dict[str, BusBandwidthFloor] = {
    "p4d.24xlarge": _borrowed("p4de.24xlarge", _P4DE),
    "p4de.24xlarge": _P4DE,
    "p5.48xlarge": _P5,
    "p5e.48xlarge": _borrowed("p5.48xlarge", _P5),
    "p5en.48xlarge": _borrowed("p5.48xlarge", _P5),
    "p6-b200.48xlarge": _borrowed("p5.48xlarge", _P5),
}

EFA_INSTANCE_TYPES: tuple[str, ...] = tuple(name for name, t in INSTANCE_TYPES.items() if t.has_efa)

# Peak dense bf16 TFLOP/s by GPU model, for MFU when the trainer runs outside a known instance type.
PEAK_BF16_TFLOPS_BY_GPU: dict[str, float] = {
    t.gpu_model: t.peak_bf16_tflops_per_gpu for t in INSTANCE_TYPES.values()
}


def instance_type(name: str) -> InstanceType:
    """Look up an instance type, or raise a KeyError that lists the known ones."""
    try:
        return INSTANCE_TYPES[name]
    except KeyError:
        raise KeyError(
            f"unknown instance type {name!r}; known types: {', '.join(sorted(INSTANCE_TYPES))}"
        ) from None
