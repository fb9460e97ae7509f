"""Energy and emissions of GPU-hours, as estimates: a node's published maximum power, the data centre's PUE, and a
dated grid-intensity table by Region. What AWS measures for an account is in its Customer Carbon Footprint Tool,
not here. docs/cost.md lists the sources and what the numbers leave out.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.contract.catalog import instance_type as catalog_instance_type

ESTIMATE_LABEL = "estimate"

# Per-GPU maximum board power (TDP), W: NVIDIA A100 Tensor Core GPU datasheet (SXM 400 W), H100 Tensor Core GPU
# datasheet (SXM up to 700 W), H200 Tensor Core GPU datasheet (SXM up to 700 W), HGX B200 datasheet (1,000 W),
# A10 Tensor Core GPU datasheet (150 W, the A10G's part).
GPU_POWER_W: dict[str, float] = {"A100": 400.0, "H100": 700.0, "H200": 700.0, "B200": 1000.0, "A10G": 150.0}


@dataclass(frozen=True)
class NodePower:
    kilowatts: float  # maximum input power of a whole 8-GPU server (GPUs, CPUs, memory, NICs, fans)
    source: str


# AWS publishes no server power; NVIDIA's DGX with the same eight GPUs is the nearest published whole-node figure.
_DGX_A100 = NodePower(6.5, "NVIDIA DGX A100 datasheet: system power usage 6.5 kW max")
_DGX_H100 = NodePower(10.2, "NVIDIA DGX H100/H200 User Guide, power specifications: 10.2 kW max")
_DGX_B200 = NodePower(
    14.3,
    "NVIDIA DGX B200 User Guide (dgx/dgxb200-user-guide/introduction-to-dgxb200.html), power: 14.3 kW max",
)
NODE_POWER: dict[str, NodePower] = {
    "p4d.24xlarge": _DGX_A100,
    "p4de.24xlarge": _DGX_A100,
    "p5.48xlarge": _DGX_H100,
    "p5e.48xlarge": _DGX_H100,
    "p5en.48xlarge": _DGX_H100,
    "p6-b200.48xlarge": _DGX_B200,
}

# Power usage effectiveness of AWS data centres as Cloud Carbon Footprint uses it (cloud-carbon-footprint
# release-2024-02-11, packages/aws/src/domain/AwsFootprintEstimationConstants.ts PUE_AVG).
PUE = 1.135
PUE_SOURCE = "cloud-carbon-footprint release-2024-02-11 AwsFootprintEstimationConstants.ts (PUE_AVG 1.135)"

# kg CO2e per kWh by Region: Cloud Carbon Footprint release-2024-02-11, AwsFootprintEstimationConstants.ts
# AWS_EMISSIONS_FACTORS_METRIC_TON_PER_KWH (US Regions: EPA eGRID NERC-region factors from
# packages/core/src/FootprintEstimationConstants.ts; others: carbonfootprint.com national factors), x 1000.
GRID_INTENSITY_DATE = "2024-02-11"
GRID_INTENSITY_SOURCE = (
    "cloud-carbon-footprint release-2024-02-11 AWS_EMISSIONS_FACTORS_METRIC_TON_PER_KWH (location-based; US "
    "Regions from EPA eGRID by NERC region)"
)
GRID_KG_CO2E_PER_KWH: dict[str, float] = {
    "us-east-1": 0.379069,
    "us-east-2": 0.410608,
    "us-west-1": 0.322167,
    "us-west-2": 0.322167,
    "ca-central-1": 0.12,
    "eu-central-1": 0.311,
    "eu-west-1": 0.2786,
    "eu-west-2": 0.225,
    "eu-west-3": 0.0511,
    "eu-north-1": 0.0088,
    "ap-northeast-1": 0.4658,
    "ap-northeast-2": 0.4156,
    "ap-southeast-1": 0.408,
    "ap-southeast-2": 0.76,
    "ap-south-1": 0.7082,
    "sa-east-1": 0.0617,
}


def node_kilowatts(instance_type: str) -> float:
    """A node's power: the whole-server figure where one is published, else its GPUs' board power alone."""
    if instance_type in NODE_POWER:
        return NODE_POWER[instance_type].kilowatts
    kind = catalog_instance_type(instance_type)  # KeyError naming the known types
    return kind.gpus * GPU_POWER_W[kind.gpu_model] / 1000


def energy_kwh(instance_type: str, hours: float) -> float:
    """Facility energy of `hours` instance-hours at the node's maximum power, PUE included (an upper estimate)."""
    if hours < 0:
        raise ValueError(f"hours {hours}: give zero or more instance-hours")
    return node_kilowatts(instance_type) * hours * PUE


def emissions_kg(kwh: float, region: str) -> float:
    """kg CO2e of `kwh` drawn from `region`'s grid (location-based, the table's dated annual average)."""
    try:
        intensity = GRID_KG_CO2E_PER_KWH[region]
    except KeyError:
        raise KeyError(
            f"no grid intensity for Region {region!r}; the table ({GRID_INTENSITY_SOURCE}) has "
            f"{', '.join(sorted(GRID_KG_CO2E_PER_KWH))}"
        ) from None
    return kwh * intensity
