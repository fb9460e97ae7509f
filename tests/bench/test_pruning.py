"""The pruning replay (trainer/bench/pruning.py) on hand-made learning curves: a trial with a long warm-up starts
behind and ends best, as random search's best did on sampler seed 2 (docs/bench.md)."""

from __future__ import annotations

import optuna
import pytest

from tests.sweep.conftest import write_sweep
from trainer.bench.pruning import RULES, describe, replay
from trainer.sweep.space import Pruner, load_sweep
from trainer.sweep.study import RECIPE

WARM_UP = "  schedule.lr_warmup_iters: {low: 0, high: 20, step: 2}\n"


def _trial(
    number: int, warmup: int, curve: dict[int, float], *, recipe: bool = False, sweep
) -> optuna.trial.FrozenTrial:
    trial = optuna.trial.create_trial(
        params={"optimizer.lr": 1e-3, "schedule.lr_warmup_iters": warmup},
        distributions=sweep.spec.distributions(),
        value=curve[60],
        intermediate_values=curve,
        user_attrs={RECIPE: True} if recipe else {},
    )
    trial.number = number
    return trial


@pytest.fixture
def trials(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path, pruner="none", extra=WARM_UP))
    steps = range(10, 61, 10)
    return sweep, [
        # the recipe's values: added complete, no rung of its own (as bench/sweep.py adds trial 0)
        _trial(0, 2, {s: 9.0 - s / 20 for s in steps}, recipe=True, sweep=sweep),
        _trial(1, 0, {s: 7.5 - s / 100 for s in steps}, sweep=sweep),  # quick start, ends 6.9
        _trial(2, 0, {s: 7.6 - s / 100 for s in steps}, sweep=sweep),  # behind 1 at step 20: stopped there
        # a 20-step warm-up: last at step 20, ahead of every other past its own warm-up, ends best
        _trial(3, 20, {10: 9.5, 20: 8.0, 30: 7.3, 40: 6.5, 50: 6.0, 60: 5.5}, sweep=sweep),
    ]


def test_rungs_counted_in_steps_stop_the_trial_still_warming_up_that_ends_best(trials):
    sweep, frozen = trials
    result = replay(frozen, Pruner(min_resource=20, progress="step"), sweep)
    assert (result.pruned, result.best, result.kept_best) == ((2, 3), 3, False)
    assert (result.trial_steps, result.unpruned_steps) == (60 + 60 + 20 + 20, 240)


def test_rungs_counted_past_each_warm_up_judge_it_at_its_step_40_and_keep_it(trials):
    sweep, frozen = trials
    result = replay(frozen, Pruner(min_resource=20, progress="past_warmup"), sweep)
    assert (result.pruned, result.best, result.kept_best) == ((2,), 3, True)
    assert result.trial_steps == 60 + 60 + 20 + 60


def test_a_stop_at_the_last_evaluation_is_none_and_the_recipe_sets_no_bar(tmp_path):
    """Rungs at 20 and 60 (min_resource 20, reduction factor 3): trial 2 is promoted at step 20 and behind trial 1
    at step 60, where its run has ended (the live sweep scores it too). Trial 0, the recipe's values, is ahead of
    both at step 20 but has no rung (the benchmark adds it complete), so it stops neither; and where it ends best
    no rule is said to have kept it."""
    sweep = load_sweep(write_sweep(tmp_path, pruner="none", extra=WARM_UP))
    recipe = _trial(0, 2, {10: 6.5, 20: 6.0, 30: 5.9, 40: 5.8, 50: 5.7, 60: 5.0}, recipe=True, sweep=sweep)
    first = _trial(1, 0, {10: 7.5, 20: 7.0, 30: 6.8, 40: 6.5, 50: 6.2, 60: 6.0}, sweep=sweep)
    second = _trial(2, 0, {10: 7.4, 20: 6.9, 30: 6.8, 40: 6.7, 50: 6.6, 60: 6.5}, sweep=sweep)
    result = replay([recipe, first, second], Pruner(min_resource=20, progress="step"), sweep)
    assert (result.pruned, result.trial_steps, result.best, result.kept_best) == ((), 180, 0, None)


def test_the_rules_measured_are_named_by_what_their_rungs_count():
    assert [describe(rule) for rule in RULES] == [
        "successive halving, first rung at 20 steps",
        "successive halving, first rung at 30 steps",
        "successive halving, first rung at 20 steps past each trial's warm-up",
        "successive halving, first rung at 10 steps past each trial's warm-up",
    ]
