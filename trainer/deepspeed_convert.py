"""`python -m trainer convert` between DeepSpeed and trainer (megatron) checkpoints, so that a model trained with
ZeRO continues with tensor/pipeline parallelism and back.

    convert --config CFG --from-deepspeed CKPT --out DIR   a DeepSpeed checkpoint -> DIR/iter_N/ (megatron) + DIR/latest
    convert --config CFG --to-deepspeed CKPT --out DIR     a trainer checkpoint -> DIR/iter_N/ (DeepSpeed) + DIR/latest

What carries over: the full fp32 weights (exact: both engines name them alike), the step, the consumed samples and
the LR schedule. Adam's moments start again from zero: each engine shards them its own way. CKPT is a checkpoint
directory or a directory of them with `latest`; CFG is the run's config (its model, data and, for DeepSpeed, zero
sections). The run that continues sets `checkpoint.dir: DIR` and resumes at any layout of its engine.

One process converts, at TP = PP = DP = 1 in fp32, so it holds the whole model (twice, to DeepSpeed). The output
is written as DIR/iter_N.tmp and renamed when complete; DIR must not exist.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from megatron.core.utils import unwrap_model

from trainer import checkpoint, deepspeed_engine, megatron_compat, parallel, standalone, train
from trainer.config import ConfigError, ParallelConfig, TrainConfig, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-deepspeed", type=Path, metavar="CKPT", help="a DeepSpeed checkpoint")
    source.add_argument("--to-deepspeed", type=Path, metavar="CKPT", help="a trainer (megatron) checkpoint")
    parser.add_argument("--out", type=Path, required=True, help="the checkpoint directory to create")
    parser.add_argument("--config", required=True, help="the run's config: its model and data sections")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE", help="repeatable"
    )


def main(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config, args.overrides)
        if args.out.exists():
            raise ConfigError([f"--out {args.out} exists; convert never overwrites: give a new directory"])
        source = _checkpoint(args.from_deepspeed or args.to_deepspeed, deepspeed=bool(args.from_deepspeed))
    except ConfigError as error:
        print(f"convert: {error}", file=sys.stderr)
        return 2
    if not standalone.under_torchrun():
        standalone.exec_torchrun(1, _verb_args(args))
    with tempfile.TemporaryDirectory() as cache:
        # fp32 at TP = PP = DP = 1: the weights stay exact; the sample indices go to a scratch cache.
        cfg = cfg.model_copy(
            update={
                "precision": "fp32",
                "parallel": ParallelConfig(),
                "data": cfg.data.model_copy(update={"cache_dir": cache}),
                "checkpoint": cfg.checkpoint.model_copy(update={"dir": str(args.out), "keep_last": 1}),
            }
        )
        saved = _from_deepspeed(cfg, source) if args.from_deepspeed else _to_deepspeed(cfg, source)
    print(f"convert: {source} -> {saved}", file=sys.stderr)
    return 0


def _verb_args(args: argparse.Namespace) -> list[str]:
    """This command line again, for the process torchrun starts."""
    source = ["--from-deepspeed", str(args.from_deepspeed)] if args.from_deepspeed else []
    source = source or ["--to-deepspeed", str(args.to_deepspeed)]
    overrides = [arg for override in args.overrides for arg in ("--set", override)]
    return ["convert", *source, "--out", str(args.out), "--config", args.config, *overrides]


def _checkpoint(path: Path, *, deepspeed: bool) -> Path:
    """The checkpoint itself, or the one `latest` names in a directory of them; of the format asked for."""
    found = checkpoint.latest_checkpoint(path) or path
    is_deepspeed = any(found.glob("*model_states.pt"))
    is_megatron = (found / "metadata.json").is_file()
    flag, kind = (
        ("--from-deepspeed", "a DeepSpeed") if deepspeed else ("--to-deepspeed", "a trainer (megatron)")
    )
    if not (is_deepspeed if deepspeed else is_megatron):
        other = (
            " (it is a DeepSpeed one)" if is_deepspeed else " (it is a trainer one)" if is_megatron else ""
        )
        raise ConfigError([f"{flag} {path}: not {kind} checkpoint or a directory of them{other}"])
    return found


def _from_deepspeed(cfg: TrainConfig, source: Path) -> Path:
    weights = deepspeed_engine.full_state_dict(source)
    saved = deepspeed_engine.trainer_state(source)
    cfg = cfg.model_copy(update={"engine": "megatron"})
    dims = parallel.initialize(cfg)
    try:
        run = train.build(cfg, dims)
        (chunk,) = unwrap_model(run.chunks)
        deepspeed_engine.copy_full_weights(dict(chunk.named_parameters()), weights)
        run.optimizer.reload_model_params()  # fp32 masters from the weights just set
        megatron_compat.prepare_torch_adam_for_load(run.optimizer)  # Adam's state at step 0, so that it saves
        run.scheduler.load_state_dict(saved["scheduler"])
        return run.save(checkpoint.Progress(**saved["progress"]))
    finally:
        parallel.shutdown()


def _to_deepspeed(cfg: TrainConfig, source: Path) -> Path:
    dims = parallel.initialize(cfg.model_copy(update={"engine": "megatron"}))
    try:
        megatron_run = train.build(cfg.model_copy(update={"engine": "megatron"}), dims)
        progress = megatron_run.load(source)  # reshards from any saved layout
        (chunk,) = unwrap_model(megatron_run.chunks)
        weights = {name: param.detach().clone() for name, param in chunk.named_parameters()}
        scheduler_state = megatron_run.scheduler.state_dict()
        del megatron_run, chunk
        run = deepspeed_engine.build(cfg.model_copy(update={"engine": "deepspeed"}), dims)
        deepspeed_engine.set_full_weights(run.engine, weights)
        run.scheduler.load_state_dict(scheduler_state)
        return run.save(progress)
    finally:
        parallel.shutdown()
