"""`python -m trainer launch [options] <verb> [args...]`: start one node's share of a distributed run.

Maps the AWS Batch multi-node variables to a torchrun rendezvous (static: the main node is node rank 0 and hosts
the store), runs the preflight on every rank unless skipped, then runs torchrun with one process per device and
watches it (`supervise`): SIGTERM goes to the ranks, which save and exit 0, so torchrun exits 0 too.
Without Batch variables (a single-node Batch job, `docker run`, a workstation) it runs torchrun standalone.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainer.contract import retry
from trainer.contract.image import efa_environment
from trainer.launch.preflight import STATUS_FILE_ENV, launcher_status

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


def add_supervision_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the process that starts torchrun and watches it (here, and `train` outside torchrun)."""
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=int(os.environ.get("TRAINSTACK_MAX_RESTARTS", "0")),
        help="restart every rank this many times after one fails; each restart resumes from the newest "
        "checkpoint (also TRAINSTACK_MAX_RESTARTS; default 0)",
    )
    parser.add_argument(
        "--stop-grace-seconds",
        type=float,
        default=float(os.environ.get("TRAINSTACK_STOP_GRACE_SECONDS", "120")),
        help="after SIGTERM, how long the ranks get to reach a step boundary, save and exit before they are "
        "killed (also TRAINSTACK_STOP_GRACE_SECONDS; default 120, Spot's warning time)",
    )


def supervise(command: list[str], stop_grace_seconds: float) -> int:
    """Run torchrun and return its exit status. SIGTERM is passed to the ranks, not to torchrun: each rank saves
    at the next step boundary and exits 0, and torchrun, seeing every rank succeed, exits 0 (signalled itself, it
    would raise and exit 1). Ranks still running `stop_grace_seconds` later are killed, torchrun first so that it
    cannot restart them. SIGINT (Ctrl-C) reaches every process from the terminal; this one just waits."""
    import psutil  # the image and the training requirements have it; the launcher's dry run needs none

    # torch 2.13 keeps one rendezvous store across restarts, so restarted ranks could read the dead ones'
    # addresses (pytorch/pytorch#135712): a store per rendezvous round instead.
    environment = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **os.environ}
    # A rank that exits for a retry says so here; torchrun itself exits 1 (trainer/contract/retry.py).
    exit_request = Path(tempfile.mkdtemp(prefix="trainstack-")) / "exit-request"
    environment[retry.EXIT_REQUEST_ENV] = str(exit_request)
    _adopt_orphans()
    torchrun = subprocess.Popen(command, env=environment)
    stopping = threading.Event()

    def signal_all(processes: list[psutil.Process], sig: signal.Signals) -> None:
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(sig)

    def tree(recursive: bool) -> list[psutil.Process]:
        with contextlib.suppress(psutil.NoSuchProcess):
            return psutil.Process(torchrun.pid).children(recursive=recursive)
        return []

    def kill_after_grace() -> None:
        try:
            torchrun.wait(timeout=stop_grace_seconds)
        except subprocess.TimeoutExpired:
            print(
                f"launch: the ranks did not stop within {stop_grace_seconds:g} s of SIGTERM; killing them "
                "(the newest complete checkpoint stands)",
                file=sys.stderr,
                flush=True,
            )
            descendants = tree(recursive=True)
            signal_all([psutil.Process(torchrun.pid), *descendants], signal.SIGKILL)

    def on_sigterm(signum: int, frame: object) -> None:
        if stopping.is_set():
            return
        stopping.set()
        print(
            f"launch: SIGTERM: the ranks save at the next step boundary, then stop (grace {stop_grace_seconds:g} s)",
            file=sys.stderr,
            flush=True,
        )
        # Between restarts there are no ranks: then torchrun itself is told (and exits 1).
        with contextlib.suppress(psutil.NoSuchProcess):
            signal_all(tree(recursive=False) or [psutil.Process(torchrun.pid)], signal.SIGTERM)
        threading.Thread(target=kill_after_grace, daemon=True).start()

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    status = torchrun.wait()
    # What is left is orphaned: a killed rank's children (megatron's checkpoint writer keeps a Manager process).
    leftovers = psutil.Process().children(recursive=True)
    signal_all(leftovers, signal.SIGKILL)
    psutil.wait_procs(leftovers, timeout=10)
    status = retry.supervised_status(status if status >= 0 else 128 - status, exit_request)
    shutil.rmtree(exit_request.parent, ignore_errors=True)
    return status


def _adopt_orphans() -> None:
    """Make this process the reaper of its descendants' orphans (Linux), so that it can end them."""
    if sys.platform == "linux":
        pr_set_child_subreaper = 36
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0)


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
    add_supervision_arguments(parser)
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
        with tempfile.TemporaryDirectory(prefix="trainstack-preflight-") as scratch:
            status_file = Path(scratch) / "status"
            env = {**os.environ, STATUS_FILE_ENV: str(status_file)}
            status = subprocess.run(preflight, check=False, env=env).returncode
            status = launcher_status(status_file, status) if status else 0
        if status != 0:
            print(f"launch: preflight failed (exit {status}); not starting {args.verb[0]}", file=sys.stderr)
            return status
    sys.stdout.flush()
    return supervise(run, args.stop_grace_seconds)
