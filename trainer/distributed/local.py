"""Training on the machine at hand: when `python -m trainer train` runs outside torchrun, it starts torchrun.

One process per GPU, or on CPU the config's TP x PP x DP (DP unset counts as 1), unless `--nproc` says
otherwise; the config has been checked against that count already, so a bad layout fails once, before any
process starts. Cluster runs come through `python -m trainer launch` (Batch variables -> torchrun) instead.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Iterator

from trainer.config import TrainConfig
from trainer.device import device_type, gpu_count
from trainer.distributed.torchrun import MASTER_PORT, Rendezvous, supervise, torchrun_command


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ


def first_attempt() -> bool:
    """False in a process torchrun restarted (TORCHELASTIC_RESTART_COUNT, torch.distributed.run) or in a later
    attempt of a Batch job (AWS_BATCH_JOB_ATTEMPT, Batch's job environment variables): those resume."""
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    attempt = int(os.environ.get("AWS_BATCH_JOB_ATTEMPT", "1") or 1)
    return restart == 0 and attempt <= 1


def processes(cfg: TrainConfig, nproc: int | None) -> int:
    if nproc:
        return nproc
    if device_type() == "cuda":
        return gpu_count()
    return cfg.parallel.model_parallel_size * (cfg.parallel.data_parallel_size or 1)


def _torchrun_command(nproc: int, verb_args: list[str], max_restarts: int) -> list[str]:
    """`torchrun --standalone` running `python -m trainer <verb_args>` N times."""
    if device_type() == "cpu":
        # The processes share the cores; more threads only contend.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    single_node = Rendezvous(nnodes=1, node_rank=0, master_addr=None)
    print(
        f"torchrun: {nproc} processes: python -m trainer {' '.join(verb_args)}", file=sys.stderr, flush=True
    )
    return torchrun_command(single_node, nproc, MASTER_PORT, max_restarts, verb_args)


def exec_torchrun(nproc: int, verb_args: list[str]) -> None:
    """Replace this process with torchrun (one-shot verbs: convert, score)."""
    command = _torchrun_command(nproc, verb_args, 0)
    os.execv(command[0], command)


def run_torchrun(nproc: int, verb_args: list[str], max_restarts: int, stop_grace_seconds: float) -> int:
    """Run torchrun under `torchrun.supervise` (SIGTERM: the ranks save and exit 0); its exit status."""
    return supervise(_torchrun_command(nproc, verb_args, max_restarts), stop_grace_seconds)


@contextlib.contextmanager
def single_process() -> Iterator[None]:
    """torch.distributed's environment for a world of one (torchrun sets it for its workers), restored after."""
    if under_torchrun():
        yield
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    names = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    )
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
