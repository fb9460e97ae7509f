"""One trial's process: its validation losses reported as metrics.jsonl grows, stopped when the report says so."""

from __future__ import annotations

import sys
import time

import pytest

from tests.sweep.conftest import OBJECTIVE
from trainer.sweep.trial import TrialFailed, run_trial, train_command


def command(run_dir, *settings):
    return [sys.executable, str(OBJECTIVE), "optimizer.lr=0.003", *settings, f"logging.run_dir={run_dir}"]


def test_every_evaluation_is_reported_and_a_finished_run_gives_its_last_loss(tmp_path):
    seen = []
    outcome = run_trial(command(tmp_path), tmp_path, lambda step, loss: seen.append((step, loss)) or False)
    assert [step for step, _ in seen] == [10, 20, 30, 40, 50, 60]
    assert outcome.steps == 60 and not outcome.pruned and outcome.val_loss == seen[-1][1]
    assert "objective: done" in (tmp_path / "train.log").read_text()


def test_a_stop_kills_the_process_at_that_step(tmp_path):
    started = time.monotonic()
    outcome = run_trial(
        command(tmp_path, "schedule.train_iters=2000"), tmp_path, lambda step, loss: step >= 20, timeout_s=60
    )
    assert outcome.pruned and outcome.steps >= 20
    assert time.monotonic() - started < 5  # not the 10 s the 200 evaluations take
    assert "objective: done" not in (tmp_path / "train.log").read_text()


def test_a_crash_and_a_timeout_fail_the_trial_with_its_log(tmp_path):
    with pytest.raises(TrialFailed, match=r"exited with 3; its log: .*train\.log"):
        run_trial(command(tmp_path / "a", "crash_above=0.001"), tmp_path / "a", lambda s, v: False)
    with pytest.raises(TrialFailed, match="still running after 1 s"):
        run_trial(
            command(tmp_path / "b", "schedule.train_iters=2000"),
            tmp_path / "b",
            lambda s, v: False,
            timeout_s=1,
        )


def test_the_trial_runs_the_trainer_fresh_in_its_own_run_directory(tmp_path):
    argv = train_command(tmp_path / "recipe.yaml", ["optimizer.lr=0.01"], tmp_path / "t")
    assert argv[1:] == [
        "-m", "trainer", "train", "--config", str(tmp_path / "recipe.yaml"), "--fresh",
        "--set", "optimizer.lr=0.01", "--set", f"logging.run_dir={tmp_path / 't'}",
    ]  # fmt: skip


def test_a_leftover_trial_directorys_metrics_are_not_reported(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 10, "val_loss": 999.0}\n')  # an earlier run's
    seen = []
    run_trial(command(tmp_path), tmp_path, lambda step, loss: seen.append(loss) or False)
    assert 999.0 not in seen and len(seen) == 6


def test_a_validation_loss_that_is_not_finite_fails_the_trial_at_once(tmp_path):
    started = time.monotonic()
    with pytest.raises(TrialFailed, match="validation loss is not finite at step 20"):
        run_trial(command(tmp_path, "schedule.train_iters=2000", "nan_at=20"), tmp_path, lambda s, v: False)
    assert time.monotonic() - started < 8  # killed there, not the 10 s to the end
    assert "objective: done" not in (tmp_path / "train.log").read_text()


def test_a_run_its_dollar_cap_stopped_is_told_from_one_that_ran_to_the_end(tmp_path):
    seen = []
    outcome = run_trial(
        command(tmp_path / "a", "stop_at=35"),
        tmp_path / "a",
        lambda s, v: seen.append(v) or False,
        train_iters=60,
    )
    assert outcome.steps == 35 and not outcome.pruned and outcome.val_loss == seen[-1]
    assert outcome.stopped == (
        "stopped by its budget cap at step 35 of 60: budget.max_dollars = 1 reached: spent $1.00"
    )
    # stopped before its first evaluation: not a crash either
    early = run_trial(
        command(tmp_path / "b", "stop_at=5"), tmp_path / "b", lambda s, v: False, train_iters=60
    )
    assert early.stopped is not None and early.val_loss is None and early.steps == 5
