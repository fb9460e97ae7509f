"""The trainer's step against a bare megatron-core loop of the same shape, both under torchrun in one session.

    python -m trainer.bench.overhead bare|trainer CONFIG OUT --steps N [--set key=value ...]

bare     megatron-core alone: the same model, DDP, optimizer and schedule, one fixed synthetic micro-batch,
         get_forward_backward_func, optimizer.step(), scheduler.step(); nothing else in the loop.
trainer  the production loop (trainer/loop.py train()) at the same config: data from the dataset, loss reduction,
         the non-finite check, metrics, console and progress bar; a loop iteration is timed from one
         MetricsLogger.log call to the next (log_interval 1), so the logging is counted.
OUT/<mode>.json (rank 0): every iteration's seconds after the warm-up ones.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path

import torch
from megatron.core.pipeline_parallel import get_forward_backward_func
from rich.console import Console

from trainer import loop, metrics
from trainer.config import ParallelDims, TrainConfig, load_config
from trainer.data.tokenizer import with_resolved_model
from trainer.device import device_type
from trainer.distributed import parallel
from trainer.engines.megatron import build_model_and_optimizer

WARMUP = 3  # iterations left out: allocations, first-step setup


def bare_loop(cfg: TrainConfig, dims: ParallelDims, steps: int) -> list[float]:
    cfg = with_resolved_model(cfg)
    _, chunks, optimizer, scheduler = build_model_and_optimizer(cfg)  # the trainer's model, DDP and optimizer
    s, seq = cfg.schedule, cfg.data.seq_length
    generator = torch.Generator().manual_seed(cfg.seed)
    assert cfg.model.vocab_size is not None  # with_resolved_model filled it
    tokens = torch.randint(cfg.model.vocab_size, (s.micro_batch_size, seq + 1), generator=generator)
    device = device_type()
    batch = {
        "tokens": tokens[:, :-1].contiguous().to(device),
        "labels": tokens[:, 1:].contiguous().to(device),
        "position_ids": torch.arange(seq, device=device).expand(s.micro_batch_size, seq),
    }
    count = torch.tensor(s.micro_batch_size * seq, dtype=torch.int)

    def forward_step(_, chunk):
        per_token = chunk(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
        return per_token, lambda loss: (loss.sum(), count, {"lm loss": loss.detach().sum()})

    seconds = []
    for _ in range(WARMUP + steps):
        started = time.perf_counter()
        for chunk in chunks:
            chunk.zero_grad_buffer()
        optimizer.zero_grad()
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=None,
            model=chunks[0],
            num_microbatches=s.global_batch_size // (s.micro_batch_size * dims.dp),
            seq_length=seq,
            micro_batch_size=s.micro_batch_size,
            forward_only=False,
        )
        optimizer.step()
        scheduler.step(increment=1)
        seconds.append(time.perf_counter() - started)
    return seconds[WARMUP:]


def trainer_loop(cfg: TrainConfig, dims: ParallelDims, steps: int) -> list[float]:
    logged: list[float] = []
    log = metrics.MetricsLogger.log

    def timed_log(self, *args, **values):
        result = log(self, *args, **values)
        logged.append(time.perf_counter())
        return result

    metrics.MetricsLogger.log = timed_log  # type: ignore[method-assign]  # the bench times every log call
    console = Console(stderr=True, quiet=True)
    loop.train(cfg, dims, console, fresh=True)
    # logged[0] is the untrained model's evaluation, logged[-1] the last step's (with its evaluation).
    gaps = [b - a for a, b in itertools.pairwise(logged[1:-1])]
    return gaps[WARMUP - 1 :][:steps]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m trainer.bench.overhead")
    parser.add_argument("mode", choices=["bare", "trainer"])
    parser.add_argument("config")
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    overrides = [
        *args.overrides,
        f"schedule.train_iters={WARMUP + args.steps + 2}",
        "schedule.lr_warmup_iters=0",
        "schedule.eval_interval=100000",  # evaluate at the start and the end only
        "logging.log_interval=1",
        "checkpoint.save_interval=100000",
    ]
    cfg = load_config(args.config, overrides)
    dims = parallel.initialize(cfg)
    try:
        if args.mode == "bare":
            seconds = bare_loop(cfg, dims, args.steps)
        else:
            seconds = trainer_loop(cfg, dims, args.steps)
        if torch.distributed.get_rank() == 0:
            args.out.mkdir(parents=True, exist_ok=True)
            result = {"seconds": seconds, "median": statistics.median(seconds)}
            (args.out / f"{args.mode}.json").write_text(json.dumps(result, indent=1))
    finally:
        parallel.shutdown()


if __name__ == "__main__":
    main()
