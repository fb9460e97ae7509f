"""Checks for what a Kubernetes pod spec cannot express, run by the preflight in every pod of a JobSet (and
harmless on Batch, whose job definition sets the same things): each a pure function of what it reads.

memlock      EFA registers (pins) GPU and host buffers with the NIC, so RLIMIT_MEMLOCK must be unlimited; Batch
             sets the ulimit in the job definition, Kubernetes has no field for it and the EKS AL2023 runtime
             spec sets only RLIMIT_NOFILE (awslabs/amazon-eks-ami nodeadm/internal/containerd/base-runtime-spec.json).
rdma devices every /dev/infiniband/uverbsN in the container belongs to the EFA driver: a hostPath or a device
             plugin that hands in other RDMA devices (mlx5, NVLink ibp*) makes libfabric's efa provider fail and
             NCCL fall back to TCP (aws-samples/aws-do-eks#63, aws/sagemaker-hyperpod-cli#282).
"""

from __future__ import annotations

import resource
from pathlib import Path

from trainer.contract.catalog import InstanceType
from trainer.preflight.checks import EFA_DEVICE_DIR, FAILED, OK, SKIPPED, Check

# The kernel's EFA driver name (linux drivers/infiniband/hw/efa/efa.h DRV_MODULE_NAME); each uverbsN's sysfs
# device links to its driver (Documentation/ABI/stable/sysfs-class-infiniband: /sys/class/infiniband_verbs/uverbsN).
EFA_DRIVER = "efa"
VERBS_SYSFS = Path("/sys/class/infiniband_verbs")


def read_memlock() -> tuple[int, int]:
    return resource.getrlimit(resource.RLIMIT_MEMLOCK)


def check_memlock(instance: InstanceType | None, limits: tuple[int, int]) -> Check:
    if instance is None or not instance.has_efa:
        return Check("memlock", SKIPPED, "not an EFA node: nothing is registered with a NIC")
    soft, hard = limits
    if soft != resource.RLIM_INFINITY:
        shown = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
        return Check(
            "memlock",
            FAILED,
            f"RLIMIT_MEMLOCK is {soft} bytes (hard {shown}); EFA pins GPU and host buffers and needs it "
            "unlimited: on Batch the job definition's ulimits, on EKS the node's containerd (LimitMEMLOCK)",
            node_fault=True,
        )
    return Check("memlock", OK, "RLIMIT_MEMLOCK unlimited")


def device_driver(uverbs: str, sysfs: Path = VERBS_SYSFS) -> str | None:
    """The kernel driver behind /dev/infiniband/<uverbs>, or None when sysfs does not say."""
    link = sysfs / uverbs / "device" / "driver"
    try:
        return link.resolve(strict=True).name
    except OSError:
        return None


def check_rdma_devices(
    instance: InstanceType | None, device_dir: Path = EFA_DEVICE_DIR, sysfs: Path = VERBS_SYSFS
) -> Check:
    if instance is None or not instance.has_efa:
        return Check("rdma devices", SKIPPED, "not an EFA node")
    drivers = {device: device_driver(device.name, sysfs) for device in sorted(device_dir.glob("uverbs*"))}
    others = [
        f"{device} ({driver or 'driver unknown'})"
        for device, driver in drivers.items()
        if driver != EFA_DRIVER
    ]
    if others:
        return Check(
            "rdma devices",
            FAILED,
            f"non-EFA RDMA devices in the container: {', '.join(others)}; take devices only from the EFA device "
            "plugin (no /dev/infiniband hostPath; the NVIDIA device plugin with MOFED off)",
            # A device of another driver is this node's setup; one sysfs cannot name is no reason to quarantine.
            node_fault=any(driver is not None for driver in drivers.values() if driver != EFA_DRIVER),
        )
    return Check("rdma devices", OK, f"every {device_dir}/uverbs* device is the {EFA_DRIVER} driver's")
