"""What a pod spec cannot express, checked in the pod: RLIMIT_MEMLOCK unlimited for EFA, and every uverbs device
in the container bound to the kernel's efa driver (sysfs laid out as Linux's
Documentation/ABI/stable/sysfs-class-infiniband describes: /sys/class/infiniband_verbs/uverbsN/device/driver)."""

import resource
from pathlib import Path

from trainer.contract.catalog import instance_type
from trainer.preflight.checks import FAILED, OK, SKIPPED
from trainer.preflight.pod import check_memlock, check_rdma_devices, read_memlock

P5 = instance_type("p5.48xlarge")
UNLIMITED = resource.RLIM_INFINITY


def node(tmp_path: Path, drivers: dict[str, str | None]) -> tuple[Path, Path]:
    """A /dev/infiniband with the given uverbs devices and a sysfs whose device links name their drivers."""
    dev, sysfs = tmp_path / "dev" / "infiniband", tmp_path / "sys" / "class" / "infiniband_verbs"
    dev.mkdir(parents=True)
    for uverbs, driver in drivers.items():
        (dev / uverbs).touch()
        pci = tmp_path / "sys" / "devices" / f"pci-{uverbs}"
        pci.mkdir(parents=True)
        if driver:
            (tmp_path / "sys" / "bus" / "pci" / "drivers" / driver).mkdir(parents=True, exist_ok=True)
            (pci / "driver").symlink_to(tmp_path / "sys" / "bus" / "pci" / "drivers" / driver)
        (sysfs / uverbs).mkdir(parents=True)
        (sysfs / uverbs / "device").symlink_to(pci)
    return dev, sysfs


def test_unlimited_memlock_passes_and_a_container_default_fails_as_a_node_fault():
    assert check_memlock(P5, (UNLIMITED, UNLIMITED)).status == OK
    low = check_memlock(P5, (8 * 2**20, 8 * 2**20))
    assert low.status == FAILED and low.node_fault
    assert "RLIMIT_MEMLOCK is 8388608 bytes (hard 8388608)" in low.detail
    assert check_memlock(None, (0, 0)).status == SKIPPED
    soft, hard = read_memlock()  # this process's own limit, read the same way the preflight reads it
    assert isinstance(soft, int) and isinstance(hard, int)


def test_only_efa_devices_pass(tmp_path):
    dev, sysfs = node(tmp_path, {f"uverbs{i}": "efa" for i in range(32)})
    check = check_rdma_devices(P5, dev, sysfs)
    assert check.status == OK, check.detail


def test_a_mellanox_device_beside_the_efa_ones_fails_the_node(tmp_path):
    dev, sysfs = node(tmp_path, {"uverbs0": "efa", "uverbs1": "mlx5_core"})
    check = check_rdma_devices(P5, dev, sysfs)
    assert check.status == FAILED and check.node_fault
    assert f"{dev}/uverbs1 (mlx5_core)" in check.detail


def test_a_device_sysfs_cannot_name_fails_without_quarantining_the_node(tmp_path):
    dev, sysfs = node(tmp_path, {"uverbs0": "efa", "uverbs1": None})
    check = check_rdma_devices(P5, dev, sysfs)
    assert check.status == FAILED and not check.node_fault
    assert "uverbs1 (driver unknown)" in check.detail


def test_not_an_efa_node_is_skipped(tmp_path):
    assert check_rdma_devices(None, tmp_path, tmp_path).status == SKIPPED
