"""`python -m trainer bench`: the CPU suite (`make bench`), or with --gpu the GPU suite (`make bench-gpu`).

Every result stands beside a baseline measured in the same run, and the ratio between them:
- data preparation tokens/s: `prepare` against a single-process tokenizer loop writing the same files;
- training tokens/s at the config's layout (local.yaml: TP=2 x PP=2) against TP=1 x PP=1, same global batch;
- step time at the config's precision (local.yaml: auto, what this machine computes natively) against the other;
- pipeline idle: the share of a step each stage spends in send/receive, against (p-1)/(m+p-1);
- checkpoint save and load GB/s against the disk's sequential write speed; the stall of a background save against
  a synchronous save; the load at TP=1 x PP=1 against the load at the layout it was saved at;
- the trainer's step (logging included) against a bare megatron-core loop of the same shape, fp32;
- peak memory per GPU: the planner's estimate against the measured peak, for several layouts;
- a hyperparameter sweep (TPE with pruning) against the recipe's own values and random search without pruning at
  the same trial-step budget, over 3 sampler seeds: held-out loss and trial-steps (`--only sweep` runs this alone);
- the local server (`trainer serve`) against `trainer generate` on the same prompts: tokens/s and time to the first
  token, and a bounded load test of the server on 127.0.0.1 (`--only serving` runs this alone).
Written to <out>/bench.json and printed as a table. See docs/bench.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainer.bench.data import bench_data
from trainer.bench.disk import sequential_write_gbytes_per_s
from trainer.bench.report import add_memory_results, add_result, machine
from trainer.bench.serving import bench_serving
from trainer.bench.sweep import SWEEP, bench_sweep
from trainer.bench.training import (
    BenchError,
    Layout,
    MeasuredRun,
    checkpoint_throughput,
    pipeline_idle,
    run_overhead,
    run_worker,
    steady_blocking,
    step_seconds,
    tokens_per_s,
)
from trainer.config import ConfigError, load_config
from trainer.config.precision import precision_note

SINGLE = ("parallel.tensor_model_parallel_size=1", "parallel.pipeline_model_parallel_size=1")
# Checkpoint throughput needs a checkpoint large enough that writing it, not starting the writers, takes the time:
# the config's layout with a wider model (about 38 M parameters, 0.5 GB with optimizer state).
WIDER = (
    "model.hidden_size=768",
    "model.ffn_hidden_size=2048",
    "model.num_attention_heads=12",
    "model.num_query_groups=4",
)
# More layouts for the memory model: recompute, interleaving, data parallelism, a sequence where attention dominates.
MEMORY_LAYOUTS = (
    Layout(
        "tp1-pp2-interleaved",
        2,
        (
            "parallel.tensor_model_parallel_size=1",
            "parallel.virtual_pipeline_model_parallel_size=2",
            "schedule.micro_batch_size=4",
        ),
    ),
    Layout("dp2", 2, (*SINGLE, "schedule.micro_batch_size=8")),  # local.yaml's one micro-batch of 16, split
    Layout(
        "seq512-selective",
        1,
        (*SINGLE, "parallel.recompute=selective", "data.seq_length=512", "schedule.micro_batch_size=4"),
    ),
    Layout(
        "seq512-full",
        1,
        (*SINGLE, "parallel.recompute=full", "data.seq_length=512", "schedule.micro_batch_size=4"),
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", type=Path, help="default: trainer/configs/local.yaml (--gpu: bench-gpu.yaml)"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/bench"), help="default: %(default)s")
    parser.add_argument(
        "--steps", type=int, default=20, help="timed training steps per layout (default %(default)s)"
    )
    parser.add_argument("--gpu", action="store_true", help="the GPU suite (needs CUDA): make bench-gpu")
    parser.add_argument(
        "--only",
        choices=("sweep", "serving"),
        help="one section alone: sweep (the sweep against the recipe and random search, 3 sampler seeds: 11 minutes on "
        "2 quiet cores, about an hour on loaded ones), serving (the local server "
        "against trainer generate, and a load test; about two minutes)",
    )


def main(args: argparse.Namespace) -> int:
    console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 150)
    errors = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        if args.gpu:
            from trainer.bench.gpu import GPU_CONFIG, require_cuda, run_gpu_suite

            require_cuda()
            report = run_gpu_suite(args.config or GPU_CONFIG, args.out, steps=args.steps)
            name = "bench-gpu.json"
        elif args.only == "sweep":
            report = {"machine": machine(), "config": str(SWEEP), "results": [], "details": {}}
            bench_sweep(report, args.out)
            name = "bench-sweep.json"
        elif args.only == "serving":
            report = {
                "machine": machine(),
                "config": "trainer/configs/local.yaml",
                "results": [],
                "details": {},
            }
            bench_serving(report, args.out)
            name = "bench-serving.json"
        else:
            report = run_suite(args.config or Path("trainer/configs/local.yaml"), args.out, steps=args.steps)
            name = "bench.json"
    except (BenchError, ConfigError) as error:
        errors.print(f"[bold red]bench:[/] {escape(str(error))}")
        return 2
    path = write_report(report, args.out / name)
    print_report(console, report)
    console.print(f"wrote {path}")
    return 0


def run_suite(
    config: Path,
    out: Path,
    *,
    steps: int,
    parallel_processes: int | None = None,
    memory_layouts: Sequence[Layout] = MEMORY_LAYOUTS,
    checkpoint_overrides: tuple[str, ...] = WIDER,
    disk_bytes: int = 512 << 20,
    data_inputs: Sequence[str] = (),
    data_globs: Sequence[str] = ("*.py",),
    sweep: Path | None = SWEEP,
    serving: bool = True,
) -> dict:
    """The CPU suite. The data section tokenizes the standard library (or `data_inputs`) with the config's
    tokenizer; training runs the config's own layout against TP=1 x PP=1."""
    cfg = load_config(config)
    report: dict[str, Any] = {"machine": machine(), "config": str(config), "results": [], "details": {}}
    disk = sequential_write_gbytes_per_s(out / "disk", disk_bytes)
    report["details"]["disk_write_gbytes_per_s"] = disk

    data = bench_data(
        out / "data", cfg.data.tokenizer_path, data_inputs, stdlib=not data_inputs, globs=data_globs
    )
    report["details"]["data"] = data
    add_result(
        report,
        "data preparation",
        "tokens/s",
        data["ours_tokens_per_s"],
        f"single-process tokenizer loop{'' if data['identical_output'] else ' (OUTPUT DIFFERS)'}",
        data["baseline_tokens_per_s"],
    )
    add_result(
        report,
        "data preparation, per worker",
        "tokens/CPU-s",
        data["ours_tokens_per_worker_cpu_s"],
        "tokenizer alone, one thread",
        data["tokenizer_tokens_per_cpu_s"],
    )

    p = cfg.parallel
    parallel = Layout(
        f"tp{p.tensor_model_parallel_size}-pp{p.pipeline_model_parallel_size}",
        parallel_processes or p.model_parallel_size * (p.data_parallel_size or 1),
        (),
    )
    baseline = run_worker(config, Layout("tp1-pp1", 1, SINGLE), out / "runs", steps=steps)
    # Without a wider model to checkpoint, the parallel run itself saves and loads.
    measured = run_worker(config, parallel, out / "runs", steps=steps, checkpoint=not checkpoint_overrides)
    add_result(
        report,
        f"training {parallel.name}",
        "tokens/s",
        tokens_per_s(measured),
        "tp1-pp1, same global batch",
        tokens_per_s(baseline),
    )
    other = "fp32" if cfg.precision == "bf16" else "bf16"
    at_other = run_worker(
        config,
        Layout(f"{parallel.name}-{other}", parallel.processes, (f"precision={other}",)),
        out / "runs",
        steps=steps,
    )
    report["details"]["precision"] = precision_note(cfg)
    add_result(
        report,
        f"step time {parallel.name} {cfg.precision}{' (auto)' if cfg.precision_choice else ''}",
        "s",
        step_seconds(measured),
        f"{other}, same layout",
        step_seconds(at_other),
    )
    if p.pipeline_model_parallel_size > 1:
        idle = pipeline_idle(measured)
        report["details"]["pipeline_idle"] = idle
        add_result(
            report,
            f"pipeline idle {parallel.name}",
            "share of step",
            idle["measured_mean"],
            f"(p-1)/(m+p-1), m={idle['micro_batches']}",
            idle["bubble"],
        )
    add_checkpoint_results(report, config, parallel, measured, out, disk, checkpoint_overrides)
    add_overhead_results(report, config, parallel.processes, out, steps)

    runs = [
        baseline,
        measured,
        *(run_worker(config, layout, out / "runs", steps=0) for layout in memory_layouts),
    ]
    add_memory_results(report, runs)
    if sweep is not None:
        bench_sweep(report, out, sweep)
    if serving:
        bench_serving(report, out)
    return report


def add_checkpoint_results(
    report: dict,
    config: Path,
    parallel: Layout,
    measured: MeasuredRun,
    out: Path,
    disk: float,
    checkpoint_overrides: tuple[str, ...],
) -> None:
    """Save and load throughput against the disk, the stall of a background save against a synchronous save,
    and the load at another layout (TP=1 x PP=1) against the load at the same one."""
    if checkpoint_overrides:
        wider = Layout(f"{parallel.name}-wider", parallel.processes, checkpoint_overrides)
        saved = checkpoint_throughput(run_worker(config, wider, out / "runs", steps=0, checkpoint=True))
        other = Layout("tp1-pp1-wider", 1, (*SINGLE, *checkpoint_overrides))
    else:
        saved = checkpoint_throughput(measured)
        other = Layout("tp1-pp1-load", 1, SINGLE)
    elsewhere = run_worker(config, other, out / "runs", steps=0, load=Path(saved["checkpoint"]))
    saved["load_seconds_other_layout"] = elsewhere.ranks[0]["load"]["load_seconds"]
    report["details"]["checkpoint"] = saved
    size = f"{saved['bytes'] / 1e9:.2f} GB checkpoint"
    add_result(
        report, f"checkpoint save ({size})", "GB/s", saved["save_gbytes_per_s"], "disk sequential write", disk
    )
    add_result(
        report, f"checkpoint load ({size})", "GB/s", saved["load_gbytes_per_s"], "disk sequential write", disk
    )
    add_result(
        report,
        "checkpoint stall per background save, steady state",
        "s",
        steady_blocking(saved),
        "synchronous save",
        saved["save_seconds"],
    )
    add_result(
        report,
        "checkpoint stall of a run's first background save",
        "s",
        saved["background_saves"][0]["blocking_seconds"],
        "synchronous save",
        saved["save_seconds"],
    )
    add_result(
        report,
        "checkpoint hashing while writing (every byte, each rank its share)",
        "s",
        saved["hash_seconds"],
        "synchronous save",
        saved["save_seconds"],
    )
    add_result(
        report,
        "checkpoint digest of every byte (verify before a load)",
        "s",
        saved["verify_seconds"],
        "synchronous save",
        saved["save_seconds"],
    )
    add_result(
        report,
        f"checkpoint load at {other.name} ({size})",
        "s",
        saved["load_seconds_other_layout"],
        f"load at {parallel.name}",
        saved["load_seconds"],
    )


def add_overhead_results(report: dict, config: Path, processes: int, out: Path, steps: int) -> None:
    """The trainer's loop iteration (logging included) against a bare megatron-core loop, fp32."""
    overhead = run_overhead(config, processes, out / "runs", steps=steps)
    report["details"]["overhead"] = overhead
    add_result(
        report,
        "trainer step, logging included (fp32)",
        "s",
        overhead["trainer"],
        "bare megatron-core loop",
        overhead["bare"],
    )


def write_report(report: dict, path: Path) -> Path:
    report["machine"]["load_average_1m_at_end"] = os.getloadavg()[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temporary.write_text(json.dumps(report, indent=1) + "\n")
    temporary.replace(path)
    return path


def print_report(console: Console, report: dict) -> None:
    m = report["machine"]
    console.print(
        f"[bold]bench[/] on {m['gpu'] or m['cpu']} ({m['cpus_usable']} CPUs, load {m['load_average_1m_at_start']:.1f} "
        f"at start), {report['config']}"
    )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("result", "value", "unit", "baseline", "baseline value", "ratio"):
        table.add_column(column, justify="left" if column in ("result", "unit", "baseline") else "right")
    for r in report["results"]:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "n/a"
        table.add_row(
            r["name"], _number(r["value"]), r["unit"], r["baseline"], _number(r["baseline_value"]), ratio
        )
    console.print(table)


def _number(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
