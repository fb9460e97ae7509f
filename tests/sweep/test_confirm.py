"""The sweep's verdict on its best trial against the recipe's own values (trial 0): re-run on more seeds, called
better only beyond the seed spread, else the recipe's values returned. Trials and re-runs are the fast objective
(tests/sweep/objective.py), whose final loss moves with the trainer seed by `seed_spread` x sin(seed)."""

from __future__ import annotations

import json

from tests.sweep.conftest import objective_command, objective_evaluate, objective_sweep, quiet, sweep_of
from trainer.sweep.confirm import CONFIRM, RESULT, VERDICT, confirm
from trainer.sweep.study import RECIPE


def _sweep(tmp_path, trials: int, *settings: str, extra: str = ""):
    sweep = sweep_of(tmp_path, pruner="none", extra=extra)
    study = objective_sweep(sweep, "v", tmp_path / "s", trials, *settings)  # fmt: skip
    return sweep, study


def test_trial_0_is_the_recipes_values_and_a_best_beyond_the_seed_spread_is_called_better(tmp_path):
    sweep, study = _sweep(tmp_path, 4)
    recipe = study.trials[0]
    assert recipe.user_attrs[RECIPE] and recipe.params == {"optimizer.lr": 1e-3}  # tiny.yaml's own
    verdict = confirm(study, sweep, tmp_path / "s", quiet(), objective_evaluate, objective_command())
    best = min((t for t in study.trials if t.value is not None), key=lambda t: t.value)
    assert best.number != 0 and verdict.best_trial == best.number and verdict.recipe_trial == 0
    assert verdict.seeds == [7, 8, 9]  # tiny.yaml's seed, then two more
    assert verdict.best_losses[0] == best.value and verdict.recipe_losses[0] == recipe.value
    spread = max(max(v) - min(v) for v in (verdict.best_losses, verdict.recipe_losses))
    assert verdict.spread == spread and 0 < spread < 0.05
    assert verdict.beat and verdict.winner == best.params
    mean = sum(verdict.best_losses) / 3
    assert verdict.summary.startswith(
        f"best {mean:.4f} vs the recipe's {sum(verdict.recipe_losses) / 3:.4f} ("
    )
    assert f"beyond the seed spread of {spread:.4f}" in verdict.summary
    assert json.loads((tmp_path / "s" / VERDICT).read_text())["beat"] is True
    # each re-run is remembered: a second verdict trains nothing again (a command that would fail is not called)
    runs = sorted(p.parent.name for p in (tmp_path / "s" / CONFIRM).glob(f"*/{RESULT}"))
    assert runs == ["best-seed8", "best-seed9", "recipe-seed8", "recipe-seed9"]
    again = confirm(
        study, sweep, tmp_path / "s", quiet(), objective_evaluate, objective_command("crash_above=0")
    )
    assert again == verdict


def test_a_best_within_the_seed_spread_is_not_called_better_and_the_recipes_values_are_returned(tmp_path):
    sweep, study = _sweep(tmp_path, 4, "seed_spread=2")
    verdict = confirm(
        study, sweep, tmp_path / "s", quiet(), objective_evaluate, objective_command("seed_spread=2")
    )
    assert verdict.best_trial != 0 and verdict.best_losses[0] < verdict.recipe_losses[0]
    assert verdict.spread > abs(sum(verdict.best_losses) - sum(verdict.recipe_losses)) / 3
    assert not verdict.beat and verdict.winner == {"optimizer.lr": 1e-3}
    assert verdict.summary.startswith("no trial beat the recipe: best ")
    assert "within the seed spread of" in verdict.summary and "returns the recipe's values" in verdict.summary


def test_when_the_recipes_own_values_score_best_no_trial_beat_it(tmp_path):
    # the objective's best lr is 10^-2.5: the recipe's own value there, no draw can do better
    sweep, study = _sweep(tmp_path, 3, extra="baseline: {optimizer.lr: 0.0031622776601683794}\n")
    verdict = confirm(study, sweep, tmp_path / "s", quiet(), objective_evaluate, objective_command())
    assert verdict.best_trial == verdict.recipe_trial == 0 and not verdict.beat
    assert verdict.summary.startswith("no trial beat the recipe: its own values (trial 0) scored best")
    assert not (tmp_path / "s" / CONFIRM).exists()  # nothing to re-run
