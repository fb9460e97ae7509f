"""Measured training runs: bench workers (trainer/bench/worker.py) under torchrun, and what their per-rank
results say about throughput, pipeline idle time, checkpoint speed and the planner's memory model."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from trainer.config import ParallelDims, TrainConfig, load_config
from trainer.distributed.torchrun import Rendezvous, torchrun
from trainer.plan.memory import estimate_stages
from trainer.plan.performance import bubble_fraction
from trainer.plan.search import vocab_size

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Layout:
    name: str
    processes: int
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class MeasuredRun:
    layout: Layout
    cfg: TrainConfig
    ranks: list[dict]  # each rank's worker result, by rank

    @property
    def world_size(self) -> int:
        return self.layout.processes


class BenchError(RuntimeError):
    """A benchmark run that failed; the message carries the end of its log."""


def run_worker(
    config: Path,
    layout: Layout,
    out: Path,
    *,
    steps: int,
    checkpoint: bool = False,
    load: Path | None = None,
    timeout_s: int = 600,
    checkpoint_keep_last: int | None = None,
    background_saves: int | None = None,
) -> MeasuredRun:
    """One measured run: torchrun starts `layout.processes` bench workers on this machine."""
    run_dir = out / layout.name
    overrides = (*layout.overrides, f"logging.run_dir={run_dir / 'run'}", "logging.tensorboard=false")
    cfg = load_config(config, list(overrides))
    arguments = ["-m", "trainer.bench.worker", str(config), str(run_dir / "ranks"), "--steps", str(steps)]
    arguments += [*(["--checkpoint"] if checkpoint else []), *(["--load", str(load)] if load else [])]
    arguments += ["--checkpoint-keep-last", str(checkpoint_keep_last)] if checkpoint_keep_last else []
    arguments += ["--background-saves", str(background_saves)] if background_saves else []
    arguments += [arg for o in overrides for arg in ("--set", o)]
    _torchrun(arguments, layout.processes, run_dir, layout.name, timeout_s)
    ranks = [json.loads((run_dir / "ranks" / f"rank{r}.json").read_text()) for r in range(layout.processes)]
    return MeasuredRun(layout, cfg, ranks)


def run_overhead(config: Path, processes: int, out: Path, *, steps: int, timeout_s: int = 600) -> dict:
    """The trainer's loop against a bare megatron-core loop (trainer/bench/overhead.py) at the config's shape in
    fp32, each run twice, alternating, so that a change in the machine's load falls on both; median seconds."""
    seconds: dict[str, list[float]] = {"bare": [], "trainer": []}
    for attempt in range(2):
        for mode in seconds:
            run_dir = out / f"overhead-{mode}-{attempt}"
            overrides = ("precision=fp32", f"logging.run_dir={run_dir / 'run'}", "logging.tensorboard=false")
            arguments = [
                "-m",
                "trainer.bench.overhead",
                mode,
                str(config),
                str(run_dir),
                "--steps",
                str(steps),
            ]
            arguments += [arg for o in overrides for arg in ("--set", o)]
            _torchrun(arguments, processes, run_dir, f"overhead {mode}", timeout_s)
            seconds[mode] += json.loads((run_dir / f"{mode}.json").read_text())["seconds"]
    return {mode: statistics.median(values) for mode, values in seconds.items()} | {"seconds": seconds}


def _torchrun(arguments: list[str], processes: int, run_dir: Path, name: str, timeout_s: int) -> None:
    single_node = Rendezvous(nnodes=1, node_rank=0, master_addr=None)
    command = [*torchrun(), *single_node.torchrun_args(processes, 0, 0)]
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "log.txt"
    environment = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with log.open("w") as output:
        result = subprocess.run(
            [*command, *arguments],
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=environment,
            timeout=timeout_s,
            check=False,
        )
    if result.returncode != 0:
        raise BenchError(f"{name} failed ({result.returncode}); end of {log}:\n{log.read_text()[-4000:]}")


def step_seconds(run: MeasuredRun) -> float:
    """The median timed step (every rank starts each step together)."""
    return statistics.median(step["seconds"] for step in run.ranks[0]["steps"])


def tokens_per_s(run: MeasuredRun) -> float:
    return run.cfg.schedule.global_batch_size * run.cfg.data.seq_length / step_seconds(run)


def pipeline_idle(run: MeasuredRun) -> dict:
    """Per pipeline stage, the median share of a step spent in send/receive, against 1F1B's bubble."""
    p, s = run.cfg.parallel, run.cfg.schedule
    micro_batches = ParallelDims.from_config(p, run.world_size).micro_batches(
        s.global_batch_size, s.micro_batch_size
    )
    stages: dict[int, list[float]] = {}
    for rank in run.ranks:
        shares = [step["pipeline_wait_seconds"] / step["seconds"] for step in rank["steps"]]
        stages.setdefault(rank["pipeline_rank"], []).append(statistics.median(shares))
    measured = [statistics.mean(shares) for _, shares in sorted(stages.items())]
    return {
        "measured_by_stage": measured,
        "measured_mean": statistics.mean(measured),
        "bubble": bubble_fraction(
            p.pipeline_model_parallel_size, p.virtual_pipeline_model_parallel_size, micro_batches
        ),
        "micro_batches": micro_batches,
    }


def memory_against_planner(run: MeasuredRun) -> list[dict]:
    """Each rank's measured peak and parts beside the planner's estimate for its pipeline stage."""
    estimates = estimate_stages(run.cfg, run.world_size, vocab_size(run.cfg), run.ranks[0]["kernels"])
    rows = []
    for rank in run.ranks:
        measured, estimate = rank["memory"], estimates[rank["pipeline_rank"]]
        rows.append(
            {
                "layout": run.layout.name,
                "rank": rank["rank"],
                "pipeline_rank": rank["pipeline_rank"],
                "moment": estimate.moment,
                "measured": {
                    "weights": measured["weights"],
                    "gradients": measured["gradients"],
                    "optimizer_and_workspace": measured["optimizer_states"],
                    "in_step": measured["peak"] - measured["static"],
                    "peak": measured["peak"],
                },
                "predicted": {
                    "weights": estimate.weights,
                    "gradients": estimate.gradients,
                    "optimizer_and_workspace": estimate.optimizer_states + estimate.workspace,
                    "in_step": estimate.activations + estimate.logits + estimate.transient,
                    "peak": estimate.total,
                },
                "error": estimate.total / measured["peak"] - 1,
            }
        )
    return rows


def checkpoint_throughput(run: MeasuredRun) -> dict:
    """Synchronous save and load throughput, and the background save's stall, from rank 0's timings (every timed
    part starts and ends with a barrier, so rank 0's seconds are everyone's)."""
    timing = run.ranks[0]["checkpoint"]
    return {
        **timing,
        "save_gbytes_per_s": timing["bytes"] / timing["save_seconds"] / 1e9,
        "load_gbytes_per_s": timing["bytes"] / timing["load_seconds"] / 1e9,
    }


def steady_blocking(saved: dict) -> float:
    """A steady-state background save's stall: the median over the saves that reuse the run's plan (the third on;
    the last one alone where fewer were made)."""
    reusing = saved["background_saves"][2:] or saved["background_saves"][-1:]
    return statistics.median(save["blocking_seconds"] for save in reusing)
