"""The study's wiring with Optuna's real TPE sampler, pruners and journal storage, on a fast objective
(tests/sweep/objective.py) run as each trial's process."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from rich.console import Console

from tests.conftest import ROOT
from tests.sweep.conftest import (
    TINY,
    objective_sweep,
    sweep_of,
    write_sweep,
)
from trainer.sweep.report import best_trial, failures, trials_table
from trainer.sweep.space import SweepError, load_sweep
from trainer.sweep.study import ERROR, JOURNAL, LOG, RECIPE, STEPS, STOPPED, open_study


def _render(table) -> str:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(table)
    return console.export_text()


def test_the_pruner_stops_trials_behind_at_an_evaluation_step_and_their_steps_are_counted(finished_sweep):
    _, study, directory = finished_sweep
    trials = study.get_trials()
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(trials) == 8 and pruned and complete
    assert all(t.user_attrs[STEPS] == 60 for t in complete)
    # what the pruner saw: every evaluation step up to where the trial stopped; its cost, what it trained before
    # the kill landed (on a loaded machine steps past that evaluation, up to the whole run)
    assert all(t.user_attrs[STEPS] <= 60 for t in pruned)
    for trial in pruned:
        reported = sorted(trial.intermediate_values)
        assert reported == list(range(10, reported[-1] + 1, 10))
        assert reported[-1] <= trial.user_attrs[STEPS]  # what it trained before the kill counts too
    assert study.best_value == min(t.value for t in complete)
    assert (directory / JOURNAL).is_file()
    assert isinstance(study.sampler, optuna.samplers.TPESampler)
    assert isinstance(study.pruner, optuna.pruners.SuccessiveHalvingPruner)


def test_a_crashing_trial_is_failed_with_its_log_and_the_sweep_goes_on(tmp_path):
    sweep = sweep_of(tmp_path, pruner="none")
    # every lr above 3e-3 crashes after step 10; the startup draws (seed 0) hold both kinds
    study = objective_sweep(sweep, "crash", tmp_path / "s", 6, "crash_above=0.003")
    failed = study.get_trials(states=(TrialState.FAIL,))
    assert failed and len(study.get_trials()) == 6
    assert study.get_trials(states=(TrialState.COMPLETE,))
    for trial in failed:
        assert trial.params["optimizer.lr"] > 0.003
        assert "exited with 3" in trial.user_attrs[ERROR]
        assert "crashed on purpose" in Path(trial.user_attrs[LOG]).read_text()


def test_a_rerun_resumes_the_stored_study_with_new_draws(tmp_path):
    sweep = sweep_of(tmp_path, pruner="none")
    first = objective_sweep(sweep, "again", tmp_path / "s", 3)
    before = [(t.number, t.params, t.value) for t in first.get_trials()]
    second = objective_sweep(sweep, "again", tmp_path / "s", 5)
    trials = second.get_trials()
    assert [(t.number, t.params, t.value) for t in trials[:3]] == before
    assert len(trials) == 5 and all(t.state == TrialState.COMPLETE for t in trials)
    # the sampler's seed moved on: the new trials are not the first ones drawn again
    assert trials[3].params != trials[0].params
    assert objective_sweep(sweep, "again", tmp_path / "s", 5).get_trials() == trials


def test_a_trial_left_running_by_a_stopped_driver_is_failed_and_run_again(tmp_path):
    sweep = sweep_of(tmp_path, pruner="none")
    study = open_study(sweep, "stopped", tmp_path / "s")
    left = study.ask({"optimizer.lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)})
    study = objective_sweep(sweep, "stopped", tmp_path / "s", 1)
    first, again = study.get_trials()
    assert first.state == TrialState.FAIL and "interrupted" in first.user_attrs[ERROR]
    assert again.state == TrialState.COMPLETE and again.params == left.params


def test_a_study_made_for_another_space_is_refused(tmp_path):
    objective_sweep(sweep_of(tmp_path, pruner="none"), "x", tmp_path / "s", 1)
    other = sweep_of(tmp_path, pruner="none", extra="  optimizer.weight_decay: {low: 0.0, high: 0.2}\n")
    with pytest.raises(SweepError, match=r"--name x: the study in .* another space"):
        open_study(other, "x", tmp_path / "s")


def test_a_study_stored_before_pruner_progress_existed_resumes_and_another_progress_is_refused(tmp_path):
    path = write_sweep(tmp_path)
    sweep = load_sweep(path)
    # what a study made before the setting carries: the fingerprint of the same spec without it (the formula of
    # Sweep.fingerprint before pruner.progress, commit 63d3ba2)
    before = sweep.spec.model_dump(mode="json", exclude={"trials"})
    del before["pruner"]["progress"]
    body = json.dumps({"spec": before, "shared": sweep.shared}, sort_keys=True)
    stored = hashlib.sha256(body.encode()).hexdigest()[:16]
    assert sweep.fingerprint == stored
    path.write_text(path.read_text().replace("reduction_factor: 3}", "reduction_factor: 3, progress: step}"))
    assert load_sweep(path).fingerprint == stored
    path.write_text(path.read_text().replace("progress: step}", "progress: past_warmup}"))
    assert load_sweep(path).fingerprint != stored


@pytest.mark.parametrize(
    ("kind", "pruner"),
    [
        ("successive_halving", optuna.pruners.SuccessiveHalvingPruner),
        ("hyperband", optuna.pruners.HyperbandPruner),
        ("median", optuna.pruners.MedianPruner),
        ("none", optuna.pruners.NopPruner),
    ],
)
def test_each_pruner_kind_is_optunas(tmp_path, kind, pruner):
    assert isinstance(open_study(sweep_of(tmp_path, pruner=kind), "p", tmp_path / "s").pruner, pruner)


def test_past_warmup_progress_judges_each_trial_from_the_end_of_its_own_warm_up(tmp_path):
    """pruner.progress: past_warmup (issue 48 item 2): the pruner sees a trial's evaluations at its steps past its own
    warm-up, none from during it, while its cost stays its real steps."""
    path = write_sweep(tmp_path, extra="  schedule.lr_warmup_iters: {choices: [2, 10, 20]}\n")
    path.write_text(
        path.read_text().replace("reduction_factor: 3}", "reduction_factor: 3, progress: past_warmup}")
    )
    study = objective_sweep(load_sweep(path), "progress", tmp_path / "s", 6)
    judged = [t for t in study.get_trials() if t.state != TrialState.FAIL]
    assert {t.params["schedule.lr_warmup_iters"] for t in judged} >= {2, 20}
    for trial in judged:
        warmup = trial.params["schedule.lr_warmup_iters"]
        progress = [step - warmup for step in range(10, 61, 10) if step >= warmup]
        reported = sorted(trial.intermediate_values)
        # a pruned trial's reports stop where it was judged (its cost, STEPS, may run past that: the kill's delay)
        assert reported == (progress if trial.state == TrialState.COMPLETE else progress[: len(reported)])
    assert any(t.state == TrialState.PRUNED for t in judged)
    complete = [t for t in judged if t.state == TrialState.COMPLETE]
    assert complete and all(t.user_attrs[STEPS] == 60 for t in complete)


def test_a_stop_at_the_last_evaluation_is_none_the_trial_is_complete_and_scored(tmp_path):
    """Rungs at 20 and 60 (min_resource 20, reduction factor 3): the trial of lr 0.003 leads at step 20 and falls
    behind the recipe's at step 60, where it has trained its whole run; it is scored, not thrown away as pruned
    (trainer/bench/pruning.py replays it the same way)."""
    path = tmp_path / "last.yaml"
    path.write_text(
        f"recipe: {TINY}\nsampler: {{kind: grid}}\n"
        "pruner: {kind: successive_halving, min_resource: 20, reduction_factor: 3}\n"
        "set: {schedule.train_iters: 60, schedule.lr_decay_iters: 60, schedule.eval_interval: 10}\n"
        "space:\n  optimizer.lr: {choices: [0.001, 0.003]}\n"
    )
    # lingering after its last line, as the trainer saving its last checkpoint: a stop there could still kill it
    study = objective_sweep(load_sweep(path), "last", tmp_path / "s", 3, "fade_lr=0.003", "linger=0.5")
    faded = next(t for t in study.get_trials() if t.params["optimizer.lr"] == 0.003)
    recipe = study.get_trials()[0]
    assert faded.intermediate_values[20] < recipe.intermediate_values[20]  # ahead at the first rung
    assert faded.intermediate_values[60] > recipe.intermediate_values[60]  # behind at the second, the end
    assert faded.state == TrialState.COMPLETE and faded.user_attrs[STEPS] == 60 and faded.value is not None


def test_a_grid_runs_each_combination_once(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(
        f"recipe: {TINY}\nsampler: {{kind: grid}}\npruner: {{kind: none}}\n"
        "set: {schedule.train_iters: 20, schedule.lr_decay_iters: 20}\n"
        "baseline: {schedule.lr_warmup_iters: 0}\n"  # the recipe's 2 is no grid point; trial 0 (0.001, 0) is
        "space:\n  optimizer.lr: {choices: [0.001, 0.003, 0.01]}\n  schedule.lr_warmup_iters: {choices: [0, 5]}\n"
    )
    study = objective_sweep(load_sweep(path), "grid", tmp_path / "s", 7)
    assert isinstance(study.sampler, optuna.samplers.GridSampler)
    recipe, *grid = study.get_trials()
    assert recipe.user_attrs[RECIPE] and recipe.params == {
        "optimizer.lr": 0.001,
        "schedule.lr_warmup_iters": 0,
    }
    combinations = [(t.params["optimizer.lr"], t.params["schedule.lr_warmup_iters"]) for t in grid]
    assert sorted(combinations) == sorted((lr, w) for lr in (0.001, 0.003, 0.01) for w in (0, 5))


def test_a_trial_its_dollar_cap_stopped_is_pruned_at_its_last_report_not_complete(tmp_path):
    sweep = sweep_of(tmp_path, pruner="none")
    study = objective_sweep(sweep, "cap", tmp_path / "s", 2, "stop_at=35")
    for trial in study.get_trials():
        assert trial.state == TrialState.PRUNED, trial
        assert "stopped by its budget cap at step 35 of 60" in trial.user_attrs[STOPPED]
        assert trial.user_attrs[STEPS] == 35 and trial.value == trial.intermediate_values[30]
    assert best_trial(study) is None  # no capped trial is the best
    assert "pruned (budget cap)" in str(_render(trials_table(study, sweep)))
    early = objective_sweep(sweep, "early", tmp_path / "e", 1, "stop_at=5")
    assert [t.state for t in early.get_trials()] == [
        TrialState.PRUNED
    ]  # capped before any evaluation: no crash


def test_a_diverged_trial_is_failed_with_why(tmp_path):
    sweep = sweep_of(tmp_path, pruner="none")
    study = objective_sweep(sweep, "nan", tmp_path / "s", 1, "nan_at=20")
    (trial,) = study.get_trials()
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs[ERROR].startswith("validation loss is not finite at step 20")
    assert failures(study)[0].startswith("trial 0: validation loss is not finite at step 20")


def test_a_study_whose_recipe_was_edited_is_refused_saying_how_to_go_on(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(TINY.read_text())
    path = write_sweep(tmp_path, pruner="none")
    path.write_text(path.read_text().replace(str(TINY), str(recipe)))
    objective_sweep(load_sweep(path), "r", tmp_path / "s", 1)
    recipe.write_text(recipe.read_text().replace("clip_grad: 1.0", "clip_grad: 0.5"))
    with pytest.raises(SweepError, match=r"the recipe .*recipe\.yaml has changed since the study") as error:
        open_study(load_sweep(path), "r", tmp_path / "s")
    assert "restore the recipe to resume, give another --name" in str(error.value)


def test_the_median_pruner_waits_min_resource_steps(tmp_path):
    pruner = open_study(sweep_of(tmp_path, pruner="median"), "m", tmp_path / "s").pruner
    assert pruner._n_warmup_steps == 10  # conftest's min_resource


HELD_WRITE = """
import signal, threading
from trainer.sweep.study import signals_held

def stop(signum, _):
    raise SystemExit(f"stopped after {len(written)} of 1000")

signal.signal(signal.SIGTERM, stop)
go = threading.Event()
# The kernel gives a process's signal to any thread that does not block it: here, to the one started before the
# block, as the driver's second thread is (no mask set in the block reaches it).
sender = threading.Thread(target=lambda: go.wait() and signal.pthread_kill(threading.get_ident(), signal.SIGTERM))
sender.start()
written = []
with signals_held():
    go.set()
    sender.join()
    for step in range(1000):  # bytecodes at which a Python handler would run
        written.append(step)
"""


def test_a_stop_signal_sent_during_a_journal_write_is_delivered_just_after_it():
    """CI saw a SIGTERM land inside a held journal write (an interrupted trial then recorded as failed with no
    reason): the driver has a second thread, started before the write, and the kernel gives a process's signal to
    a thread that does not block it, whatever the main thread's mask; Python then runs the handler in the main
    thread. In a process of its own, as the driver (pytest's process does not show it)."""
    ended = subprocess.run(
        [sys.executable, "-c", HELD_WRITE], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert ended.stderr.strip() == "stopped after 1000 of 1000", ended.stderr
