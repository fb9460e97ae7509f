"""The sweep against an exhaustive grid of the same budget, on the built-in data: both run the sweep YAML's trial
shape (trainer/configs/local-sweep.yaml: real trainer runs), the same number of trials each.

- the sweep: its own space (five dimensions), TPE, and its pruner on the validation loss at evaluation steps;
- the grid: learning rate x warm-up, three values each (every other key at the recipe's value), every trial to the
  end (no pruning): what a person would run with the same nine trials.

Rows: the best validation loss each found, and the trial-steps each spent (the steps its trials trained, pruned ones
up to where they stopped), each with its wall time. The goal: within 1 % of the grid's best with at least 40 % fewer
trial-steps."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import yaml
from optuna.trial import TrialState
from rich.console import Console

from trainer.bench.report import add_result
from trainer.sweep.space import load_sweep
from trainer.sweep.study import STEPS, Command, run_sweep
from trainer.sweep.trial import train_command

SWEEP = Path("trainer/configs/local-sweep.yaml")
# The grid: three learning rates spread evenly in log over the sweep's range (1e-3 .. 3e-2), three warm-ups.
GRID = {"optimizer.lr": [1.7e-3, 5.5e-3, 1.8e-2], "schedule.lr_warmup_iters": [0, 10, 20]}
BUDGET = 9  # trials each: the grid's size


def bench_sweep(
    report: dict,
    out: Path,
    sweep_path: Path = SWEEP,
    budget: int = BUDGET,
    command: Command = train_command,
) -> None:
    """Run both, from scratch, under <out>/sweeps; add their rows and details to the report."""
    root = out / "sweeps"
    shutil.rmtree(root, ignore_errors=True)  # a benchmark measures, it does not resume
    root.mkdir(parents=True)
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    spec: dict[str, Any] = yaml.safe_load(sweep_path.read_text())
    spec["recipe"] = str((sweep_path.parent / spec["recipe"]).resolve())
    grid_spec = {**spec, "sampler": {"kind": "grid", "seed": 0}, "pruner": {"kind": "none"}}
    grid_spec["space"] = {key: {"choices": values} for key, values in GRID.items()}
    grid_path = root / "grid.yaml"
    grid_path.write_text(yaml.safe_dump(grid_spec, sort_keys=False))

    arms = {
        name: _run(path, f"bench-{name}", root / name, budget, console, command)
        for name, path in (("sweep", sweep_path), ("grid", grid_path))
    }
    sweep, grid = arms["sweep"], arms["grid"]
    report["details"]["sweep"] = {"budget_trials": budget, "grid": GRID, **arms}
    add_result(
        report,
        f"sweep best validation loss ({budget} trials: TPE, pruner {spec['pruner']['kind']})",
        "loss",
        sweep["best_val_loss"],
        f"exhaustive 3x3 grid (lr x warm-up), {budget} trials",
        grid["best_val_loss"],
    )
    add_result(
        report,
        "sweep trial-steps",
        "steps",
        sweep["trial_steps"],
        "grid trial-steps (no pruning)",
        grid["trial_steps"],
    )
    add_result(report, "sweep wall time", "s", sweep["seconds"], "grid wall time", grid["seconds"])


def _run(
    path: Path, name: str, directory: Path, budget: int, console: Console, command: Command
) -> dict[str, Any]:
    started = time.monotonic()
    study = run_sweep(load_sweep(path), name, directory, budget, console, command=command)
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    best = min(complete, key=lambda t: float(t.value or 0)) if complete else None
    return {
        "best_val_loss": best.value if best else None,
        "best_params": best.params if best else None,
        "trial_steps": sum(int(t.user_attrs.get(STEPS, 0)) for t in trials),
        "trials": {state.name.lower(): sum(t.state == state for t in trials) for state in TrialState},
        "seconds": time.monotonic() - started,
    }
