"""The preflight's checks of one node, each a pure function of what it inspects, so that tests can give them the
recorded state of a broken node: GPUs and EFA devices against the instance catalog, the NCCL bootstrap interface,
the checkpoint root (writable, on Lustre in the cluster), NVML health, NCCL's network choice from its log and the
all-reduce bus bandwidth against the catalog's floor."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from trainer.contract.catalog import InstanceType
from trainer.contract.image import efa_environment
from trainer.preflight.gpu_health import GpuReading, problems
from trainer.preflight.interfaces import bootstrap_interface, is_link_local
from trainer.preflight.nccl_log import nccl_network, provider_selections
from trainer.preflight.storage import lustre_problem

OK, SKIPPED, FAILED = "ok", "skipped", "failed"
EFA_DEVICE_DIR = Path("/dev/infiniband")


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    # A failure of this node's own hardware or mounts: the node leaves service and the job retries elsewhere.
    node_fault: bool = False


def check_gpus(instance: InstanceType | None, cuda_devices: int) -> Check:
    if instance is None:
        if cuda_devices == 0:
            return Check("gpus", SKIPPED, "no CUDA device and no TRAINSTACK_INSTANCE_TYPE: running on CPU")
        return Check("gpus", OK, f"{cuda_devices} visible (no TRAINSTACK_INSTANCE_TYPE to compare with)")
    expected = f"{instance.gpus} x {instance.gpu_model} on {instance.name}"
    if cuda_devices != instance.gpus:
        return Check("gpus", FAILED, f"expected {expected}, CUDA sees {cuda_devices}", node_fault=True)
    return Check("gpus", OK, expected)


def check_efa_devices(instance: InstanceType | None, device_dir: Path = EFA_DEVICE_DIR) -> Check:
    if instance is None or not instance.has_efa:
        return Check("efa devices", SKIPPED, "no EFA instance type given (TRAINSTACK_INSTANCE_TYPE)")
    found = sorted(device_dir.glob("uverbs*"))
    if len(found) != instance.efa_interfaces:
        return Check(
            "efa devices",
            FAILED,
            f"{instance.name} has {instance.efa_interfaces} EFA interfaces but {len(found)} {device_dir}/uverbs* "
            "devices are in the container: check the job definition's linuxParameters.devices and the launch "
            "template's network interfaces",
            node_fault=True,
        )
    return Check("efa devices", OK, f"{len(found)} uverbs devices")


def check_bootstrap_interface(
    instance: InstanceType | None, ifname_setting: str, interfaces: list[tuple[str, str]]
) -> Check:
    if instance is None or not instance.has_efa:
        return Check("bootstrap if", SKIPPED, "not an EFA node: NCCL's socket bootstrap is local")
    chosen = bootstrap_interface(ifname_setting, interfaces)
    if chosen is None or is_link_local(chosen[1]):
        listed = ", ".join(f"{n} {a}" for n, a in interfaces)
        return Check(
            "bootstrap if",
            FAILED,
            f"NCCL_SOCKET_IFNAME={ifname_setting} picks {chosen[0] + ' ' + chosen[1] if chosen else 'nothing'} "
            f"of {listed}: the other nodes cannot reach a link-local address (exclude it in image/efa.env)",
        )
    return Check("bootstrap if", OK, f"{chosen[0]} {chosen[1]} (NCCL_SOCKET_IFNAME={ifname_setting})")


def check_checkpoint_root(root: Path, lustre_mount: Path | None, mountinfo: str) -> Check:
    """The checkpoint root is writable and, in the cluster (lustre_mount=/fsx), on Lustre."""
    if lustre_mount is not None and (problem := lustre_problem(str(lustre_mount), mountinfo)):
        return Check("checkpoint root", FAILED, problem, node_fault=True)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".preflight-") as probe:
            probe.write(b"trainstack")
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as error:
        return Check("checkpoint root", FAILED, f"{root} is not writable: {error.strerror or error}")
    return Check(
        "checkpoint root", OK, f"{root} writable" + (f" on Lustre ({lustre_mount})" if lustre_mount else "")
    )


def check_gpu_health(readings: list[GpuReading], nvml: ModuleType) -> Check:
    bad = [f"GPU {r.index} ({r.uuid}): {'; '.join(p)}" for r in readings if (p := problems(r, nvml))]
    if bad:
        return Check("gpu health", FAILED, " | ".join(bad), node_fault=True)
    return Check(
        "gpu health",
        OK,
        f"{len(readings)} GPUs: no pending retirement or remap, no uncorrectable ECC, "
        "no fault slowdown (NVML)",
    )


def check_bandwidth(bandwidth_gbps: float, floor_gbps: float | None, floor_source: str) -> Check:
    if floor_gbps is None:
        return Check("bandwidth", SKIPPED, "no floor for this instance type (catalog) and no --floor-gbps")
    if bandwidth_gbps < floor_gbps:
        return Check(
            "bandwidth",
            FAILED,
            f"bus bandwidth {bandwidth_gbps:.1f} GB/s below the floor {floor_gbps} GB/s "
            f"({floor_source}); pairwise test follows",
        )
    return Check(
        "bandwidth",
        OK,
        f"bus bandwidth {bandwidth_gbps:.1f} GB/s >= floor {floor_gbps} GB/s ({floor_source})",
    )


def check_nccl_network(instance: InstanceType | None, log_text: str) -> Check:
    network = nccl_network(log_text)
    if instance is None or not instance.has_efa:
        return Check("nccl network", OK if network else SKIPPED, network or "no NCCL log (not an EFA node)")
    # aws-ofi-nccl names itself after NCCL_NET when NCCL_NET is "AWS Libfabric" (nvidia_plugin_name_fixup,
    # src/nccl_ofi_interface_nvidia.c/.cpp since v1.13.0-aws), so the name must be image/efa.env's NCCL_NET.
    wanted = efa_environment()["NCCL_NET"]
    selections = provider_selections(log_text)
    if network != wanted or not selections:
        return Check(
            "nccl network",
            FAILED,
            f"NCCL is using {network or 'no network it reported'} instead of EFA ({wanted}, provider efa): "
            "the image needs aws-ofi-nccl (EFA installer, NCCL_NET_PLUGIN in image/efa.env) and the container "
            "the /dev/infiniband devices",
        )
    wrong = [s for s in selections if s.provider != "efa" or s.nics != instance.efa_interfaces]
    if wrong:
        found = ", ".join(sorted({f"{s.provider} with {s.nics} nics" for s in wrong}))
        return Check(
            "nccl network",
            FAILED,
            f"aws-ofi-nccl selected {found}; {instance.name} needs provider efa on all "
            f"{instance.efa_interfaces} EFA interfaces",
        )
    fabric = selections[0].fabric
    return Check(
        "nccl network",
        OK,
        f"{network}, provider efa"
        + (f", fabric {fabric}" if fabric else "")
        + f", {selections[0].nics} nics",
    )


def bus_bandwidth_gbps(size_bytes: int, seconds: float, world_size: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: algorithm bandwidth x 2(n-1)/n, in GB/s."""
    return size_bytes / seconds * 2 * (world_size - 1) / max(world_size, 1) / 1e9
