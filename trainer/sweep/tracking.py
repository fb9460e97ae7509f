"""A sweep's trials in MLflow tracking (trainer/tracking/mlflow_runs.py): the local driver (trainer/sweep/command.py)
and a stack's workers (trainer/sweep/worker.py) log each trial once the sweep has decided it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna
from rich.console import Console
from rich.markup import escape

from trainer.config.load import read_raw
from trainer.sweep.space import Sweep
from trainer.sweep.study import RUN_DIR
from trainer.tracking.mlflow_runs import flatten, log_run


def trial_tracker(
    sweep: Sweep, name: str, uri: str, console: Console
) -> Callable[[optuna.trial.FrozenTrial], None]:
    """Each decided trial as an MLflow run of the experiment named after the sweep: its whole config, its
    validation losses by step, its state and, where it published one, its model version. A store that fails is
    a warning for that trial, as in the trainer (trainer/loop.py _track), not the end of the sweep: the trials and
    the study are already on disk."""

    def track(trial: optuna.trial.FrozenTrial) -> None:
        if RUN_DIR not in trial.user_attrs:
            return  # failed before it ran
        config = read_raw(sweep.recipe, sweep.overrides(trial.params))
        try:
            run_id = log_run(
                Path(trial.user_attrs[RUN_DIR]),
                uri=uri,
                experiment=name,
                run_name=f"{name}-t{trial.number:04d}",
                params=flatten(config),
                tags={"sweep": name, "trial": str(trial.number), "state": trial.state.name.lower()},
            )
        except Exception as error:  # any failure of the store or its client
            problem = f"{type(error).__name__}: {error}"
            console.print(
                f"  [yellow]tracking:[/] trial {trial.number} not logged to {escape(uri)}: {escape(problem)}"
            )
            return
        console.print(f"  trial {trial.number}: MLflow run {run_id}")

    return track
