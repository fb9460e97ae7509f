"""The sweep benchmark's arithmetic and rows, its trials run by the fast objective (tests/sweep/objective.py)."""

from __future__ import annotations

import pytest

from tests.sweep.conftest import objective_command, write_sweep
from trainer.bench.sweep import GRID, GRID_TRIALS, bench_sweep

WARM_UP = "  schedule.lr_warmup_iters: {low: 0, high: 20, step: 5}\n"


@pytest.mark.slow
def test_the_sweep_spends_the_grids_trial_steps_on_more_trials_and_the_rows_compare_them(tmp_path):
    # TPE over lr and warm-up, successive halving, 60 steps a trial.
    sweep = write_sweep(tmp_path, extra=WARM_UP)
    report: dict = {"results": [], "details": {}}
    bench_sweep(report, tmp_path / "out", sweep, command=objective_command())
    details = report["details"]["sweep"]
    grid, tpe = details["grid"], details["sweep"]
    assert grid["trials"]["complete"] == sum(grid["trials"].values()) == GRID_TRIALS
    assert grid["trial_steps"] == grid["unpruned_steps"] == GRID_TRIALS * 60 == details["budget_trial_steps"]
    # The sweep started trials while a whole one fitted: within the budget, and too little left for another.
    assert details["budget_trial_steps"] - 60 < tpe["trial_steps"] <= details["budget_trial_steps"]
    ran = sum(tpe["trials"].values())
    assert tpe["trials"]["pruned"] > 0 and ran > GRID_TRIALS and tpe["unpruned_steps"] == ran * 60
    assert (grid["best_params"]["optimizer.lr"], grid["best_params"]["schedule.lr_warmup_iters"]) in {
        (lr, w) for lr in GRID["optimizer.lr"] for w in GRID["schedule.lr_warmup_iters"]
    }
    assert set(tpe["best_params"]) == set(GRID)  # the same two dimensions, over their whole ranges
    rows = {row["name"].split(" (")[0]: row for row in report["results"]}
    loss = rows["sweep best validation loss"]
    assert (loss["value"], loss["baseline_value"]) == (tpe["best_val_loss"], grid["best_val_loss"])
    steps = rows["sweep trial-steps"]
    assert steps["ratio"] == pytest.approx(tpe["trial_steps"] / tpe["unpruned_steps"])
    assert rows["sweep trials run"]["value"] == ran


def test_a_sweep_yaml_without_the_grids_dimensions_is_refused_before_any_trial(tmp_path):
    sweep = write_sweep(tmp_path)  # lr alone
    with pytest.raises(ValueError, match=r"schedule\.lr_warmup_iters; add them"):
        bench_sweep({"results": [], "details": {}}, tmp_path / "out", sweep, command=objective_command())
    assert not list((tmp_path / "out" / "sweeps").iterdir())
