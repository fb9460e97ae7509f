"""`python -m trainer train`: one process of a (TP, PP, DP) training run; torchrun starts one per device.

Read top to bottom: check the config against the launched world, start the process groups, build data, model,
optimizer and schedule, resume from the newest checkpoint, then loop: one optimizer step over a global batch
(skipped when its loss or gradient norm is not finite), log, evaluate, save, and stop at a step boundary when
any rank got SIGTERM (trainer/faults.py).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from megatron.core import parallel_state
from megatron.core.optimizer import MegatronOptimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.pipeline_parallel import get_forward_backward_func
from rich.console import Console
from rich.markup import escape
from torch.utils.data import Dataset

from trainer import faults
from trainer.arguments import positive_int
from trainer.checkpoint import megatron as checkpoint
from trainer.config import ConfigError, ModelConfig, TrainConfig, load_config, validate_run
from trainer.data.datasets import build_gpt_datasets
from trainer.data.sampler import sample_batches
from trainer.data.tokenizer import load_tokenizer
from trainer.distributed import fast_path, parallel
from trainer.distributed.optimizer import build_optimizer, build_scheduler
from trainer.distributed.parallel import ParallelDims
from trainer.launch import batch as launch
from trainer.launch import local as standalone
from trainer.metrics import MetricsLogger, peak_memory_gib, peak_tflops_per_device
from trainer.model import llama as model
from trainer.model.flops import model_flops_per_sequence


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
        "--nproc",
        type=positive_int,
        help="outside torchrun: processes to start (default: one per GPU, or TP x PP x DP on CPU)",
    )
    launch.add_supervision_arguments(parser)


def main(args: argparse.Namespace) -> int:
    rank = int(os.environ.get("RANK", "0"))
    console = Console(stderr=True, highlight=False, soft_wrap=True, quiet=rank != 0)
    # First, so that a SIGTERM during start-up is kept for the first step boundary too.
    stop = faults.StopRequest() if standalone.under_torchrun() else None
    if args.finetune:
        args.overrides.append("checkpoint.finetune=true")
    try:
        cfg = load_config(args.config, args.overrides)
        if standalone.under_torchrun():
            world_size = int(os.environ["WORLD_SIZE"])
        else:
            world_size = standalone.processes(cfg, args.nproc)
        validate_run(cfg, world_size, parallel.device_type())
        problems = checkpoint.start_problems(cfg, resolved_model(cfg), fresh=args.fresh)
        if problems:
            raise ConfigError(problems)
    except ConfigError as error:
        console.print(f"[bold red]train:[/] {escape(str(error))}")
        return 2
    if stop is None:
        return standalone.run_torchrun(
            world_size, _verb_args(args), args.max_restarts, args.stop_grace_seconds
        )
    dims = parallel.initialize(cfg)
    try:
        train(cfg, dims, console, fresh=args.fresh, stop=stop)
    except (faults.TrainingStopped, checkpoint.CheckpointSaveError) as error:
        console.print(f"[bold red]train:[/] {escape(str(error))}")  # every rank raised it; rank 0 says so
        return 1
    except RuntimeError as error:
        message = faults.collective_failure(error, cfg.parallel.distributed_timeout_minutes)
        if message is None:
            raise
        print(f"train: rank {rank}: {message}", file=sys.stderr, flush=True)  # each rank saw its own
        return 1
    finally:
        parallel.shutdown()
    return 0


def _verb_args(args: argparse.Namespace) -> list[str]:
    """This command line again, for each process torchrun starts."""
    overrides = [arg for override in args.overrides for arg in ("--set", override)]
    return ["train", "--config", args.config, *overrides, *(["--fresh"] if args.fresh else [])]


@dataclass
class Run:
    """What one training process holds: its model chunks, optimizer, LR schedule and data.

    The loop in train() calls only the four methods at the end; `engine: deepspeed` brings its own Run with the
    same fields for data and the same methods (trainer/engines/deepspeed.py)."""

    cfg: TrainConfig
    dims: ParallelDims
    chunks: list[torch.nn.Module]  # one per virtual pipeline stage, each under megatron's DDP
    optimizer: MegatronOptimizer
    scheduler: OptimizerParamScheduler
    train_data: Dataset
    valid_data: Dataset
    padded_vocab_size: int
    model_record: checkpoint.ModelRecord  # what each checkpoint records about the model

    def train_step(
        self, batches: list[Iterator], step: int | None = None
    ) -> tuple[float, float, float, bool]:
        return train_step(self, batches, step)

    def evaluate(self) -> float:
        with fast_path.weights_gathered(self.chunks, self.cfg.parallel.overlap_param_gather):
            return evaluate(self)

    def save(self, progress: checkpoint.Progress) -> Path:
        c = self.cfg.checkpoint
        with fast_path.weights_gathered(self.chunks, self.cfg.parallel.overlap_param_gather):
            return checkpoint.save(
                self.cfg.checkpoint_dir,
                self.chunks,
                self.optimizer,
                self.scheduler,
                progress,
                self.dims,
                c.keep_last,
                self.model_record,
            )

    def load(self, path: Path, *, weights_only: bool = False) -> checkpoint.Progress:
        return checkpoint.load(
            path, self.chunks, self.optimizer, self.scheduler, self.dims, weights_only=weights_only
        )


def resolved_model(cfg: TrainConfig) -> ModelConfig:
    """The model section with its vocabulary size set: the tokenizer's unless the config gives one."""
    vocab_size = cfg.model.vocab_size or load_tokenizer(cfg.data.tokenizer_path).vocab_size
    return cfg.model.model_copy(update={"vocab_size": vocab_size})


def build(cfg: TrainConfig, dims: ParallelDims) -> Run:
    """Data, model, optimizer and LR schedule for this rank, initialized from the seed."""
    if cfg.engine == "deepspeed":
        from trainer.engines import (
            deepspeed as deepspeed_engine,  # imports DeepSpeed, which megatron runs do without
        )

        return deepspeed_engine.build(cfg, dims)
    train_data, valid_data = datasets(cfg)
    # Model: Llama on megatron-core, split over TP and PP, each chunk under megatron's DDP.
    model_config = resolved_model(cfg)
    config = model.transformer_config(cfg, parallel.device_type())
    padded_vocab_size = model_config.padded_vocab_size(model_config.vocab_size)
    chunks = parallel.wrap_data_parallel(model.build_model(cfg, config, padded_vocab_size), cfg, config)
    optimizer = build_optimizer(cfg, chunks)
    parallel.connect_schedule(config, chunks, optimizer, cfg)
    scheduler = build_scheduler(cfg, optimizer)
    record = checkpoint.ModelRecord(model_config, cfg.data.seq_length)
    return Run(cfg, dims, chunks, optimizer, scheduler, train_data, valid_data, padded_vocab_size, record)


def datasets(cfg: TrainConfig) -> tuple[Dataset, Dataset]:
    """Train and validation samples: megatron-core GPTDatasets over the prepared blend, in the seed's order."""
    s = cfg.schedule
    train_data, valid_data, _ = build_gpt_datasets(
        prefixes=cfg.data.prefixes,
        weights=cfg.data.weights,
        split=cfg.data.split,
        seq_length=cfg.data.seq_length,
        seed=cfg.seed,
        # Every evaluation reads the same validation samples, so its losses compare over time.
        num_samples=(s.train_iters * s.global_batch_size, s.eval_iters * s.global_batch_size, 0),
        tokenizer_path=cfg.data.tokenizer_path,
        cache_dir=cfg.data.cache_dir or str(cfg.run_dir / "data-cache"),
    )
    return train_data, valid_data


def train(
    cfg: TrainConfig,
    dims: ParallelDims,
    console: Console,
    *,
    fresh: bool = False,
    stop: faults.StopRequest | None = None,
) -> None:
    """The whole run on this rank: build, resume, then step, log, evaluate and save until train_iters, or until
    a rank got SIGTERM (then save and return)."""
    s = cfg.schedule
    if fresh and torch.distributed.get_rank() == 0:
        _remove_run_outputs(cfg)
    torch.distributed.barrier()
    console.print(f"[bold]{cfg.name}[/]: {dims} on {parallel.device_type()}, run directory {cfg.run_dir}")
    run = build(cfg, dims)
    progress = _resume(run, console)
    if progress.step >= s.train_iters:
        console.print(
            f"already trained to step {progress.step} of {s.train_iters}; nothing to do "
            "(make train FRESH=1, or --fresh, starts over)"
        )
        return
    logger = _metrics_logger(run, progress.step, console) if torch.distributed.get_rank() == 0 else None
    if progress.step == 0:
        _log(logger, 0, val_loss=run.evaluate())  # the untrained model: where the loss starts
    batches = micro_batch_iterators(run.train_data, progress.consumed_samples, run)
    skips = faults.SkipCounter(cfg.optimizer.max_consecutive_skips, total=progress.skipped_steps)
    saved_step = progress.step
    try:
        while progress.step < s.train_iters:
            if stop is not None and stop.agreed():
                if progress.step != saved_step:
                    _save(run, progress, console)
                console.print(f"step {progress.step}: stopped on SIGTERM; resume by running the same command")
                return
            started = time.perf_counter()
            try:
                loss, grad_norm, lr, skipped = run.train_step(batches, step=progress.step + 1)
            except RuntimeError as error:
                error.add_note(f"in step {progress.step + 1}")
                raise
            step_time = time.perf_counter() - started
            progress.step += 1
            progress.consumed_samples += s.global_batch_size
            step, last = progress.step, progress.step == s.train_iters
            skips.record(step, skipped, newest_checkpoint=lambda: _newest_checkpoint(cfg))
            progress.skipped_steps = skips.total
            if skipped:
                console.print(
                    f"step {step}: skipped, no update (loss {loss:.4g}, gradient norm {grad_norm:.4g}); "
                    f"{skips.in_a_row} in a row (the run stops at {skips.limit}), {skips.total} in all"
                )
            val_loss = run.evaluate() if step % s.eval_interval == 0 or last else None
            if step % cfg.logging.log_interval == 0 or val_loss is not None:
                memory = _max_over_ranks(peak_memory_gib())
                _log(
                    logger,
                    step,
                    loss=loss,
                    lr=lr,
                    grad_norm=grad_norm,
                    step_time_s=step_time,
                    val_loss=val_loss,
                    peak_memory=memory,
                    skipped_steps=skips.total,
                )
            if last or (cfg.checkpoint.save_interval and step % cfg.checkpoint.save_interval == 0):
                _save(run, progress, console)
                saved_step = step
    finally:
        if logger is not None:
            logger.close()


def _save(run: Run, progress: checkpoint.Progress, console: Console) -> None:
    saved = run.save(progress)
    console.print(f"step {progress.step}: saved {saved}")


def _newest_checkpoint(cfg: TrainConfig) -> Path | None:
    return checkpoint.latest_checkpoint(cfg.checkpoint_dir, warn=lambda _: None)


def train_step(
    run: Run, batches: list[Iterator], step: int | None = None
) -> tuple[float, float, float, bool]:
    """One optimizer step over a global batch: micro-batches through the pipeline, then clip and AdamW.
    Returns the mean loss, the gradient norm before clipping, the learning rate the step used, and whether it
    was skipped: with a non-finite loss or gradient norm nothing is updated, the LR schedule included. `step`
    (the step's number) is where TRAINSTACK_FAULT's step faults strike; without it none do."""
    for chunk in run.chunks:
        chunk.zero_grad_buffer()
    run.optimizer.zero_grad()
    loss = forward_backward(run, batches)
    if step is not None:
        faults.inject_in_step(step, run.chunks)
    lr = run.optimizer.param_groups[0]["lr"]
    # Every rank gets the same loss and norm (both are reduced over the ranks), so all decide alike.
    run.optimizer.prepare_grads()  # gradients were reduced over DP in finalize_model_grads
    grad_norm = float(run.optimizer.get_grad_norm())
    if not faults.SkipCounter.finite(loss, grad_norm):
        return loss, grad_norm, lr, True
    run.optimizer.step()  # megatron's bf16 path has no grad scaler: it would apply a non-finite step
    run.scheduler.step(increment=1)
    return loss, grad_norm, lr, False


def evaluate(run: Run) -> float:
    """Mean loss per token over the validation samples (the same ones every time)."""
    batches = micro_batch_iterators(run.valid_data, 0, run)
    losses = [forward_backward(run, batches, forward_only=True) for _ in range(run.cfg.schedule.eval_iters)]
    return sum(losses) / len(losses)


def forward_backward(run: Run, batches: list[Iterator], *, forward_only: bool = False) -> float:
    """Run one global batch's micro-batches (1F1B, interleaved with virtual stages); the mean loss per token."""
    s, chunks = run.cfg.schedule, run.chunks
    losses = get_forward_backward_func()(
        forward_step_func=_forward_step,
        data_iterator=batches if len(chunks) > 1 else batches[0],
        model=chunks if len(chunks) > 1 else chunks[0],
        num_microbatches=s.global_batch_size // (s.micro_batch_size * run.dims.dp),
        seq_length=run.cfg.data.seq_length,
        micro_batch_size=s.micro_batch_size,
        forward_only=forward_only,
    )
    return _mean_over_ranks(losses)


def _forward_step(batches, chunk):
    batch = next(batches)
    per_token_loss = chunk(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return per_token_loss, functools.partial(_loss_sum, batch["loss_mask"])


def _loss_sum(loss_mask: torch.Tensor, per_token_loss: torch.Tensor):
    """Summed loss and token count; megatron's schedule divides by both counts to get the mean."""
    mask = loss_mask.reshape(-1).float()
    loss = torch.sum(per_token_loss.float().reshape(-1) * mask)
    tokens = mask.sum().to(torch.int)
    return loss, tokens, {"lm loss": torch.stack([loss.detach(), mask.sum()])}


def _mean_over_ranks(losses: list[dict]) -> float:
    """The global batch's mean loss per token on every rank: only the last pipeline stage computes it."""
    totals = torch.zeros(2, device=parallel.device_type())
    for loss in losses:
        totals += loss["lm loss"].to(totals.device)
    # Context-parallel ranks hold parts of the same sequences: their sums add up too.
    torch.distributed.all_reduce(
        totals, group=parallel_state.get_data_parallel_group(with_context_parallel=True)
    )
    torch.distributed.all_reduce(totals, group=parallel_state.get_pipeline_model_parallel_group())
    return (totals[0] / totals[1]).item()


def _max_over_ranks(value: float) -> float:
    tensor = torch.tensor([value], device=parallel.device_type())
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return tensor.item()


def micro_batch_iterators(dataset: Dataset, consumed_samples: int, run: Run) -> list[Iterator[dict]]:
    """This DP rank's micro-batches from `consumed_samples` on, on the device (this CP rank's part of each
    sequence); one identical stream per chunk. On GPUs the samples are collated into pinned host memory and copied
    without blocking the host, which queues the copy ahead of the micro-batch's kernels."""
    s, device = run.cfg.schedule, parallel.device_type()
    pinned = device == "cuda"

    def stream() -> Iterator[dict]:
        for batch in sample_batches(
            dataset,
            consumed_samples,
            s.global_batch_size,
            s.micro_batch_size,
            parallel_state.get_data_parallel_rank(),
            run.dims.dp,
            pin_memory=pinned,
        ):
            on_device = {field: tensor.to(device, non_blocking=pinned) for field, tensor in batch.items()}
            yield fast_path.this_context_parallel_rank(on_device) if run.dims.cp > 1 else on_device

    return [stream() for _ in range(run.dims.vp)]


def _remove_run_outputs(cfg: TrainConfig) -> None:
    shutil.rmtree(cfg.checkpoint_dir, ignore_errors=True)
    shutil.rmtree(cfg.run_dir / "tensorboard", ignore_errors=True)
    (cfg.run_dir / "metrics.jsonl").unlink(missing_ok=True)


def _resume(run: Run, console: Console) -> checkpoint.Progress:
    """Load the run's newest intact checkpoint, else checkpoint.load, if either; where training stands. Rank 0
    picks it (warning about damaged ones) and tells the others, so that every rank loads the same one."""
    found = [checkpoint.starting_checkpoint(run.cfg) if torch.distributed.get_rank() == 0 else None]
    torch.distributed.broadcast_object_list(found, src=0)
    start = found[0]
    if start is None:
        return checkpoint.Progress()
    progress = run.load(start.path, weights_only=start.weights_only)
    source = checkpoint.read_record(start.path)
    if source is not None and source.hf_config:  # carried along, so that an export writes it back
        run.model_record = replace(run.model_record, hf_config=source.hf_config)
    if not start.resumed and progress.step == 0:
        console.print(
            f"started from the weights in {start.path} (checkpoint.load): new optimizer and LR schedule"
        )
    else:
        what = "resumed from" if start.resumed else "continued from checkpoint.load"
        console.print(
            f"{what} {start.path} (step {progress.step}, {progress.consumed_samples:,} samples seen)"
        )
    return progress


def _metrics_logger(run: Run, start_step: int, console: Console) -> MetricsLogger:
    cfg, s = run.cfg, run.cfg.schedule
    flops_per_sequence = model_flops_per_sequence(cfg.model, cfg.data.seq_length, run.padded_vocab_size)
    return MetricsLogger(
        cfg.run_dir,
        train_iters=s.train_iters,
        start_step=start_step,
        flops_per_step=flops_per_sequence * s.global_batch_size,
        tokens_per_step=s.global_batch_size * cfg.data.seq_length,
        world_size=run.dims.world_size,
        peak_tflops=peak_tflops_per_device(cfg.logging.peak_tflops_per_device),
        tensorboard=cfg.logging.tensorboard,
        console=console,
    )


def _log(logger: MetricsLogger | None, step: int, **values) -> None:
    """Record a step on rank 0 (the others hold no logger); absent training values are null."""
    if logger is not None:
        absent = {"loss": None, "lr": None, "grad_norm": None, "step_time_s": None, "skipped_steps": None}
        logger.log(step, **{**absent, **values})
