"""`python -m trainer train`: one process of a (TP, PP, DP) training run; torchrun starts one per device.

Read top to bottom: check the config against the launched world, start the process groups, build data, model,
optimizer and schedule, resume from the newest checkpoint, then loop: one optimizer step over a global batch,
log, evaluate, save.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
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

from trainer import checkpoint, model, parallel, standalone
from trainer.arguments import positive_int
from trainer.arithmetic import model_flops_per_sequence
from trainer.config import ConfigError, ModelConfig, TrainConfig, load_config, validate_run
from trainer.data.datasets import build_gpt_datasets
from trainer.data.sampler import sample_batches
from trainer.data.tokenizer import load_tokenizer
from trainer.metrics import MetricsLogger, peak_memory_gib, peak_tflops_per_device
from trainer.optimizer import build_optimizer, build_scheduler
from trainer.parallel import ParallelDims


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


def main(args: argparse.Namespace) -> int:
    console = Console(
        stderr=True, highlight=False, soft_wrap=True, quiet=int(os.environ.get("RANK", "0")) != 0
    )
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
    if not standalone.under_torchrun():
        standalone.exec_torchrun(world_size, _verb_args(args))
    dims = parallel.initialize(cfg)
    try:
        train(cfg, dims, console, fresh=args.fresh)
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
    same fields for data and the same methods (trainer/deepspeed_engine.py)."""

    cfg: TrainConfig
    dims: ParallelDims
    chunks: list[torch.nn.Module]  # one per virtual pipeline stage, each under megatron's DDP
    optimizer: MegatronOptimizer
    scheduler: OptimizerParamScheduler
    train_data: Dataset
    valid_data: Dataset
    padded_vocab_size: int
    model_record: checkpoint.ModelRecord  # what each checkpoint records about the model

    def train_step(self, batches: list[Iterator]) -> tuple[float, float, float]:
        return train_step(self, batches)

    def evaluate(self) -> float:
        return evaluate(self)

    def save(self, progress: checkpoint.Progress) -> Path:
        c = self.cfg.checkpoint
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
        from trainer import deepspeed_engine  # imports DeepSpeed, which megatron runs do without

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


def train(cfg: TrainConfig, dims: ParallelDims, console: Console, *, fresh: bool = False) -> None:
    """The whole run on this rank: build, resume, then step, log, evaluate and save until train_iters."""
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
    try:
        while progress.step < s.train_iters:
            started = time.perf_counter()
            loss, grad_norm, lr = run.train_step(batches)
            step_time = time.perf_counter() - started
            progress.step += 1
            progress.consumed_samples += s.global_batch_size
            step, last = progress.step, progress.step == s.train_iters
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
                )
            if last or (cfg.checkpoint.save_interval and step % cfg.checkpoint.save_interval == 0):
                saved = run.save(progress)
                console.print(f"step {step}: saved {saved}")
    finally:
        if logger is not None:
            logger.close()


def train_step(run: Run, batches: list[Iterator]) -> tuple[float, float, float]:
    """One optimizer step over a global batch: micro-batches through the pipeline, then clip and AdamW.
    Returns the mean loss, the gradient norm before clipping and the learning rate the step used."""
    for chunk in run.chunks:
        chunk.zero_grad_buffer()
    run.optimizer.zero_grad()
    loss = forward_backward(run, batches)
    lr = run.optimizer.param_groups[0]["lr"]
    _, grad_norm, _ = run.optimizer.step()  # gradients were reduced over DP in finalize_model_grads
    run.scheduler.step(increment=1)
    return loss, grad_norm, lr


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
    torch.distributed.all_reduce(totals, group=parallel_state.get_data_parallel_group())
    torch.distributed.all_reduce(totals, group=parallel_state.get_pipeline_model_parallel_group())
    return (totals[0] / totals[1]).item()


def _max_over_ranks(value: float) -> float:
    tensor = torch.tensor([value], device=parallel.device_type())
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return tensor.item()


def micro_batch_iterators(dataset: Dataset, consumed_samples: int, run: Run) -> list[Iterator[dict]]:
    """This DP rank's micro-batches from `consumed_samples` on, on the device; one identical stream per chunk."""
    s, device = run.cfg.schedule, parallel.device_type()

    def stream() -> Iterator[dict]:
        for batch in sample_batches(
            dataset,
            consumed_samples,
            s.global_batch_size,
            s.micro_batch_size,
            parallel_state.get_data_parallel_rank(),
            run.dims.dp,
        ):
            yield {field: tensor.to(device) for field, tensor in batch.items()}

    return [stream() for _ in range(run.dims.vp)]


def _remove_run_outputs(cfg: TrainConfig) -> None:
    shutil.rmtree(cfg.checkpoint_dir, ignore_errors=True)
    shutil.rmtree(cfg.run_dir / "tensorboard", ignore_errors=True)
    (cfg.run_dir / "metrics.jsonl").unlink(missing_ok=True)


def _resume(run: Run, console: Console) -> checkpoint.Progress:
    """Load the run's newest complete checkpoint, else checkpoint.load, if either; where training stands."""
    start = checkpoint.starting_checkpoint(run.cfg)
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
        logger.log(step, **{"loss": None, "lr": None, "grad_norm": None, "step_time_s": None, **values})
