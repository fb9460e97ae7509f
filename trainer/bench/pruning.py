"""What a pruning rule would have dropped (issue 48 item 2: "a pruner shown on this benchmark not to drop the
configuration that ends best"): the rule replayed on random search's trials, which ran unpruned to their ends, so
that how every trial ends is known.

Each trial's validation losses are reported, in its order, to Optuna's own pruner of the rule in a study of its
own, through the sweep's own judgement (trainer/sweep/study.py `judge`): at the trial's steps, or at its steps past
its own warm-up (pruner.progress: past_warmup), none from during that warm-up; a stop at the run's last evaluation is
not one (the trial has trained its whole run and is scored). Trial 0, the recipe's values, joins as the benchmark's
sweep adds it: complete, with no rung of its own (`make sweep` runs it through the pruner like any trial); where it
ended best, no rule judged it, and the replay says so (kept_best None) rather than count it kept. The replay is exact
for these trials; in a sweep the sampler would then draw other trials after a stop."""

from __future__ import annotations

from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from trainer.sweep.space import Pruner, Sweep
from trainer.sweep.study import RECIPE, judge

# The rules measured side by side: rungs in steps from the longest warm-up's end (20) and from half the run (30),
# and rungs counted past each trial's own warm-up, from 20 and from 10 steps.
RULES = (
    Pruner(kind="successive_halving", min_resource=20, reduction_factor=3, progress="step"),
    Pruner(kind="successive_halving", min_resource=30, reduction_factor=3, progress="step"),
    Pruner(kind="successive_halving", min_resource=20, reduction_factor=3, progress="past_warmup"),
    Pruner(kind="successive_halving", min_resource=10, reduction_factor=3, progress="past_warmup"),
)


@dataclass(frozen=True)
class Replay:
    rule: str
    pruned: tuple[int, ...]  # the trials the rule stops
    trial_steps: int  # what the trials cost under it
    unpruned_steps: int  # what they cost run to their ends
    best: int  # the trial that ended best
    kept_best: bool | None  # None: that was trial 0, the recipe's values, which no rule judges here


def describe(pruner: Pruner) -> str:
    counted = "steps past each trial's warm-up" if pruner.progress == "past_warmup" else "steps"
    return f"{pruner.kind.replace('_', ' ')}, first rung at {pruner.min_resource} {counted}"


def replay(trials: list[FrozenTrial], pruner: Pruner, sweep: Sweep) -> Replay:
    """`pruner` on `trials` (complete, unpruned, each with its validation losses by step) in their order."""
    train_iters = sweep.train_iters()
    study = optuna.create_study(direction="minimize", pruner=pruner.build(train_iters))
    pruned, steps = [], 0
    for frozen in sorted(trials, key=lambda t: t.number):
        if frozen.user_attrs.get(RECIPE):
            study.add_trial(frozen)
            steps += train_iters
            continue
        trial = study.ask()
        offset = pruner.offset(
            sweep.trial_config(sweep.param_overrides(frozen.params)).schedule.lr_warmup_iters
        )
        stopped = None
        for step, value in sorted(frozen.intermediate_values.items()):
            if judge(trial, value, step, offset, train_iters):
                stopped = step
                break
        if stopped is None:
            study.tell(trial, frozen.value)
            steps += train_iters
        else:
            study.tell(trial, state=TrialState.PRUNED)
            pruned.append(frozen.number)
            steps += stopped
    best = min(trials, key=lambda t: float(t.value if t.value is not None else "inf"))
    kept = None if best.user_attrs.get(RECIPE) else best.number not in pruned
    return Replay(describe(pruner), tuple(pruned), steps, train_iters * len(trials), best.number, kept)
