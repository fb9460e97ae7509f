"""`python -m trainer launch`: train on this machine, one process per device, through torchrun.

Checks the config against the process count first (one clear error instead of one per process), then hands
over to `torch.distributed.run ... -m trainer train`. Processes: `--nproc`, else one per GPU, else on CPU the
config's TP x PP x DP (DP defaults to 1 there).
"""

from __future__ import annotations

import argparse
import os
import sys

from rich.console import Console
from rich.markup import escape

from trainer.config import ConfigError, TrainConfig, load_config, validate_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="a YAML config, e.g. trainer/configs/local.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--nproc", type=int, help="processes to start (default: one per device)")
    parser.add_argument("--fresh", action="store_true", help="start over instead of resuming")


def processes(cfg: TrainConfig, gpus: int) -> int:
    """One per GPU; on CPU as many as the config's layout asks for."""
    if gpus:
        return gpus
    return cfg.parallel.model_parallel_size * (cfg.parallel.data_parallel_size or 1)


def main(args: argparse.Namespace) -> int:
    import torch

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    gpus = torch.cuda.device_count()
    try:
        cfg = load_config(args.config, args.overrides)
        nproc = args.nproc or processes(cfg, gpus)
        validate_run(cfg, nproc, "cuda" if gpus else "cpu")
    except ConfigError as error:
        console.print(f"[bold red]launch:[/] {escape(str(error))}")
        return 2
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    command += ["-m", "trainer", "train", "--config", args.config]
    command += [arg for override in args.overrides for arg in ("--set", override)]
    command += ["--fresh"] if args.fresh else []
    if not gpus:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # processes share the cores; more threads only contend
    console.print(f"launch: {nproc} processes on {'GPU' if gpus else 'CPU'}: {' '.join(command[1:])}")
    sys.stdout.flush()
    os.execv(sys.executable, command)
