"""torchrun for every backend: the rendezvous, its command line, and the supervisor that runs it.

A backend (trainer/launch/batch.py for AWS Batch; local.py on the machine at hand) says where a node stands in the
job (`Rendezvous`); `torchrun_command` runs `python -m trainer <verb>` on each of its devices, and `supervise` watches
torchrun: SIGTERM goes to the ranks, which save and exit 0, so torchrun exits 0 too; after the stop grace
(image/container.env TRAINSTACK_STOP_GRACE_SECONDS) the ranks left are killed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from trainer.contract import retry
from trainer.contract.container import STOP_GRACE_SECONDS
from trainer.device import gpu_count

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


def devices_per_node() -> int:
    return gpu_count()


def torchrun() -> list[str]:
    """torch.distributed.run as this module runs it (`run_torchrun`): its ranks end with it (distributed/lifetime)."""
    return [sys.executable, "-m", "trainer.distributed.torchrun"]


def torchrun_command(
    rdzv: Rendezvous, nproc: int, port: int, max_restarts: int, verb: list[str]
) -> list[str]:
    return [*torchrun(), *rdzv.torchrun_args(nproc, port, max_restarts), "-m", "trainer", *verb]


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
        default=float(os.environ.get("TRAINSTACK_STOP_GRACE_SECONDS", STOP_GRACE_SECONDS)),
        help="after SIGTERM, how long the ranks get to reach a step boundary, save and exit before they are "
        f"killed (also TRAINSTACK_STOP_GRACE_SECONDS; default {STOP_GRACE_SECONDS}, image/container.env)",
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
    stopping, killed_here = threading.Event(), threading.Event()

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
            killed_here.set()
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
    finished = threading.Event()
    threading.Thread(target=_reap_orphans, args=(torchrun, finished), daemon=True).start()
    status = torchrun.wait()
    finished.set()
    if status < 0 and not killed_here.is_set():
        print(_killed_message(torchrun.pid, -status), file=sys.stderr, flush=True)
    # What is left is orphaned: a killed rank's children (its checkpoint writer).
    leftovers = psutil.Process().children(recursive=True)
    signal_all(leftovers, signal.SIGKILL)
    psutil.wait_procs(leftovers, timeout=10)
    status = retry.supervised_status(status if status >= 0 else 128 - status, exit_request)
    shutil.rmtree(exit_request.parent, ignore_errors=True)
    return status


def _killed_message(pid: int, signum: int) -> str:
    """Why the run ends when torchrun died of a signal this supervisor did not send (it forwards SIGTERM to the
    ranks, and kills only after the grace, which it says): someone else's kill, or the kernel's OOM killer."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    cause = (
        "by the kernel's out-of-memory killer (then dmesg shows it) or a `kill -9` of its pid"
        if signum == signal.SIGKILL
        else f"by a {name} sent to torchrun itself, not to this supervisor"
    )
    return (
        f"launch: torchrun (pid {pid}) was killed by {name}, {cause}; its ranks ended without saving what was "
        f"in flight (the newest complete checkpoint stands). Exiting {128 + signum}; to stop a run with a save, "
        "send SIGTERM to this supervising process (`train`, or `launch` on a cluster)"
    )


# How often the supervisor looks for processes orphaned by a dead rank.
ORPHAN_CHECK_SECONDS = 2.0


def _reap_orphans(torchrun: subprocess.Popen, finished: threading.Event) -> None:
    """While torchrun runs, kill what a dead rank left behind. This process is the subreaper (_adopt_orphans) and
    starts only torchrun, so any other child of its own was orphaned: a killed rank's checkpoint writer (and the
    processes it forked for the files it was writing), multiprocessing's resource tracker (about 0.3 GB a rank). Under --max-restarts torchrun
    outlives many such deaths, and each would otherwise keep its share of memory until the job ends."""
    import psutil

    me = psutil.Process()
    while not finished.wait(ORPHAN_CHECK_SECONDS):
        orphans = [child for child in me.children() if child.pid != torchrun.pid]
        for orphan in orphans:
            with contextlib.suppress(psutil.NoSuchProcess):
                for process in [*orphan.children(recursive=True), orphan]:
                    process.kill()
        psutil.wait_procs(orphans, timeout=5)


def _adopt_orphans() -> None:
    """Make this process the reaper of its descendants' orphans (Linux), so that it can end them."""
    if sys.platform == "linux":
        pr_set_child_subreaper = 36
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0)


def run_torchrun() -> int:
    """torchrun (torch.distributed.run), with one line instead of its traceback when it is signalled itself: the
    supervisor forwards SIGTERM to the ranks, so a signal reaching torchrun came from outside (a kill of its
    pid or of the process group), and the ranks stop without saving what was in flight."""
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    try:
        run.main()
    except SignalException as stopped:
        name = signal.Signals(stopped.sigval).name
        print(
            f"torchrun: stopped by {name} sent to torchrun itself; its ranks were stopped without saving what "
            "was in flight (the newest complete checkpoint stands). To stop a run with a save, signal the "
            "supervising process (`train` outside torchrun, or `launch`)",
            file=sys.stderr,
            flush=True,
        )
        return 128 + stopped.sigval
    return 0


if __name__ == "__main__":
    from trainer.distributed import lifetime
    from trainer.distributed.quick_exit import quick_exit

    lifetime.start_children()  # the ranks end with torchrun (which ends with its supervisor)
    quick_exit(run_torchrun())
