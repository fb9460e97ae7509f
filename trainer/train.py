"""`python -m trainer train`: the command.

Outside torchrun, it checks the config against the processes it will start and runs torchrun under the supervisor
(trainer/distributed/local.py); under torchrun, each process checks it again (the same checks, on the launched
world) and runs the training loop (trainer/loop.py). Outside torchrun, torch and megatron-core (about 2 CPU
seconds of imports, docs/testing.md) come in only with the checks that use them: `precision: auto` reads the CPU's
features with torch, the data checks open the dataset with megatron-core's reader, a resume reads its checkpoint.
So `--help` and a config refused by its schema or layout answer at once (trainer/device.py: no torch to ask which
device a machine without a GPU driver has).
"""

from __future__ import annotations

import argparse
import os

from rich.console import Console
from rich.markup import escape

from trainer.arguments import positive_int
from trainer.checkpoint.start import start_problems
from trainer.config import (
    ConfigError,
    ParallelDims,
    TrainConfig,
    accelerator_problems,
    layout_problems,
    load_config,
)
from trainer.cost.ledger import budget_problems
from trainer.data.datasets import data_problems
from trainer.data.tokenizer import with_resolved_model
from trainer.device import device_type
from trainer.distributed import local
from trainer.distributed.torchrun import add_supervision_arguments
from trainer.engines import problems as engine_problems
from trainer.evaluation.suite import evaluation_problems
from trainer.launch import run_lock
from trainer.monitoring import exporters


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="a YAML config, e.g. trainer/configs/local.yaml")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value; repeatable",
    )
    parser.add_argument(
        "--fresh", action="store_true", help="start over: drop this run's checkpoints and metrics"
    )
    parser.add_argument(
        "--finetune",
        action="store_true",
        help="take only the weights of checkpoint.load (same as --set checkpoint.finetune=true)",
    )
    parser.add_argument(
        "--allow-schedule-change",
        action="store_true",
        help="resume although the config changes the checkpoint's LR schedule or data settings, and apply them "
        "(same as --set checkpoint.allow_schedule_change=true)",
    )
    parser.add_argument(
        "--nproc",
        type=positive_int,
        help="outside torchrun: processes to start (default: one per GPU, or TP x PP x DP on CPU)",
    )
    parser.add_argument(
        "--sample-tokens",
        type=positive_int,
        help="after training: print a greedy sample of this many tokens from the newest checkpoint (make train)",
    )
    parser.add_argument("--sample-prompt", default="def", help="--sample-tokens: the text to continue")
    add_supervision_arguments(parser)


def main(args: argparse.Namespace) -> int:
    rank = int(os.environ.get("RANK", "0"))
    console = Console(stderr=True, highlight=False, soft_wrap=True, quiet=rank != 0)
    worker = local.under_torchrun()
    stop = None
    if worker:  # the loop's imports (torch, megatron-core) only in a training process
        from trainer import faults

        # First, so that a SIGTERM during start-up is kept for the first step boundary too.
        stop = faults.StopRequest()
    if args.finetune:
        args.overrides.append("checkpoint.finetune=true")
    if args.allow_schedule_change:
        args.overrides.append("checkpoint.allow_schedule_change=true")
    # A restarted rank (torchrun's restart, Batch's next attempt) resumes: only the first attempt starts over.
    fresh = args.fresh and local.first_attempt()
    locks: list[run_lock.RunLock] = []
    try:
        cfg = load_config(args.config, args.overrides)
        # One live run per run directory and checkpoint directory, held before anything is written there (--fresh's
        # removal included): an existing run directory at once, before the checks read its checkpoints; a new
        # one once the checks pass.
        locks = _hold_run_directory(cfg, worker) if cfg.run_dir.is_dir() else []
        world_size = int(os.environ["WORLD_SIZE"]) if worker else local.processes(cfg, args.nproc)
        # Everything checked before a training process starts work: layout, data, engine settings, checkpoint.
        device = device_type()
        problems = (
            layout_problems(cfg, world_size, device)
            # On GPUs: what the fast path needs of this machine (TransformerEngine, compute capability).
            + (accelerator_problems(cfg, *_accelerator()) if device == "cuda" else [])
            + data_problems(cfg)
            + engine_problems(cfg, world_size)
            + budget_problems(cfg.budget)
            + evaluation_problems(cfg)
        )
        if not problems:
            cfg = with_resolved_model(cfg)  # the tokenizer's vocabulary, resolved once: the run's one cfg
            problems = start_problems(cfg, cfg.model, fresh=fresh)
        problems += exporters.listen_problems(cfg.monitoring, device, world_size)
        if problems:
            raise ConfigError(problems)
        locks = locks or _hold_run_directory(cfg, worker)
    except (ConfigError, run_lock.RunHeld) as error:
        run_lock.release(locks)
        console.print(f"[bold red]train:[/] {escape(str(error))}")
        return 2
    try:
        if not worker:
            code = local.run_torchrun(
                world_size, _verb_args(args), args.max_restarts, args.stop_grace_seconds
            )
            if code == 0 and args.sample_tokens:  # the sample's imports only when it is asked for
                from trainer.evaluation.generate import sample_after_training

                sample_after_training(cfg, args.sample_prompt, args.sample_tokens)
            return code
        from trainer.loop import work

        assert stop is not None  # a torchrun worker made its StopRequest first thing
        return work(cfg, ParallelDims.from_config(cfg.parallel, world_size), console, fresh=fresh, stop=stop)
    finally:
        run_lock.release(locks)


def _hold_run_directory(cfg: TrainConfig, worker: bool) -> list[run_lock.RunLock]:
    """Outside torchrun, the supervisor takes the run's locks and hands them to its ranks; under torchrun, rank 0
    takes them unless its supervisor holds them (a cluster's `launch`, a hand-started torchrun: no one does)."""
    if not worker:
        locks = run_lock.hold(cfg.run_dir, cfg.checkpoint_dir)
        run_lock.hand_to_ranks(locks[0])
        return locks
    if int(os.environ.get("RANK", "0")) == 0 and not run_lock.held_by_supervisor(cfg.run_dir):
        return run_lock.hold(cfg.run_dir, cfg.checkpoint_dir)
    return []


def _accelerator() -> tuple[bool, tuple[int, int]]:
    from trainer.distributed import fast_path  # on GPUs only: it imports megatron-core

    return fast_path.accelerator()


def _verb_args(args: argparse.Namespace) -> list[str]:
    """This command line again, for each process torchrun starts."""
    overrides = [arg for override in args.overrides for arg in ("--set", override)]
    return ["train", "--config", args.config, *overrides, *(["--fresh"] if args.fresh else [])]
