"""What a sweep leaves for people: the table of its trials, its plots (PNG, Optuna's matplotlib figures), and the
best trial's parameters as `--set` lines and its whole config as a YAML the trainer reads."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import matplotlib
import optuna
import yaml
from optuna.trial import TrialState
from rich import box
from rich.table import Table

from trainer.config.load import read_raw
from trainer.sweep.space import Sweep
from trainer.sweep.study import ERROR, LOG, STEPS, STOPPED

matplotlib.use("Agg")  # files, no display

BEST_SET, BEST_YAML = "best.set", "best.yaml"


def trials_table(study: optuna.Study, sweep: Sweep) -> Table:
    keys = list(sweep.spec.space)
    table = Table(box=box.SIMPLE_HEAD, title=f"sweep {study.study_name}")
    for column in ("trial", "state", "val loss", "steps", *(key.split(".")[-1] for key in keys), "seconds"):
        table.add_column(column, justify="left" if column == "state" else "right")
    best = best_trial(study)
    for trial in study.get_trials(deepcopy=False):
        seconds = (
            f"{(trial.datetime_complete - trial.datetime_start).total_seconds():.0f}"
            if trial.datetime_complete and trial.datetime_start
            else "-"
        )
        state = trial.state.name.lower() + (
            " (best)" if best is not None and trial.number == best.number else ""
        )
        if STOPPED in trial.user_attrs:  # its trainer's budget cap stopped it, not the pruner
            state += " (budget cap)"
        table.add_row(
            str(trial.number),
            state,
            f"{trial.value:.4f}" if trial.value is not None else "-",
            str(trial.user_attrs.get(STEPS, "-")),
            *(_cell(trial.params.get(key)) for key in keys),
            seconds,
        )
    return table


def failures(study: optuna.Study) -> list[str]:
    """One line per failed trial: why, and its log."""
    return [
        f"trial {t.number}: {t.user_attrs.get(ERROR, 'failed')}"
        + ("" if LOG in str(t.user_attrs.get(ERROR, "")) else f" (log {t.user_attrs.get(LOG, '-')})")
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    ]


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    complete = [
        t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None
    ]
    return min(complete, key=lambda t: t.value, default=None)  # type: ignore[arg-type, return-value]


def write_best(study: optuna.Study, sweep: Sweep, directory: Path) -> tuple[Path, Path] | None:
    """best.set (the parameters as --set lines, for the recipe at any shape) and best.yaml (the recipe with the
    trial's shape and parameters: `trainer train --config best.yaml` runs the best trial's config again)."""
    best = best_trial(study)
    if best is None:
        return None
    params = {key: best.params[key] for key in sweep.spec.space}
    lines = "".join(f"--set {line}\n" for line in sweep.param_overrides(params))
    raw: dict[str, Any] = read_raw(sweep.recipe, sweep.overrides(params))
    raw["name"] = f"{study.study_name}-best"
    header = (
        f"# sweep {study.study_name}: trial {best.number}, validation loss {best.value:.4f}\n"
        f"# the recipe {os.path.relpath(sweep.recipe)} with the sweep's trial shape and the best parameters\n"
    )
    return (
        _write(directory / BEST_SET, lines),
        _write(directory / BEST_YAML, header + yaml.safe_dump(raw, sort_keys=False)),
    )


def write_plots(study: optuna.Study, directory: Path) -> list[Path]:
    """Optimisation history, intermediate values (what the pruner saw), parameter importances and parallel
    coordinates, each a PNG; a plot that needs more finished trials than there are is left out."""
    from optuna.visualization import matplotlib as plots

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    figures: dict[str, Any] = {
        "history": lambda: plots.plot_optimization_history(study),
        "intermediate": lambda: plots.plot_intermediate_values(study),
    }
    if len(complete) >= 2:
        figures["parallel-coordinates"] = lambda: plots.plot_parallel_coordinate(study)
        # PED-ANOVA needs no scikit-learn (fANOVA, Optuna's default, does); it needs a few complete trials.
        figures["importances"] = lambda: plots.plot_param_importances(
            study, evaluator=optuna.importance.PedAnovaImportanceEvaluator()
        )
    written = []
    for name, draw in figures.items():
        try:
            with warnings.catch_warnings():
                # Optuna marks its matplotlib plots and PED-ANOVA experimental; they are what this report is for.
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                warnings.simplefilter(
                    "ignore", UserWarning
                )  # a dimension with one value: its axis is widened
                axes = draw()
        except (ValueError, RuntimeError, ZeroDivisionError):
            continue  # too few trials for this one
        figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
        figure.set_size_inches(9, 5.5)
        figure.tight_layout()
        path = directory / f"{name}.png"
        temporary = path.with_suffix(".png.tmp")
        figure.savefig(temporary, dpi=110, format="png")
        os.replace(temporary, path)
        matplotlib.pyplot.close(figure)
        written.append(path)
    return written


def _write(path: Path, text: str) -> Path:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
    return path


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if isinstance(value, float) else str(value)
