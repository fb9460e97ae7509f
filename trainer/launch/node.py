"""`python -m trainer launch [options] <verb> [args...]`: start one node's share of a distributed run.

Takes the node's place in the job from its backend's variables (AWS Batch: trainer/launch/batch.py; a JobSet pod on
EKS: trainer/launch/jobset.py), runs the
preflight (trainer/preflight/) on every rank unless skipped, then runs torchrun with one process per device under
the supervisor (trainer/distributed/torchrun.py).

`--direct` runs the verb as this node's one process instead, with no rendezvous, preflight or torchrun: for a verb
that starts trainers of its own (a sweep's worker, trainer/sweep/worker.py, whose trials are each a `trainer train`
with the node's GPUs), which must not run as a torchrun rank (its trials would then see LOCAL_RANK and train as one
rank of that world, trainer/distributed/local.py under_torchrun).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from trainer.contract.image import efa_environment
from trainer.distributed.torchrun import (
    MASTER_PORT,
    PREFLIGHT_PORT,
    LaunchError,
    add_supervision_arguments,
    devices_per_node,
    supervise,
    torchrun_command,
)
from trainer.launch import batch, jobset
from trainer.preflight.command import STATUS_FILE_ENV, launcher_status


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
        "--direct",
        action="store_true",
        help="run the verb as this node's only process, not under torchrun (a verb that starts its own trainers)",
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
    if args.direct:
        direct = [sys.executable, "-m", "trainer", *args.verb]
        if args.dry_run:
            print(shlex.join(direct))
            return 0
        sys.stdout.flush()
        os.execv(direct[0], direct)  # this process becomes the verb: the container's signals reach it
    try:
        backend = jobset if jobset.in_jobset(os.environ) else batch
        rdzv = backend.rendezvous_from_env(os.environ)
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
