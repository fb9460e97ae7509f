"""What a sweep leaves for people: the table of its trials, its plots (PNG), and the configuration it returns (the
best trial's if it beat the recipe beyond the seed spread, confirm.py, else the recipe's own) as `--set` lines and
as a whole config in a YAML the trainer reads."""

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
from trainer.sweep.confirm import Verdict
from trainer.sweep.space import Sweep
from trainer.sweep.study import ERROR, LOG, RECIPE, STEPS, STOPPED

matplotlib.use("Agg")  # files, no display

BEST_SET, BEST_YAML = "best.set", "best.yaml"
# Parameter importances only from this many complete trials: PED-ANOVA compares the top 10 % of them with the
# rest (PedAnovaImportanceEvaluator target_quantile 0.1, optuna/importance/_ped_anova/evaluator.py, v5.1.0), and
# under 10 the top 10 % is one trial, whose parameters any noise ranks.
MIN_IMPORTANCE_TRIALS = 10


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
        if trial.user_attrs.get(RECIPE):
            state += " (recipe)"
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


def write_best(study: optuna.Study, sweep: Sweep, directory: Path, verdict: Verdict) -> tuple[Path, Path]:
    """best.set (the returned parameters as --set lines, for the recipe at any shape) and best.yaml (the recipe
    with the trial shape and those parameters: `trainer train --config best.yaml` runs them again). What is
    returned is the verdict's winner: the best trial's parameters if they beat the recipe's beyond the seed spread,
    else the recipe's own."""
    params = {key: verdict.winner[key] for key in sweep.spec.space}
    lines = "".join(f"--set {line}\n" for line in sweep.param_overrides(params))
    raw: dict[str, Any] = read_raw(sweep.recipe, sweep.overrides(params))
    raw["name"] = f"{study.study_name}-best"
    header = (
        f"# sweep {study.study_name}: {verdict.summary}\n"
        f"# the recipe {os.path.relpath(sweep.recipe)} with the sweep's trial shape and the "
        f"{'best trial' if verdict.beat else 'recipe'}'s parameters\n"
    )
    return (
        _write(directory / BEST_SET, lines),
        _write(directory / BEST_YAML, header + yaml.safe_dump(raw, sort_keys=False)),
    )


# What the pruner's steps count (pruner.progress): an axis's name, and a pruned trial's label for its last one.
PROGRESS = {
    "step": ("step", "step {}"),
    "past_warmup": ("steps past the trial's own warm-up", "{} past warm-up"),
}


def write_plots(study: optuna.Study, directory: Path, progress: str = "step") -> tuple[list[Path], list[str]]:
    """The history (every trial's value: complete ones on the held-out set, pruned ones at their last reported
    validation loss), the intermediate values (what the pruner saw, at the steps `progress` counts), parallel
    coordinates and parameter importances, each a PNG; and a line for each plot left out, saying why."""
    from optuna.visualization import matplotlib as plots

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    figures: dict[str, Any] = {
        "history": lambda: _history(study, progress),
        "intermediate": lambda: _labelled(
            plots.plot_intermediate_values(study), PROGRESS[progress][0], "validation loss"
        ),
    }
    left_out = []
    if len(complete) >= 2:
        figures["parallel-coordinates"] = lambda: plots.plot_parallel_coordinate(study)
    if len(complete) >= MIN_IMPORTANCE_TRIALS:
        # PED-ANOVA needs no scikit-learn (fANOVA, Optuna's default, does).
        figures["importances"] = lambda: _labelled(
            plots.plot_param_importances(study, evaluator=optuna.importance.PedAnovaImportanceEvaluator()),
            f"importance for the validation loss (PED-ANOVA, {len(complete)} complete trials)",
            "parameter",
        )
    else:
        (directory / "importances.png").unlink(missing_ok=True)  # an earlier run's, from fewer trials
        left_out.append(
            f"importances.png left out: {len(complete)} complete trial(s), {MIN_IMPORTANCE_TRIALS} needed for "
            "importances that are not one trial's noise"
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
        except (ValueError, RuntimeError, ZeroDivisionError) as error:
            left_out.append(f"{name}.png left out: {error}")
            continue
        figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
        figure.set_size_inches(9, 5.5)
        figure.tight_layout()
        path = directory / f"{name}.png"
        temporary = path.with_suffix(".png.tmp")
        figure.savefig(temporary, dpi=110, format="png")
        os.replace(temporary, path)
        matplotlib.pyplot.close(figure)
        written.append(path)
    return written, left_out


def _history(study: optuna.Study, progress: str = "step") -> Any:
    """Each trial's value by trial number: complete trials (the held-out loss) as dots, pruned ones at their last
    reported validation loss as crosses labelled with the step (or the steps past warm-up: `progress`), the recipe's
    trial ringed, the best so far as a line. Optuna's plot_optimization_history draws complete trials only, so a
    heavily pruned sweep looked empty."""
    from matplotlib import pyplot

    _figure, axes = pyplot.subplots()
    complete = [
        t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None
    ]
    pruned = [
        t for t in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,)) if t.intermediate_values
    ]
    axes.scatter(
        [t.number for t in complete],
        [float(t.value or 0) for t in complete],
        label="complete (held-out loss)",
    )
    last = [(t.number, *max(t.intermediate_values.items())) for t in pruned]
    axes.scatter(
        [n for n, _, _ in last], [v for _, _, v in last], marker="x", color="tab:red",
        label="pruned (validation loss at its last evaluation)",
    )  # fmt: skip
    for number, step, value in last:
        axes.annotate(
            PROGRESS[progress][1].format(step),
            (number, value),
            fontsize=7,
            xytext=(3, 3),
            textcoords="offset points",
        )
    recipe = [t for t in complete if t.user_attrs.get(RECIPE)]
    if recipe:
        axes.scatter([recipe[0].number], [float(recipe[0].value or 0)], s=160, facecolors="none", edgecolors="black",
                     label="the recipe's own values")  # fmt: skip
    best, line = float("inf"), []
    for trial in sorted(complete, key=lambda t: t.number):
        best = min(best, float(trial.value))  # type: ignore[arg-type]
        line.append((trial.number, best))
    if line:
        axes.step(
            [n for n, _ in line], [v for _, v in line], where="post", color="tab:green", label="best so far"
        )
    axes.set_title(f"sweep {study.study_name}: every trial's value")
    axes.legend(fontsize=8)
    return _labelled(axes, "trial", "validation loss (nats per token)")


def _labelled(axes: Any, x: str, y: str) -> Any:
    target = axes if hasattr(axes, "set_xlabel") else axes.flat[0]
    target.set_xlabel(x)
    target.set_ylabel(y)
    return axes


def _write(path: Path, text: str) -> Path:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
    return path


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if isinstance(value, float) else str(value)
