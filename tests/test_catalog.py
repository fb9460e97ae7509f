"""The instance catalog agrees with EC2's describe-instance-types data (as shipped by moto), and its all-reduce
floors with the published nccl-tests rows (fixture copied from awslabs/awsome-distributed-training)."""

import json
import re
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from trainer.contract.catalog import (
    ALLREDUCE_MESSAGE_BYTES,
    EFA_INSTANCE_TYPES,
    FLOOR_FRACTION,
    INSTANCE_TYPES,
    instance_type,
)

REQUIRED_EFA_TYPES = {
    "p4d.24xlarge",
    "p4de.24xlarge",
    "p5.48xlarge",
    "p5e.48xlarge",
    "p5en.48xlarge",
    "p6-b200.48xlarge",
}


@pytest.fixture(scope="module")
def ec2_instance_types():
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        found = ec2.describe_instance_types(InstanceTypes=sorted(INSTANCE_TYPES))["InstanceTypes"]
    return {t["InstanceType"]: t for t in found}


def test_catalog_covers_every_supported_cluster_type():
    assert set(EFA_INSTANCE_TYPES) >= REQUIRED_EFA_TYPES


@pytest.mark.parametrize("name", sorted(INSTANCE_TYPES))
def test_catalog_matches_describe_instance_types(name, ec2_instance_types):
    ours, aws = INSTANCE_TYPES[name], ec2_instance_types[name]
    network = aws["NetworkInfo"]
    gpu = aws["GpuInfo"]["Gpus"][0]
    assert ours.efa_interfaces == network.get("EfaInfo", {}).get("MaximumEfaInterfaces", 0)
    assert ours.network_cards == network["MaximumNetworkCards"]
    assert ours.vcpus == aws["VCpuInfo"]["DefaultVCpus"]
    assert ours.memory_gib == aws["MemoryInfo"]["SizeInMiB"] // 1024
    assert ours.gpus == gpu["Count"]
    assert ours.gpu_model == gpu["Name"]
    assert ours.gpu_memory_gib == gpu["MemoryInfo"]["SizeInMiB"] // 1024


def test_p5_exposes_32_uverbs_devices():
    assert instance_type("p5.48xlarge").uverbs_devices[-1] == "/dev/infiniband/uverbs31"
    assert len(instance_type("p5.48xlarge").uverbs_devices) == 32


def test_unknown_instance_type_error_lists_known_types():
    with pytest.raises(KeyError, match=r"unknown instance type 'p9.huge'.*p5\.48xlarge"):
        instance_type("p9.huge")


NCCL_TESTS = json.loads(
    (Path(__file__).parent / "fixtures" / "nccl_tests_allreduce_published.json").read_text()
)


def _published_busbw(instance: str) -> list[float]:
    """Out-of-place busbw (GB/s) of the published 2-node all_reduce_perf rows at the preflight's message size."""
    found = []
    for entry in NCCL_TESTS["rows"]:
        fields = entry["row"].split(">:")[-1].removeprefix("0:").split()
        size, busbw = int(fields[0]), float(fields[7])  # size count type redop root time algbw busbw
        if entry["instance_type"] == instance and entry["nodes"] == 2 and size == ALLREDUCE_MESSAGE_BYTES:
            found.append(busbw)
    return found


@pytest.mark.parametrize("name", sorted(EFA_INSTANCE_TYPES))
def test_every_efa_type_has_a_bus_bandwidth_floor_from_published_figures(name, ec2_instance_types):
    floor = instance_type(name).bus_bandwidth_floor
    published = _published_busbw(name)
    if published:
        assert sorted(floor.published_gbps) == sorted(published)
        assert floor.floor_gbps == round(FLOOR_FRACTION * min(published), 1)
    else:
        # No published figure: the floor of a published type with the same EFA bandwidth.
        donor = next(
            t
            for t in EFA_INSTANCE_TYPES
            if _published_busbw(t) and INSTANCE_TYPES[t].network_gbps == INSTANCE_TYPES[name].network_gbps
        )
        assert floor.floor_gbps == instance_type(donor).bus_bandwidth_floor.floor_gbps
        assert floor.source.startswith(f"none published; {donor}'s floor")
    assert instance_type("g5.xlarge").bus_bandwidth_floor is None


@pytest.mark.parametrize("name", sorted(EFA_INSTANCE_TYPES))
def test_network_bandwidth_matches_describe_instance_types(name, ec2_instance_types):
    # NetworkPerformance reads "3200 Gigabit" or "4x 100 Gigabit".
    performance = ec2_instance_types[name]["NetworkInfo"]["NetworkPerformance"]
    count, _, gigabits = re.fullmatch(r"(?:(\d+)x )?(\d+) Gigabit", performance).group(1, 0, 2)
    assert INSTANCE_TYPES[name].network_gbps == int(count or 1) * int(gigabits)
