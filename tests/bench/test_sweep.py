"""The sweep benchmark's arithmetic and rows, its trials run by the fast objective (tests/sweep/objective.py)."""

from __future__ import annotations

from tests.sweep.conftest import objective_command, write_sweep
from trainer.bench.sweep import BUDGET, GRID, bench_sweep


def test_the_sweep_and_the_grid_run_the_same_budget_and_their_rows_compare_them(tmp_path):
    sweep = write_sweep(tmp_path)  # TPE over lr, successive halving
    report: dict = {"results": [], "details": {}}
    bench_sweep(report, tmp_path / "out", sweep, command=objective_command())
    details = report["details"]["sweep"]
    grid, tpe = details["grid"], details["sweep"]
    assert sum(grid["trials"].values()) == sum(tpe["trials"].values()) == BUDGET
    assert grid["trials"]["complete"] == BUDGET and grid["trial_steps"] == BUDGET * 60  # no pruning
    assert tpe["trials"]["pruned"] > 0 and tpe["trial_steps"] < grid["trial_steps"]
    assert {(p["optimizer.lr"], p["schedule.lr_warmup_iters"]) for p in [grid["best_params"]]} <= {
        (lr, w) for lr in GRID["optimizer.lr"] for w in GRID["schedule.lr_warmup_iters"]
    }
    rows = {row["name"].split(" (")[0]: row for row in report["results"]}
    loss = rows["sweep best validation loss"]
    assert (loss["value"], loss["baseline_value"]) == (tpe["best_val_loss"], grid["best_val_loss"])
    steps = rows["sweep trial-steps"]
    assert steps["ratio"] == tpe["trial_steps"] / grid["trial_steps"]
