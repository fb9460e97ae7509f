"""`python -m trainer preflight`: is this node fit to train? Run on every rank by `trainer launch` before training.

Checks, against the instance catalog (TRAINSTACK_INSTANCE_TYPE, set by the Batch job definition): the GPUs CUDA
sees, the EFA devices passed into the container, the checkpoint root (on /fsx in the cluster) mounted and
writable, and an all-reduce across every rank reporting bus bandwidth. On GPUs NCCL must have chosen the AWS
Libfabric (EFA) network; a run that would silently fall back to TCP sockets fails here instead. On CPU it runs
what applies (gloo all-reduce, checkpoint root) and says what it skipped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

from trainer.contract.catalog import InstanceType, instance_type
from trainer.contract.image import efa_environment
from trainer.launch.interfaces import bootstrap_interface, is_link_local, system_interfaces
from trainer.launch.nccl_log import nccl_network, provider_selections

OK, SKIPPED, FAILED = "ok", "skipped", "failed"
EFA_DEVICE_DIR = Path("/dev/infiniband")
NCCL_LOG_PATTERN = "trainstack-preflight-nccl.%h.%p.log"


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str


def check_gpus(instance: InstanceType | None, cuda_devices: int) -> Check:
    if instance is None:
        if cuda_devices == 0:
            return Check("gpus", SKIPPED, "no CUDA device and no TRAINSTACK_INSTANCE_TYPE: running on CPU")
        return Check("gpus", OK, f"{cuda_devices} visible (no TRAINSTACK_INSTANCE_TYPE to compare with)")
    expected = f"{instance.gpus} x {instance.gpu_model} on {instance.name}"
    if cuda_devices != instance.gpus:
        return Check("gpus", FAILED, f"expected {expected}, CUDA sees {cuda_devices}")
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


def check_checkpoint_root(root: Path, mount_point: Path | None) -> Check:
    if mount_point is not None and not os.path.ismount(mount_point):
        return Check(
            "checkpoint root", FAILED, f"{mount_point} is not a mount point: FSx is not mounted on this host"
        )
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".preflight-") as probe:
            probe.write(b"trainstack")
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as error:
        return Check("checkpoint root", FAILED, f"{root} is not writable: {error.strerror or error}")
    return Check("checkpoint root", OK, f"{root} writable" + (f" on {mount_point}" if mount_point else ""))


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint-root",
        type=Path,
        default=Path(os.environ.get("TRAINSTACK_CHECKPOINT_ROOT", "runs")),
        help="where checkpoints go (default: TRAINSTACK_CHECKPOINT_ROOT, set to /fsx/checkpoints in the image)",
    )
    parser.add_argument(
        "--size-mb", type=float, default=None, help="all-reduce message size (GPU 256, CPU 4)"
    )
    parser.add_argument("--iters", type=int, default=10, help="timed all-reduce iterations")
    parser.add_argument("--timeout-s", type=float, default=180.0, help="process-group timeout")


def _local_checks(args: argparse.Namespace, instance: InstanceType | None, cuda_devices: int) -> list[Check]:
    root = args.checkpoint_root.resolve()
    mount = Path("/fsx") if root.is_relative_to("/fsx") else None
    return [
        check_gpus(instance, cuda_devices),
        check_efa_devices(instance),
        check_bootstrap_interface(
            instance,
            os.environ.get("NCCL_SOCKET_IFNAME") or efa_environment()["NCCL_SOCKET_IFNAME"],
            system_interfaces(),
        ),
        check_checkpoint_root(root, mount),
    ]


def main(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    checks: list[Check] = []
    instance = None
    if name := os.environ.get("TRAINSTACK_INSTANCE_TYPE"):
        try:
            instance = instance_type(name)
        except KeyError as error:
            checks.append(Check("instance type", FAILED, f"TRAINSTACK_INSTANCE_TYPE: {error.args[0]}"))
    cuda = torch.cuda.is_available()
    if local_rank == 0:
        checks += _local_checks(args, instance, torch.cuda.device_count())

    log_dir = Path(tempfile.mkdtemp(prefix="trainstack-preflight-"))
    if cuda:
        torch.cuda.set_device(local_rank)
        os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET")
        os.environ["NCCL_DEBUG_FILE"] = str(log_dir / NCCL_LOG_PATTERN)
    backend = "nccl" if cuda else "gloo"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    size_bytes = int((args.size_mb or (256 if cuda else 4)) * 2**20)
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout_s))
        buffer = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
        for _ in range(3):
            dist.all_reduce(buffer)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(buffer)
        if cuda:
            torch.cuda.synchronize()
        elapsed = (time.perf_counter() - start) / args.iters
        bandwidth = bus_bandwidth_gbps(size_bytes, elapsed, world_size)
        if rank == 0:
            checks.append(
                Check(
                    "all-reduce",
                    OK,
                    f"{backend}, {world_size} ranks, {size_bytes / 2**20:.0f} MiB: {elapsed * 1e3:.2f} ms, "
                    f"bus bandwidth {bandwidth:.2f} GB/s",
                )
            )
    except Exception as error:  # a broken network must be reported, not raised past the report
        checks.append(
            Check("all-reduce", FAILED, f"{backend} all-reduce across {world_size} ranks failed: {error}")
        )
    if cuda and local_rank == 0:
        log_text = "".join(path.read_text(errors="replace") for path in log_dir.glob("*.log"))
        checks.append(check_nccl_network(instance, log_text))
    elif local_rank == 0:
        checks.append(Check("nccl network", SKIPPED, "gloo on CPU: NCCL and EFA not used"))
    shutil.rmtree(log_dir, ignore_errors=True)

    host = socket.gethostname()
    gathered: list[list[dict]] = [[asdict(c) for c in checks]]
    if dist.is_initialized():
        gathered = [[] for _ in range(world_size)]
        report = [dict(asdict(c), host=host) for c in checks]
        dist.all_gather_object(gathered, report)
        dist.destroy_process_group()
    rows = [row for rank_rows in gathered for row in rank_rows]
    failed = any(row["status"] == FAILED for row in rows)
    if rank == 0:
        for row in rows:
            print(f"preflight {row['status']:>7}  {row['name']:<16} {row.get('host', host)}: {row['detail']}")
        print("preflight: " + ("FAILED" if failed else "passed"))
    return 1 if failed else 0
