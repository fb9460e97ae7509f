"""`python -m trainer launch [options] <verb> [args...]`: start one node's share of a distributed run.

Maps the AWS Batch multi-node variables to a torchrun rendezvous (static: the main node is node rank 0 and hosts
the store), runs the preflight on every rank unless skipped, then execs torchrun with one process per device.
Without Batch variables (a single-node Batch job, `docker run`, a workstation) it runs torchrun standalone.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from trainer.image_settings import efa_environment

NODE_INDEX = "AWS_BATCH_JOB_NODE_INDEX"
NUM_NODES = "AWS_BATCH_JOB_NUM_NODES"
MAIN_NODE_INDEX = "AWS_BATCH_JOB_MAIN_NODE_INDEX"
MAIN_NODE_ADDRESS = "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"
MASTER_PORT = 29500
# The preflight gets its own port so its store never collides with the training run's.
PREFLIGHT_PORT = MASTER_PORT + 1


class LaunchError(ValueError):
    """A node variable or option that cannot form a rendezvous."""


@dataclass(frozen=True)
class Rendezvous:
    nnodes: int
    node_rank: int
    master_addr: str | None  # None: a single node, torchrun --standalone

    def torchrun_args(self, nproc_per_node: int, port: int, max_restarts: int) -> list[str]:
        common = [f"--nproc-per-node={nproc_per_node}", f"--max-restarts={max_restarts}"]
        if self.master_addr is None:
            return ["--standalone", *common]
        return [
            f"--nnodes={self.nnodes}",
            f"--node-rank={self.node_rank}",
            f"--master-addr={self.master_addr}",
            f"--master-port={port}",
            *common,
        ]


def _int_variable(env: Mapping[str, str], name: str) -> int:
    value = env.get(name)
    if value is None:
        raise LaunchError(f"{name} is not set; AWS Batch sets it on every node of a multi-node job")
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{name}={value!r} is not an integer node index/count") from None


def primary_address() -> str:
    """This host's address on its default route (no packet is sent: UDP connect only picks the interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def rendezvous_from_env(
    env: Mapping[str, str], own_address: Callable[[], str] = primary_address
) -> Rendezvous:
    if NODE_INDEX not in env:
        return Rendezvous(nnodes=1, node_rank=0, master_addr=None)
    index, nnodes, main = (_int_variable(env, name) for name in (NODE_INDEX, NUM_NODES, MAIN_NODE_INDEX))
    if nnodes < 1 or not (0 <= index < nnodes and 0 <= main < nnodes):
        raise LaunchError(
            f"inconsistent Batch node variables: {NODE_INDEX}={index}, {NUM_NODES}={nnodes}, "
            f"{MAIN_NODE_INDEX}={main} (indices must lie in 0..{nnodes - 1})"
        )
    if nnodes == 1:
        return Rendezvous(nnodes=1, node_rank=0, master_addr=None)
    # torchrun's static rendezvous hosts its store on node rank 0: make that the Batch main node.
    node_rank = (index - main) % nnodes
    if index == main:
        return Rendezvous(nnodes, node_rank, own_address())
    address = env.get(MAIN_NODE_ADDRESS)
    if not address:
        raise LaunchError(
            f"{MAIN_NODE_ADDRESS} is not set on child node {index}; Batch sets it on child nodes"
        )
    return Rendezvous(nnodes, node_rank, address)


def devices_per_node() -> int:
    import torch  # imported here: the launcher's other paths need no torch

    return torch.cuda.device_count()


def torchrun_command(
    rdzv: Rendezvous, nproc: int, port: int, max_restarts: int, verb: list[str]
) -> list[str]:
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    return [*torchrun, *rdzv.torchrun_args(nproc, port, max_restarts), "-m", "trainer", *verb]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=int(os.environ.get("NPROC_PER_NODE", "0")) or None,
        help="processes on this node (default: one per visible GPU; required without GPUs)",
    )
    parser.add_argument(
        "--skip-preflight",
        action="store_true",
        default=os.environ.get("TRAINSTACK_SKIP_PREFLIGHT") == "1",
        help="do not run `trainer preflight` first (also TRAINSTACK_SKIP_PREFLIGHT=1)",
    )
    parser.add_argument(
        "--max-restarts", type=int, default=int(os.environ.get("TRAINSTACK_MAX_RESTARTS", "0"))
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")
    parser.add_argument("verb", nargs=argparse.REMAINDER, help="the trainer verb and its arguments")


def main(args: argparse.Namespace) -> int:
    if not args.verb:
        print(
            "launch: give the verb to run, e.g. `launch train --config trainer/configs/local.yaml`",
            file=sys.stderr,
        )
        return 2
    try:
        rdzv = rendezvous_from_env(os.environ)
    except LaunchError as error:
        print(f"launch: {error}", file=sys.stderr)
        return 2
    nproc = args.nproc_per_node or devices_per_node()
    if nproc < 1:
        print(
            "launch: no GPUs visible; pass --nproc-per-node N (or NPROC_PER_NODE) to run on CPU",
            file=sys.stderr,
        )
        return 2
    preflight = torchrun_command(rdzv, nproc, PREFLIGHT_PORT, 0, ["preflight"])
    run = torchrun_command(rdzv, nproc, MASTER_PORT, args.max_restarts, args.verb)
    if args.dry_run:
        for key in efa_environment():
            print(f"# {key}={os.environ.get(key, '<unset>')}")
        if not args.skip_preflight:
            print(shlex.join(preflight))
        print(shlex.join(run))
        return 0
    if not args.skip_preflight:
        status = subprocess.run(preflight, check=False).returncode
        if status != 0:
            print(f"launch: preflight failed (exit {status}); not starting {args.verb[0]}", file=sys.stderr)
            return status
    sys.stdout.flush()
    os.execv(run[0], run)  # torchrun takes over this process: signals from Batch reach it directly
