"""Before a sweep calls its best trial better than the recipe: both configurations trained again on more seeds and
scored on the same held-out windows, and the best called better only where its mean beats the recipe's by more than
the seed spread (the largest range of either's losses over the seeds). Otherwise the sweep says no trial beat the
recipe and returns the recipe's values (report.write_best).

The runs are real `trainer train` runs (no pruning), under <study>/confirm/<which>-seed<N>/, each remembered in its
result.json so that a resumed sweep does not train them again."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState
from rich.console import Console

from trainer.sweep.heldout import Evaluate, HeldOut, ScoreFailed, paired_difference
from trainer.sweep.space import Sweep
from trainer.sweep.study import RECIPE, SEQUENCE_LOSSES, Command
from trainer.sweep.trial import TrialFailed, run_trial, train_command

CONFIRM, RESULT, VERDICT = "confirm", "result.json", "verdict.json"


@dataclass(frozen=True)
class Verdict:
    best_trial: int | None  # the study's best complete trial (None: none finished)
    recipe_trial: int | None  # trial 0, the recipe's own values, where it finished
    seeds: list[int]  # the trainer seeds each side was measured on: the trials' own first
    best_losses: list[float]  # the best's held-out loss on each seed
    recipe_losses: list[float]
    spread: float  # the largest range (max - min) of either side's losses over the seeds
    paired_se: float | None  # standard error of best - recipe on the trials' own seed, window by window
    heldout_se: float | None  # the best's held-out loss's standard error
    beat: bool  # the best beat the recipe's values beyond the seed spread
    winner: dict[
        str, Any
    ]  # the parameters the sweep returns: the best's if it beat the recipe, else the recipe's
    summary: str

    @property
    def change(self) -> float:
        best, recipe = _mean(self.best_losses), _mean(self.recipe_losses)
        return (best - recipe) / recipe


def confirm(
    study: optuna.Study,
    sweep: Sweep,
    directory: Path,
    console: Console,
    evaluate: Evaluate,
    command: Command = train_command,
) -> Verdict | None:
    """The sweep's verdict on its best trial against the recipe's values (None: no trial finished), written to
    <directory>/verdict.json."""
    complete = [
        t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None
    ]
    if not complete:
        return None
    best = min(complete, key=lambda t: float(t.value))  # type: ignore[arg-type]
    recipe = next((t for t in complete if t.user_attrs.get(RECIPE)), None)
    recipe_params = sweep.recipe_params()
    seed = sweep.trial_config().seed
    seeds = [seed + i for i in range(sweep.spec.evaluation.seeds + 1)]
    if recipe is not None and best.number == recipe.number:
        verdict = Verdict(
            best.number, recipe.number, [seed], [float(best.value)], [float(best.value)],  # type: ignore[arg-type]
            0.0, None, best.user_attrs.get("heldout_se"), False, recipe_params,
            f"no trial beat the recipe: its own values (trial {best.number}) scored best, {best.value:.4f}",
        )  # fmt: skip
        return _write(directory, verdict)

    def measured(which: str, params: dict[str, Any], trial: optuna.trial.FrozenTrial | None) -> list[HeldOut]:
        first = (
            HeldOut(float(trial.value), tuple(trial.user_attrs[SEQUENCE_LOSSES]))  # type: ignore[arg-type]
            if trial is not None
            else None
        )
        return [
            first if first is not None and s == seed else _run(sweep, directory, which, params, s, console, evaluate, command)
            for s in seeds
        ]  # fmt: skip

    best_runs = measured("best", best.params, best)
    recipe_runs = measured("recipe", recipe_params, recipe)
    best_losses = [run.loss for run in best_runs]
    recipe_losses = [run.loss for run in recipe_runs]
    spread = max(max(best_losses) - min(best_losses), max(recipe_losses) - min(recipe_losses))
    _, paired_se = paired_difference(best_runs[0], recipe_runs[0])
    difference = _mean(best_losses) - _mean(recipe_losses)
    beat = difference < 0 and -difference > spread
    change = difference / _mean(recipe_losses)
    on = f"mean of {len(seeds)} seeds" if len(seeds) > 1 else "one seed, no other measured"
    figures = (
        f"best {_mean(best_losses):.4f} vs the recipe's {_mean(recipe_losses):.4f} ({change * 100:+.1f} %, "
        f"{'beyond' if beat else 'within'} the seed spread of {spread:.4f}; {on}; held-out standard error "
        f"{best_runs[0].standard_error:.4f}, of the difference {paired_se:.4f})"
    )
    summary = (
        f"{figures}: trial {best.number}"
        if beat
        else f"no trial beat the recipe: {figures}; the sweep returns the recipe's values"
    )
    verdict = Verdict(
        best.number, recipe.number if recipe is not None else None, seeds, best_losses, recipe_losses, spread,
        paired_se, best_runs[0].standard_error, beat, dict(best.params) if beat else recipe_params, summary,
    )  # fmt: skip
    return _write(directory, verdict)


def _run(
    sweep: Sweep,
    directory: Path,
    which: str,
    params: dict[str, Any],
    seed: int,
    console: Console,
    evaluate: Evaluate,
    command: Command,
) -> HeldOut:
    """One configuration trained to its end on `seed` and scored; remembered in its result.json."""
    run_dir = directory / CONFIRM / f"{which}-seed{seed}"
    result = run_dir / RESULT
    if result.is_file():
        stored = json.loads(result.read_text())
        if stored["params"] == params:
            return HeldOut(stored["loss"], tuple(stored["sequence_losses"]))
    console.print(f"confirming the {which} configuration on seed {seed}")
    overrides = [*sweep.overrides(params), f"seed={seed}", f"name={directory.name}-{which}-seed{seed}"]
    try:
        run_trial(command(sweep.recipe, overrides, run_dir), run_dir, lambda *_: False)
        held = evaluate(run_dir)
    except (TrialFailed, ScoreFailed) as error:
        raise TrialFailed(
            f"the {which} configuration on seed {seed}: {error}", run_dir / "train.log"
        ) from None
    body = {"params": params, "seed": seed, "loss": held.loss, "sequence_losses": list(held.sequence_losses)}
    temporary = result.with_name(RESULT + ".tmp")
    temporary.write_text(json.dumps(body))
    os.replace(temporary, result)
    console.print(f"  {which} on seed {seed}: held-out loss {held.loss:.4f}")
    return held


def _write(directory: Path, verdict: Verdict) -> Verdict:
    path = directory / VERDICT
    temporary = path.with_name(VERDICT + ".tmp")
    temporary.write_text(json.dumps(asdict(verdict), indent=1))
    os.replace(temporary, path)
    return verdict


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
