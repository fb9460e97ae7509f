"""`python -m trainer plan --measure N`: the planner's N best layouts for this machine's CPU processes, each trained
for a few real steps (`python -m trainer train` in a subprocess, a temporary run directory, no checkpoint until the
run's end), predicted against measured, the measured-fastest written as the config and each layout's prediction
error recorded beside it (`<out>.measured.json`) for calibrating the planner. NeMo's auto-configurator idea.

On CPU the catalog knows no instance type, so the planner ranks the local world's layouts with its own step-time
model on `local_machine`: one "GPU" per process, the host's cores shared among them, at the nominal CPU figures
below (not measured: the recorded errors say how far off they are). The layout keys it may change are TP, PP and the
micro-batch size (DP follows from the world), one layout per TP x PP split at its largest micro-batch; every
candidate passes `layout_problems` for the CPU. On a stack's nodes the same measurement runs as one job per layout
(trainer/jobs/measure.py, `python -m trainer measure-stack`), with the pieces here: the overrides of a measured run,
the step time from its metrics, the choice, the table and the record.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainer.config import layout_problems, load_config
from trainer.contract.catalog import InstanceType
from trainer.plan.performance import Assumptions
from trainer.plan.search import Candidate, search

# What the measurement may change on CPU: the model-parallel split and the micro-batch (DP is what the world leaves).
MEASURE_KEYS = (
    "parallel.tensor_model_parallel_size",
    "parallel.pipeline_model_parallel_size",
    "schedule.micro_batch_size",
)
# Nominal figures for a CPU core (fp32 GEMMs) and gloo over loopback: the model's inputs for the local world, not
# measurements; the recorded prediction errors calibrate them.
CPU_TFLOPS_PER_CORE = 0.05
LOOPBACK_GBYTES_PER_S = 1.0
# Steps 1..WARMUP_STEPS build the graph, allocate and fill the caches: not timed.
WARMUP_STEPS = 2
# No save until the run's end (the trainer always saves its last step; that is not a timed step).
NO_SAVE_INTERVAL = 10**9
RECORD_SUFFIX = ".measured.json"


class MeasureError(Exception):
    """Arguments --measure cannot work with; the message says what would be valid."""


# Runs of each layout, interleaved: on a shared machine one run's median moves with the load (issue 48: two layouts
# timed once 0.384 against 0.627 s a step, re-timed alternately 0.413/0.450 against 0.403/0.470).
REPEATS = 3


@dataclass(frozen=True)
class Measurement:
    rank: int  # the planner's rank (1: predicted fastest)
    candidate: Candidate
    overrides: tuple[str, ...]  # the --set values that give the config this layout
    measured_s: float | None  # median step time after the warm-up (of its runs' medians); None: a run failed
    problem: str | None = None  # why the run failed
    runs: tuple[float, ...] = ()  # each run's median step time, in the order run (empty: one, measured_s)

    @property
    def predicted_s(self) -> float:
        return self.candidate.step.total_s

    @property
    def low(self) -> float | None:
        return min(self.runs or (self.measured_s,)) if self.measured_s is not None else None

    @property
    def high(self) -> float | None:
        return max(self.runs or (self.measured_s,)) if self.measured_s is not None else None

    @property
    def spread(self) -> float | None:
        """The range of its runs' step times (0 with one run: no spread measured)."""
        return None if self.low is None or self.high is None else self.high - self.low

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured: positive where the planner is pessimistic."""
        if self.measured_s is None:
            return None
        return (self.predicted_s - self.measured_s) / self.measured_s

    @property
    def prediction_wrong(self) -> bool | None:
        """Whether the prediction lies outside the runs' range: only then is it called wrong."""
        if self.low is None or self.high is None:
            return None
        return not self.low <= self.predicted_s <= self.high

    def describe_runs(self) -> str:
        """The median with its runs' range, e.g. '0.4130 s a step, runs 0.3840-0.4500'."""
        if self.measured_s is None:
            return "not measured"
        if len(self.runs) < 2:
            return f"{self.measured_s:.4f} s a step, one run"
        return f"{self.measured_s:.4f} s a step, runs {self.low:.4f}-{self.high:.4f}"

    def record(self) -> dict:
        return {
            "rank": self.rank,
            "layout": self.candidate.describe(),
            "overrides": list(self.overrides),
            "predicted_s": self.predicted_s,
            "measured_s": self.measured_s,
            "error": self.error,
            "runs_s": list(self.runs),
            "spread_s": self.spread,
            "prediction_beyond_spread": self.prediction_wrong,
            "problem": self.problem,
        }


def local_machine(world: int) -> InstanceType:
    """This host as the planner's instance type: `world` processes sharing its cores and memory."""
    cores = os.cpu_count() or 1
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**30
    return InstanceType(
        name="local-cpu",
        gpu_model="CPU",
        gpus=world,
        gpu_memory_gib=max(1, memory_gib // world),
        vcpus=cores,
        memory_gib=memory_gib,
        network_cards=0,
        efa_interfaces=0,
        network_gbps=int(LOOPBACK_GBYTES_PER_S * 8 * world),  # per process: the loopback figure
        peak_bf16_tflops_per_gpu=CPU_TFLOPS_PER_CORE * min(cores, world) / world,
        nvlink_gbytes_per_s=LOOPBACK_GBYTES_PER_S,
    )


def local_candidates(
    config: str | Path, overrides: Sequence[str], world: int, assumptions: Assumptions
) -> list[Candidate]:
    """The layouts `train` accepts on `world` CPU processes, ranked by the planner's step time on this host."""
    cfg = load_config(config, overrides, device="cpu")
    plan = search(cfg, local_machine(world), 1, MEASURE_KEYS, assumptions)
    # One layout per TP x PP split, at its largest micro-batch: the model counts no cost per micro-batch, which on
    # CPU processes sharing the cores is what dominates (local.yaml's schedule comment).
    best: dict[tuple[int, int], Candidate] = {}
    for c in plan.candidates:
        split = (c.cfg.parallel.tensor_model_parallel_size, c.cfg.parallel.pipeline_model_parallel_size)
        if not c.fits or c.cfg.engine != "megatron" or layout_problems(c.cfg, world, "cpu"):
            continue
        if split not in best or c.cfg.schedule.micro_batch_size > best[split].cfg.schedule.micro_batch_size:
            best[split] = c
    return sorted(best.values(), key=lambda c: c.step.total_s)


def measured_run_overrides(candidate: Candidate, keys: Sequence[str], steps: int) -> list[str]:
    """The `--set` values of a measured run of the candidate's layout (its `keys`): its first `steps` steps with the
    LR schedule kept at the config's decay length, no save before the end, a log line (with its step time) each
    step."""
    s = candidate.cfg.schedule
    return [
        *candidate.overrides(keys),
        f"schedule.train_iters={steps}",
        f"schedule.lr_decay_iters={s.lr_decay_iters or s.train_iters}",
        f"checkpoint.save_interval={NO_SAVE_INTERVAL}",
        "checkpoint.async_save=false",
        "logging.log_interval=1",
    ]


def train_command(
    config: str | Path,
    overrides: Sequence[str],
    candidate: Candidate,
    world: int,
    steps: int,
    run_dir: Path,
) -> list[str]:
    """A real `train` of the config with the candidate's layout on `world` local processes (DP what the world
    leaves), on a run directory of its own."""
    sets = [
        *overrides,
        *measured_run_overrides(candidate, MEASURE_KEYS, steps),
        "parallel.data_parallel_size=null",
        f"logging.run_dir={run_dir}",
    ]
    command = [
        sys.executable,
        "-m",
        "trainer",
        "train",
        "--config",
        str(config),
        "--fresh",
        "--nproc",
        str(world),
    ]
    return command + [arg for value in sets for arg in ("--set", value)]


def step_seconds(metrics: Path, warmup: int = WARMUP_STEPS) -> float | None:
    """The median step time metrics.jsonl logged after the warm-up steps; None when it logged none."""
    if not metrics.exists():
        return None
    return median_step_seconds(metrics.read_text().splitlines(), warmup)


def median_step_seconds(lines: Iterable[str], warmup: int = WARMUP_STEPS) -> float | None:
    """The median step time of metrics.jsonl's lines after the warm-up steps; None when they hold none."""
    times = [
        float(record["step_time_s"])
        for record in map(json.loads, (line for line in lines if line.strip()))
        if record.get("step_time_s") and int(record["step"]) > warmup
    ]
    return statistics.median(times) if times else None


def run_order(layouts: int, repeats: int) -> list[int]:
    """The order of the runs, as indices of the layouts: every layout once per round, each round the reverse of the
    last (ABC CBA ABC), so that a drift in the machine's load over the measurement falls on every layout alike."""
    order: list[int] = []
    for round_ in range(repeats):
        order += list(range(layouts)) if round_ % 2 == 0 else list(reversed(range(layouts)))
    return order


def measure(
    config: str | Path,
    overrides: Sequence[str],
    candidates: Sequence[Candidate],
    world: int,
    steps: int,
    timeout_s: float,
    console: Console,
    repeats: int = REPEATS,
) -> list[Measurement]:
    """Train each candidate for `steps` steps `repeats` times, the runs interleaved (run_order); a layout whose run
    fails is recorded with the end of its log and not run again."""
    runs: dict[int, list[float]] = {index: [] for index in range(len(candidates))}
    problems: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="plan-measure-") as base:
        for number, index in enumerate(run_order(len(candidates), repeats), 1):
            if index in problems:
                continue
            candidate = candidates[index]
            run_dir = Path(base) / f"layout-{index + 1}-run-{len(runs[index]) + 1}"
            console.print(
                f"measuring run {number}/{len(candidates) * repeats}: layout {index + 1} {candidate.describe()} ..."
            )
            command = train_command(config, overrides, candidate, world, steps, run_dir)
            problem = _run(command, timeout_s)
            seconds = None if problem else step_seconds(run_dir / "metrics.jsonl")
            if problem is None and seconds is None:
                problem = (
                    f"no step after the {WARMUP_STEPS} warm-up steps was timed; give more --measure-steps"
                )
            if problem is not None:
                problems[index] = problem
            else:
                assert seconds is not None
                runs[index].append(seconds)
    return [
        Measurement(
            index + 1,
            candidate,
            tuple(candidate.overrides(MEASURE_KEYS)),
            None if index in problems else statistics.median(runs[index]),
            problems.get(index),
            () if index in problems else tuple(runs[index]),
        )
        for index, candidate in enumerate(candidates)
    ]


def fastest(measurements: Sequence[Measurement]) -> Measurement | None:
    """The layout to write: the measured-fastest (lowest median) where its runs are all faster than every other
    layout's; where another's range overlaps it, the measurements cannot tell them apart, and of those the one the
    planner ranks first is taken."""
    measured = [m for m in measurements if m.measured_s is not None]
    if not measured:
        return None
    quickest = min(measured, key=lambda m: m.measured_s or 0.0)
    return min(tied(measured, quickest), key=lambda m: m.rank)


def tied(measurements: Sequence[Measurement], quickest: Measurement) -> list[Measurement]:
    """The measured layouts whose runs' range overlaps the quickest's (itself included): not told apart."""
    assert quickest.high is not None
    return [m for m in measurements if m.low is not None and m.low <= quickest.high]


def choice_line(measurements: Sequence[Measurement], chosen: Measurement) -> str:
    """Why `chosen` was written: faster beyond the spread, or tied with others and the planner's first of them."""
    measured = [m for m in measurements if m.measured_s is not None]
    quickest = min(measured, key=lambda m: m.measured_s or 0.0)
    others = [m for m in tied(measured, quickest) if m is not chosen]
    where = f"{chosen.describe_runs()}"
    if not others:
        rest = "every other layout measured" if len(measured) > 1 else "no other layout measured"
        return f"fastest measured: {where}, faster than {rest} beyond the runs' spread"
    names = ", ".join(f"layout {m.rank} ({m.describe_runs()})" for m in others)
    return (
        f"no layout measured faster beyond the runs' spread: layout {chosen.rank} {where} overlaps {names}; "
        f"writing the planner's first of them, layout {chosen.rank}"
    )


def print_measurements(
    console: Console, measurements: Sequence[Measurement], chosen: Measurement | None
) -> None:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("#", "layout", "predicted s", "measured s (median)", "runs' range", "error", ""):
        table.add_column(column, justify="left" if column in ("layout", "") else "right")
    for m in measurements:
        table.add_row(
            str(m.rank),
            escape(m.candidate.describe()),
            f"{m.predicted_s:.4f}",
            "-" if m.measured_s is None else f"{m.measured_s:.4f}",
            "-" if m.low is None or len(m.runs) < 2 else f"{m.low:.4f}-{m.high:.4f}",
            "-" if m.error is None else f"{m.error:+.0%}" + ("" if m.prediction_wrong else " (within)"),
            "chosen" if m is chosen else escape(m.problem or ""),
        )
    console.print(table)


def write_record(
    path: Path,
    config: str | Path,
    steps: int,
    measurements: Sequence[Measurement],
    machine: str,
    model: dict,
) -> None:
    """Each layout's predicted and measured step time and the error, to a temporary name renamed into place, with
    where it was measured (`machine`) and what the planner predicted with (`model`)."""
    chosen = fastest(measurements)
    record = {
        "config": str(config),
        "machine": machine,
        "steps": steps,
        "warmup_steps": WARMUP_STEPS,
        "model": model,
        "chosen": None if chosen is None else chosen.rank,
        "layouts": [m.record() for m in measurements],
    }
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temporary.write_text(json.dumps(record, indent=2) + "\n")
    temporary.replace(path)


def local_record_context(world: int) -> tuple[str, dict]:
    """The record's machine and model for this host's CPU processes: the nominal CPU figures."""
    model = {"cpu_tflops_per_core": CPU_TFLOPS_PER_CORE, "loopback_gbytes_per_s": LOOPBACK_GBYTES_PER_S}
    return f"{world} CPU processes on {os.cpu_count()} cores", model


def record_path(out: Path) -> Path:
    return out.with_name(out.name + RECORD_SUFFIX)


def world_of(config: str | Path, overrides: Sequence[str], nproc: int | None) -> int:
    """The processes to measure on: --nproc, else the config's own (TP x PP x CP x DP, DP 1 when unset)."""
    if nproc:
        return nproc
    p = load_config(config, overrides, device="cpu").parallel
    return p.model_parallel_size * (p.data_parallel_size or 1)


def _run(command: list[str], timeout_s: float) -> str | None:
    """Run one measurement; None when it succeeded, else why not with the end of its output."""
    # Its own session, so that a timeout takes torchrun's ranks down with it.
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return f"still running after {timeout_s:.0f} s"
    if process.returncode != 0:
        tail = output.strip().splitlines()[-3:]
        return f"train exited with {process.returncode}: {' | '.join(tail)}"
    return None
