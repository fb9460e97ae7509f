"""The instance catalog agrees with EC2's describe-instance-types data (as shipped by moto)."""

import boto3
import pytest
from moto import mock_aws

from trainer.contract.catalog import EFA_INSTANCE_TYPES, INSTANCE_TYPES, instance_type

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
