"""`python -m trainer preflight`: is every node fit to train? Run on every rank by `trainer launch` before training,
and by `make smoke` as a job of its own.

Checks (trainer/preflight/checks.py, pod.py), against the instance catalog (TRAINSTACK_INSTANCE_TYPE, set by the
Batch job definition and the EKS JobSet): the GPUs CUDA sees and their NVML health, the EFA devices passed into the
container (all of them the EFA driver's), RLIMIT_MEMLOCK unlimited for EFA, the interface NCCL
bootstraps over, the checkpoint root (on /fsx in the cluster: Lustre, writable), an all-reduce across every rank
against the catalog's bus bandwidth floor (below it, a pairwise test names the slow node), a token each node
writes under the checkpoint root and every other node reads, and NCCL's choice of the AWS Libfabric (EFA) network.
On CPU it runs what applies (gloo all-reduce, checkpoint root, shared tokens) and says what it skipped.

Rank 0 prints one line per node and check. A node whose own hardware or mounts failed takes itself out of service
(trainer/preflight/quarantine.py) and every rank exits with NODE_FAULT, which the job's retry strategy retries on
fresh hosts; other failures (configuration, image) exit 1.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

from trainer.contract.catalog import ALLREDUCE_MESSAGE_BYTES, InstanceType, instance_type
from trainer.contract.container import FSX_MOUNT
from trainer.contract.gpu_nodes import NODE_NAME_ENV
from trainer.contract.image import efa_environment
from trainer.contract.retry import RETRY_EXIT_CODE as NODE_FAULT  # a node unfit to train
from trainer.preflight.checks import (
    FAILED,
    OK,
    SKIPPED,
    Check,
    bus_bandwidth_gbps,
    check_bandwidth,
    check_bootstrap_interface,
    check_checkpoint_root,
    check_efa_devices,
    check_gpu_health,
    check_gpus,
    check_nccl_network,
)
from trainer.preflight.interfaces import system_interfaces
from trainer.preflight.pairwise import judge, measure_pairs, pair_rounds
from trainer.preflight.pod import check_memlock, check_rdma_devices, read_memlock
from trainer.preflight.storage import MOUNTINFO, unseen_tokens, write_token

NCCL_LOG_PATTERN = "trainstack-preflight-nccl.%h.%p.log"
# Where each node's local rank 0 writes the exit status (`trainer launch` sets it and returns that status).
STATUS_FILE_ENV = "TRAINSTACK_PREFLIGHT_STATUS_FILE"
FSX = Path(FSX_MOUNT)  # the container contract (image/container.env)
PAIR_ROUNDS = 3  # enough for every node to meet two partners, so that one slow node is told from its partners


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint-root",
        type=Path,
        default=Path(os.environ.get("TRAINSTACK_CHECKPOINT_ROOT", "runs")),
        help="where checkpoints go (default: TRAINSTACK_CHECKPOINT_ROOT, set to /fsx/checkpoints in the image)",
    )
    parser.add_argument(
        "--size-mb",
        type=float,
        default=None,
        help=f"all-reduce message size (GPU {ALLREDUCE_MESSAGE_BYTES // 2**20}: the catalog's floors are at it; CPU 4)",
    )
    parser.add_argument("--iters", type=int, default=10, help="timed all-reduce iterations")
    parser.add_argument("--timeout-s", type=float, default=180.0, help="process-group timeout")
    parser.add_argument(
        "--floor-gbps", type=float, help="bus bandwidth floor instead of the catalog's (a measured baseline)"
    )
    parser.add_argument(
        "--shared-dir",
        type=Path,
        help="keep each node's token here (make smoke: FSx exports it to S3); default: a directory under the "
        "checkpoint root, removed afterwards",
    )
    parser.add_argument(
        "--no-quarantine",
        action="store_true",
        help="report a faulty node but leave it in service (default in Batch: mark it unhealthy)",
    )


def _local_checks(
    args: argparse.Namespace, instance: InstanceType | None, cuda_devices: int, cuda: bool
) -> list[Check]:
    root = args.checkpoint_root.resolve()
    lustre = FSX if root.is_relative_to(FSX) else None
    mountinfo = MOUNTINFO.read_text() if lustre else ""
    checks = [
        check_gpus(instance, cuda_devices),
        check_efa_devices(instance),
        check_bootstrap_interface(
            instance,
            os.environ.get("NCCL_SOCKET_IFNAME") or efa_environment()["NCCL_SOCKET_IFNAME"],
            system_interfaces(),
        ),
        check_checkpoint_root(root, lustre, mountinfo),
        check_memlock(instance, read_memlock()),
        check_rdma_devices(instance),
    ]
    if cuda:
        import pynvml

        from trainer.preflight.gpu_health import read_gpus

        checks.append(check_gpu_health(read_gpus(pynvml), pynvml))
    else:
        checks.append(Check("gpu health", SKIPPED, "no CUDA device: NVML not read"))
    return checks


def _time_all_reduce(dist, torch, device, size_bytes: int, iters: int, group=None, ranks: int | None = None):
    """nccl-tests' bus bandwidth (GB/s) of an all-reduce of size_bytes in `group` (default: every rank)."""
    buffer = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
    for _ in range(3):
        dist.all_reduce(buffer, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buffer, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / iters
    return bus_bandwidth_gbps(size_bytes, seconds, ranks or dist.get_world_size()), seconds


def _shared_storage(dist, directory: Path, node: int, nodes: int, local_rank: int) -> Check | None:
    """Each node's local rank 0 writes a token; after a barrier it must read every other node's."""
    token = secrets.token_hex(16)
    if local_rank == 0:
        write_token(directory, node, token)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (node, token, local_rank))
    tokens = {n: t for n, t, lr in gathered if lr == 0}
    dist.barrier()
    if local_rank != 0:
        return None
    unseen = unseen_tokens(directory, tokens, node)
    if unseen:
        return Check(
            "shared storage",
            FAILED,
            f"{directory} is not shared with every node: {'; '.join(unseen)}",
            node_fault=True,
        )
    return Check("shared storage", OK, f"read the tokens of all {nodes - 1} other nodes in {directory}")


def _pairwise(dist, torch, device, args, node_of_rank: dict[int, int], node: int, floor: float, size: int):
    """(slow nodes, unexplained slow pairs), the same on every rank."""
    ranks_of_node: dict[int, list[int]] = {}
    for rank, n in sorted(node_of_rank.items()):
        ranks_of_node.setdefault(n, []).append(rank)
    rounds = pair_rounds(len(ranks_of_node), PAIR_ROUNDS)
    measured = measure_pairs(
        rounds,
        ranks_of_node,
        lambda ranks: dist.new_group(ranks),
        node,
        lambda group, ranks: _time_all_reduce(dist, torch, device, size, args.iters, group, ranks)[0],
    )
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, measured)
    every_pair = {pair: bandwidth for result in gathered for pair, bandwidth in result.items()}
    return judge(every_pair, floor), every_pair


def _exit_status(rows: list[dict]) -> int:
    if any(row["status"] == FAILED and row["node_fault"] for row in rows):
        return NODE_FAULT
    return 1 if any(row["status"] == FAILED for row in rows) else 0


def _take_out_of_service(checks: list[Check], node_name: str | None = None) -> Check | None:
    """On a node with a fault of its own, in Batch or (with its node's name) in a JobSet pod: leave service.
    Returns the check that says what happened."""
    if not any(c.status == FAILED and c.node_fault for c in checks):
        return None
    from trainer.preflight.quarantine import instance_identity, quarantine_node, take_out_of_service

    try:
        if node_name:
            return Check("out of service", OK, quarantine_node(node_name), node_fault=True)
        instance_id, region = instance_identity()
        return Check("out of service", OK, take_out_of_service(instance_id, region), node_fault=True)
    except Exception as error:  # reported, never raised: the job must still exit with the retry code
        return Check("out of service", FAILED, f"could not leave service: {error}", node_fault=True)


@dataclass
class Node:
    """Where this process stands, and what the checks need of the world."""

    rank: int
    local_rank: int
    world_size: int
    node: int  # torchrun's node rank
    instance: InstanceType | None
    cuda: bool


def main(args: argparse.Namespace) -> int:
    """The phases in order: this node's own checks, the network (all-reduce, bandwidth, a pairwise search for a
    slow node), shared storage, NCCL's network choice, then quarantine and the report. Every rank runs every phase."""
    import torch
    import torch.distributed as dist

    checks: list[Check] = []
    here = _where_am_i(checks, torch.cuda.is_available())
    if here.local_rank == 0:
        checks += _local_checks(args, here.instance, torch.cuda.device_count() if here.cuda else 0, here.cuda)
    log_dir = Path(tempfile.mkdtemp(prefix="trainstack-preflight-"))
    if here.cuda:
        torch.cuda.set_device(here.local_rank)
        os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET")
        os.environ["NCCL_DEBUG_FILE"] = str(log_dir / NCCL_LOG_PATTERN)
    backend = "nccl" if here.cuda else "gloo"
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout_s))
        nodes = _network_checks(args, here, checks, dist, torch)
        _storage_checks(args, here, checks, dist, nodes)
    except Exception as error:  # a broken network must be reported, not raised past the report
        checks.append(
            Check(
                "all-reduce", FAILED, f"{backend} all-reduce across {here.world_size} ranks failed: {error}"
            )
        )
    if here.local_rank == 0:
        checks.append(_nccl_check(here, log_dir))
    shutil.rmtree(log_dir, ignore_errors=True)
    in_batch = "AWS_BATCH_JOB_ID" in os.environ and not args.no_quarantine
    # A JobSet pod knows its node from the downward API (trainer/jobs/jobset.py).
    node_name = None if args.no_quarantine else os.environ.get(NODE_NAME_ENV)
    leaving = (
        _take_out_of_service(checks, node_name) if here.local_rank == 0 and (in_batch or node_name) else None
    )
    if leaving is not None:
        checks.append(leaving)
    return _report(here, checks, dist)


def _where_am_i(checks: list[Check], cuda: bool) -> Node:
    instance = None
    if name := os.environ.get("TRAINSTACK_INSTANCE_TYPE"):
        try:
            instance = instance_type(name)
        except KeyError as error:
            checks.append(Check("instance type", FAILED, f"TRAINSTACK_INSTANCE_TYPE: {error.args[0]}"))
    return Node(
        rank=int(os.environ.get("RANK", "0")),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        node=int(os.environ.get("GROUP_RANK", "0")),
        instance=instance,
        cuda=cuda,
    )


def _network_checks(args: argparse.Namespace, here: Node, checks: list[Check], dist, torch) -> int:
    """The all-reduce across every rank against the catalog's floor, and below it the pairwise search; the
    number of nodes."""
    rank, cuda, instance = here.rank, here.cuda, here.instance
    device = torch.device("cuda", here.local_rank) if cuda else torch.device("cpu")
    size_bytes = (
        int(args.size_mb * 2**20) if args.size_mb else (ALLREDUCE_MESSAGE_BYTES if cuda else 4 * 2**20)
    )
    floor = instance.bus_bandwidth_floor if instance and cuda else None
    floor_gbps = args.floor_gbps or (floor.floor_gbps if floor else None)
    floor_source = "--floor-gbps" if args.floor_gbps else (floor.source if floor else "")
    placement: list = [None] * here.world_size
    dist.all_gather_object(placement, (rank, here.node))
    node_of_rank = dict(placement)
    nodes = len(set(node_of_rank.values()))
    bandwidth, seconds = _time_all_reduce(dist, torch, device, size_bytes, args.iters)
    if rank == 0:
        checks.append(
            Check(
                "all-reduce",
                OK,
                f"{dist.get_backend()}, {here.world_size} ranks on {nodes} nodes, {size_bytes / 2**20:.0f} MiB: "
                f"{seconds * 1e3:.2f} ms, bus bandwidth {bandwidth:.2f} GB/s",
            )
        )
    if nodes >= 2 and floor_gbps:
        below = bandwidth < floor_gbps
        if rank == 0:
            checks.append(check_bandwidth(bandwidth, floor_gbps, floor_source))
        if below:
            (slow, unexplained), pairs = _pairwise(
                dist, torch, device, args, node_of_rank, here.node, floor_gbps, size_bytes
            )
            measured = ", ".join(f"nodes {a}+{b} {bw:.1f} GB/s" for (a, b), bw in sorted(pairs.items()))
            if here.node in slow and here.local_rank == 0:
                checks.append(Check("slow node", FAILED, f"below the floor in every pair: {measured}", True))
            if rank == 0 and unexplained:
                checks.append(
                    Check(
                        "slow pairs",
                        FAILED,
                        f"{measured}; pairs {unexplained} cannot be pinned on one node (two nodes, or more than "
                        "one slow): run make smoke on more nodes",
                    )
                )
    elif rank == 0:
        checks.append(Check("bandwidth", SKIPPED, "one node, or no floor: NVLink/shared memory only"))
    return nodes


def _storage_checks(args: argparse.Namespace, here: Node, checks: list[Check], dist, nodes: int) -> None:
    """Across nodes: every node reads the token each other node wrote under the checkpoint root."""
    if nodes < 2:
        if here.local_rank == 0:
            checks.append(Check("shared storage", SKIPPED, "one node"))
        return
    # A node's AWS_BATCH_JOB_ID may carry its node index (<job>#<node>): the directory must be the job's.
    job = os.environ.get("AWS_BATCH_JOB_ID", "").partition("#")[0] or "local"
    attempt = os.environ.get("AWS_BATCH_JOB_ATTEMPT") or os.environ.get("MASTER_PORT", "0")
    shared = args.shared_dir or args.checkpoint_root.resolve() / ".preflight" / f"{job}-{attempt}"
    if (storage := _shared_storage(dist, shared, here.node, nodes, here.local_rank)) is not None:
        checks.append(storage)
    dist.barrier()
    if args.shared_dir is None and here.rank == 0:
        shutil.rmtree(shared, ignore_errors=True)


def _nccl_check(here: Node, log_dir: Path) -> Check:
    """NCCL's choice of network, from the log the all-reduce left (GPUs only)."""
    if not here.cuda:
        return Check("nccl network", SKIPPED, "gloo on CPU: NCCL and EFA not used")
    log_text = "".join(path.read_text(errors="replace") for path in log_dir.glob("*.log"))
    return check_nccl_network(here.instance, log_text)


def _report(here: Node, checks: list[Check], dist) -> int:
    """Every rank's checks gathered; rank 0 prints one line per node and check; the exit status, agreed."""
    host = socket.gethostname()
    rows = [dict(asdict(c), host=host, node=here.node) for c in checks]
    if dist.is_initialized():
        gathered: list = [None] * here.world_size
        dist.all_gather_object(gathered, rows)
        rows = [row for rank_rows in gathered for row in rank_rows]
    status = _exit_status(rows)
    if here.rank == 0:
        for row in sorted(rows, key=lambda r: r["node"]):
            print(
                f"preflight {row['status']:>7}  node {row['node']} {row['host']:<20} {row['name']:<16} "
                f"{row['detail']}",
                flush=True,
            )
        verdict = {0: "passed", 1: "FAILED", NODE_FAULT: f"FAILED: node fault, exit {NODE_FAULT} (retry)"}
        print("preflight: " + verdict[status], flush=True)
    if here.local_rank == 0 and (status_file := os.environ.get(STATUS_FILE_ENV)):
        Path(status_file).write_text(str(status))
    if dist.is_initialized():
        dist.barrier()  # torchrun stops the other ranks as soon as one exits non-zero: report first
        dist.destroy_process_group()
    return status


def launcher_status(status_file: Path, torchrun_status: int) -> int:
    """The preflight's own exit status, which torchrun (exiting 1 for any failed rank) does not pass on."""
    try:
        return int(status_file.read_text())
    except (OSError, ValueError):
        return torchrun_status
