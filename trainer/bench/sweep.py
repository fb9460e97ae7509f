"""The sweep against an exhaustive grid of the same budget, on the built-in data. Both search the same two
dimensions of the sweep YAML's space (trainer/configs/local-sweep.yaml: learning rate and warm-up, every other key at
the recipe's value) with the YAML's trial shape (real trainer runs), and both spend the same budget of trial-steps:
the grid's, nine trials run to the end.

- the grid: three values of each dimension (every combination; no pruning): what a person would run;
- the sweep: the YAML's sampler (TPE) and pruner on the validation loss at evaluation steps, over the dimensions'
  whole ranges, starting trials while a whole one still fits in what is left of the budget. What pruning saves
  goes into more trials: the point of pruning (Li et al., "Hyperband", JMLR 2018, section 1).

Rows: the best validation loss each found; the sweep's trial-steps against what its own trials would have cost run
to the end (pruning's saving); the trials each ran; the wall time. The goals: within 1 % of the grid's best, with
at least 40 % fewer trial-steps than without pruning."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState
from rich.console import Console

from trainer.bench.report import add_result
from trainer.sweep.space import load_sweep
from trainer.sweep.study import STEPS, Command, run_sweep
from trainer.sweep.trial import train_command

SWEEP = Path("trainer/configs/local-sweep.yaml")
# The grid: three learning rates spread evenly in log over the sweep's range (1e-3 .. 3e-2), three warm-ups over
# its range (0 .. 20).
GRID = {"optimizer.lr": [1.7e-3, 5.5e-3, 1.8e-2], "schedule.lr_warmup_iters": [0, 10, 20]}
GRID_TRIALS = 9  # every combination


def bench_sweep(
    report: dict,
    out: Path,
    sweep_path: Path = SWEEP,
    command: Command = train_command,
) -> None:
    """Run both, from scratch, under <out>/sweeps; add their rows and details to the report."""
    root = out / "sweeps"
    shutil.rmtree(root, ignore_errors=True)  # a benchmark measures, it does not resume
    root.mkdir(parents=True)
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    spec: dict[str, Any] = yaml.safe_load(sweep_path.read_text())
    spec["recipe"] = str((sweep_path.parent / spec["recipe"]).resolve())
    missing = sorted(set(GRID) - set(spec["space"]))
    if missing:
        raise ValueError(f"{sweep_path}: space: the benchmark searches {', '.join(missing)}; add them")
    sweep_spec = {**spec, "space": {key: spec["space"][key] for key in GRID}}
    grid_spec = {**spec, "sampler": {"kind": "grid", "seed": 0}, "pruner": {"kind": "none"}}
    grid_spec["space"] = {key: {"choices": values} for key, values in GRID.items()}
    paths = {"sweep": root / "sweep.yaml", "grid": root / "grid.yaml"}
    for name, body in (("sweep", sweep_spec), ("grid", grid_spec)):
        paths[name].write_text(yaml.safe_dump(body, sort_keys=False))

    grid = _run(paths["grid"], "bench-grid", root / "grid", GRID_TRIALS, None, console, command)
    steps = load_sweep(paths["sweep"]).train_iters()
    budget = grid["trial_steps"]  # the grid's nine trials, to the end
    sweep = _run(paths["sweep"], "bench-sweep", root / "sweep", budget, steps, console, command)
    report["details"]["sweep"] = {
        "budget_trial_steps": budget,
        "grid_values": GRID,
        "grid": grid,
        "sweep": sweep,
    }
    add_result(
        report,
        f"sweep best validation loss (TPE, pruner {spec['pruner']['kind']}; {budget} trial-steps)",
        "loss",
        sweep["best_val_loss"],
        f"exhaustive 3x3 grid (lr x warm-up), {GRID_TRIALS} trials to the end",
        grid["best_val_loss"],
    )
    add_result(
        report,
        f"sweep trial-steps ({sum(sweep['trials'].values())} trials)",
        "steps",
        sweep["trial_steps"],
        "the same trials without pruning",
        sweep["unpruned_steps"],
    )
    add_result(
        report,
        "sweep trials run",
        "trials",
        sum(sweep["trials"].values()),
        "grid trials run",
        sum(grid["trials"].values()),
    )
    add_result(report, "sweep wall time", "s", sweep["seconds"], "grid wall time", grid["seconds"])


def _run(
    path: Path,
    name: str,
    directory: Path,
    budget: int,
    trial_steps: int | None,
    console: Console,
    command: Command,
) -> dict[str, Any]:
    """`trial_steps` None: `budget` trials. Otherwise `budget` trial-steps: trials start while one of
    `trial_steps` still fits."""
    started = time.monotonic()
    if trial_steps is None:
        study = run_sweep(load_sweep(path), name, directory, budget, console, command=command)
    else:

        def spent_up(study: optuna.Study) -> bool:
            return _steps(study.get_trials(deepcopy=False)) + trial_steps > budget

        # The most trials the budget buys: every one stopped at the pruner's first rung.
        sweep = load_sweep(path)
        cap = budget // min(sweep.spec.pruner.min_resource, trial_steps)
        study = run_sweep(sweep, name, directory, cap, console, command=command, stop_when=spent_up)
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    best = min(complete, key=lambda t: float(t.value or 0)) if complete else None
    full = load_sweep(path).train_iters()
    return {
        "best_val_loss": best.value if best else None,
        "best_params": best.params if best else None,
        "trial_steps": _steps(trials),
        "unpruned_steps": full * len(trials),
        "trials": {state.name.lower(): sum(t.state == state for t in trials) for state in TrialState},
        "seconds": time.monotonic() - started,
    }


def _steps(trials: list[optuna.trial.FrozenTrial]) -> int:
    return sum(int(t.user_attrs.get(STEPS, 0)) for t in trials)
