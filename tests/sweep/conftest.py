"""A sweep over the tests' tiny recipe, run by tests/sweep/objective.py in the trainer's place (fast), for the
wiring of the sampler, the pruner, the storage and the report with Optuna's real objects."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from rich.console import Console

from trainer.sweep.heldout import HeldOut
from trainer.sweep.space import Sweep, load_sweep
from trainer.sweep.study import run_sweep

OBJECTIVE = Path(__file__).with_name("objective.py")
TINY = Path(__file__).resolve().parents[1] / "support" / "tiny.yaml"


def write_sweep(directory: Path, *, pruner: str = "successive_halving", extra: str = "") -> Path:
    path = directory / "tiny-sweep.yaml"
    path.write_text(
        f"recipe: {TINY}\n"
        "trials: 8\n"
        "sampler: {seed: 0, startup_trials: 4}\n"
        f"pruner: {{kind: {pruner}, min_resource: 10, reduction_factor: 3}}\n"
        "set: {schedule.train_iters: 60, schedule.lr_decay_iters: 60, schedule.eval_interval: 10}\n"
        "space:\n"
        "  optimizer.lr: {low: 1.0e-4, high: 1.0e-1, log: true}\n" + extra
    )
    return path


def objective_command(*extra: str):
    def command(recipe: Path, overrides: Sequence[str], run_dir: Path) -> list[str]:
        return [sys.executable, str(OBJECTIVE), *overrides, *extra, f"logging.run_dir={run_dir}"]

    return command


def objective_evaluate(run_dir: Path) -> HeldOut:
    """The held-out score of a trial the fast objective ran: the windows' losses it wrote at its end."""
    losses = tuple(json.loads((run_dir / "heldout-losses.json").read_text()))
    return HeldOut(sum(losses) / len(losses), losses)


def objective_sweep(sweep: Sweep, name: str, directory: Path, trials: int, *settings: str, **more):
    """run_sweep with the fast objective as each trial's trainer (with `settings`) and its windows as the score."""
    command = objective_command(*settings)
    return run_sweep(
        sweep, name, directory, trials, quiet(), command=command, evaluate=objective_evaluate, **more
    )


def quiet() -> Console:
    return Console(quiet=True)


def sweep_of(directory: Path, **kwargs) -> Sweep:
    return load_sweep(write_sweep(directory, **kwargs))


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    """Eight trials with successive halving, run once for the module."""
    directory = tmp_path_factory.mktemp("sweep")
    sweep = sweep_of(directory)
    study = objective_sweep(sweep, "tiny", directory / "study", 8)
    return sweep, study, directory / "study"
