"""The sweep benchmark's arithmetic and rows, its trials run by the fast objective (tests/sweep/objective.py) and
scored on the windows it writes (tests/sweep/conftest.py objective_evaluate)."""

from __future__ import annotations

import json

import pytest

from tests.sweep.conftest import objective_command, objective_evaluate, write_sweep
from trainer.bench.pruning import RULES, describe
from trainer.bench.sweep import BUDGET_TRIALS, bench_sweep
from trainer.sweep.confirm import CONFIRM

WARM_UP = "  schedule.lr_warmup_iters: {low: 0, high: 10, step: 2}\n"


@pytest.mark.slow
def test_the_sweep_random_search_and_the_recipe_share_a_budget_per_sampler_seed_and_the_rows_compare_them(
    tmp_path,
):
    # TPE over lr and warm-up, successive halving from step 10 (the longest warm-up), 60 steps a trial.
    sweep = write_sweep(tmp_path, extra=WARM_UP)
    report: dict = {"results": [], "details": {}}
    out = tmp_path / "out"
    bench_sweep(report, out, sweep, command=objective_command(), evaluate=objective_evaluate, seeds=(0, 1, 2))
    details = report["details"]["sweep"]
    budget = details["budget_trial_steps"]
    assert budget == BUDGET_TRIALS * 60 and [row["seed"] for row in details["seeds"]] == [0, 1, 2]
    for row in details["seeds"]:
        tpe, rnd = row["sweep"], row["random"]
        # random search: whole trials only, as many as the budget buys, no pruning
        assert rnd["trials"]["complete"] == sum(rnd["trials"].values()) == BUDGET_TRIALS
        assert rnd["trial_steps"] == rnd["unpruned_steps"] == budget
        # the sweep started trials while a whole one fitted: within the budget, too little left for another
        assert budget - 60 < tpe["trial_steps"] <= budget
        ran = sum(tpe["trials"].values())
        assert tpe["trials"]["pruned"] > 0 and ran > BUDGET_TRIALS and tpe["unpruned_steps"] == ran * 60
        # both begin with the recipe's values: the same first trial and value
        assert tpe["values"][0] == rnd["values"][0]
        verdict = tpe["verdict"]
        assert verdict["recipe_losses"][0] == tpe["values"][0] and len(verdict["best_losses"]) == 3
    # the recipe's values are trained once for trial 0 of every study, and once per extra trainer seed
    assert len({(row["sweep"]["values"][0], row["random"]["values"][0]) for row in details["seeds"]}) == 1
    assert not list((out / "sweeps").glob("*-*/trials/0000/train.log"))
    assert not list((out / "sweeps" / "sweep-1" / CONFIRM).glob("recipe-*/train.log"))
    assert list((out / "sweeps" / "sweep-0" / CONFIRM).glob("recipe-*/train.log"))
    rows = {row["name"]: row for row in report["results"]}
    first = details["seeds"][0]
    against_recipe = next(
        r for n, r in rows.items() if n.startswith("sampler seed 0: sweep best held-out loss (mean")
    )
    assert against_recipe["value"] == pytest.approx(sum(first["sweep"]["verdict"]["best_losses"]) / 3)
    against_random = rows["sampler seed 0: sweep best held-out loss (its trial's seed)"]
    assert (against_random["value"], against_random["baseline_value"]) == (
        first["sweep"]["best_value"], first["random"]["best_value"],
    )  # fmt: skip
    steps = next(r for n, r in rows.items() if n.startswith("sampler seed 0: sweep trial-steps"))
    assert steps["ratio"] == pytest.approx(first["sweep"]["trial_steps"] / first["sweep"]["unpruned_steps"])
    # each pruning rule replayed on random search's whole trials: its cost against theirs, summed over the seeds
    for index, rule in enumerate(RULES):
        replays = [row["random"]["pruning"][index] for row in details["seeds"]]
        assert all(r["rule"] == describe(rule) and r["unpruned_steps"] == budget for r in replays)
        assert any(r["pruned"] for r in replays) and all(
            r["trial_steps"] < budget for r in replays if r["pruned"]
        )
        assert all(r["best"] == min(range(BUDGET_TRIALS), key=lambda n, row=row: row["random"]["values"][n])
                   for r, row in zip(replays, details["seeds"], strict=True))  # fmt: skip
        replayed = next(r for n, r in rows.items() if n.startswith(f"pruning replayed on random search's trials: "
                                                                   f"{describe(rule)} (kept"))  # fmt: skip
        assert (replayed["value"], replayed["baseline_value"]) == (
            sum(r["trial_steps"] for r in replays), 3 * budget,
        )  # fmt: skip
    json.dumps(report)  # the report is written as JSON
