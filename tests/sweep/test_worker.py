"""Workers sharing one study (trainer/sweep/worker.py), as a stack's array job children do on FSx: two real worker
processes on one JournalFileBackend in a local directory, and the sweep's one dollar cap, with the fast stand-in
objective (tests/sweep/objective.py) in the trainer's place."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from trainer.sweep.study import WORKER, storage
from trainer.sweep.worker import spent, stop_on_sigterm, work, worker_index

from .conftest import objective_command, objective_evaluate, quiet, write_sweep


def _worker(sweep_path: Path, directory: Path, trials: int, index: int) -> None:
    work(
        sweep_path,
        "shared",
        directory,
        trials,
        quiet(),
        worker=index,
        command=objective_command(),
        evaluate=objective_evaluate,
    )


def _stoppable_worker(sweep_path: Path, directory: Path) -> None:
    # Trials of 100,000 steps (a validation loss every 10, 0.05 s apart): still running when SIGTERM comes.
    with stop_on_sigterm():
        work(
            sweep_path,
            "stopped",
            directory,
            4,
            quiet(),
            overrides=("schedule.train_iters=100000", "schedule.lr_decay_iters=100000"),
            command=objective_command(),
            evaluate=objective_evaluate,
        )


def _trials(directory: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=storage(directory)).trials


@pytest.mark.slow
def test_two_worker_processes_share_one_study(tmp_path):
    sweep_path = write_sweep(tmp_path)
    directory = tmp_path / "study"
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_worker, args=(sweep_path, directory, 6, i)) for i in (0, 1)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=120)
        assert process.exitcode == 0
    trials = _trials(directory, "shared")
    # The study holds the sweep's trials, each decided once, numbered 0..n-1 with no trial run twice.
    assert (
        6 <= len(trials) <= 7
    )  # a race between the two checks may start one more, never more than a worker's
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert sorted(t.number for t in trials) == list(range(len(trials)))
    # Both workers ran trials, each under its own run directory in the shared study's.
    assert {t.user_attrs[WORKER] for t in trials} == {0, 1}
    assert len({t.user_attrs["run_dir"] for t in trials}) == len(trials)
    # Their seeds differ: the two workers' first draws are not the same parameters.
    firsts = [min((t for t in trials if t.user_attrs[WORKER] == i), key=lambda t: t.number) for i in (0, 1)]
    assert firsts[0].params != firsts[1].params


def test_the_dollar_cap_stops_new_trials(tmp_path):
    sweep_path = write_sweep(tmp_path)
    directory = tmp_path / "study"
    command = objective_command("dollars_per_trial=4")

    def capped() -> str:
        return work(sweep_path, "capped", directory, 8, quiet(), max_dollars=10.0, command=command,
                    evaluate=objective_evaluate)  # fmt: skip

    reason = capped()
    trials = _trials(directory, "capped")
    # $4 a trial: after three ($12 >= $10) no trial starts, though 8 were asked for.
    assert len(trials) == 3
    assert spent(directory) == pytest.approx(12.0)
    assert reason == "budget.max_dollars = 10 reached: spent $12.00"
    # Each trial ran with what remained of the cap as its own budget.max_dollars.
    budgets = [
        re.search(r"budget.max_dollars=(\S+)", (Path(t.user_attrs["log"])).read_text()).group(1)
        for t in trials
    ]
    assert budgets == ["10", "6", "2"]
    # Run again (a worker restarted): the cap still holds, nothing starts.
    again = capped()
    assert again == reason and len(_trials(directory, "capped")) == 3


def test_what_is_left_of_the_cap_is_read_once_per_trial(tmp_path, monkeypatch):
    """Another worker's trial writes its ledger between two reads of the spend: $9.995 spent when the cap is
    checked, $10.50 a moment later. The worker reads it once, so no trial starts on what is left ($0.005, under
    a trial's minimum) and none gets a negative budget.max_dollars, which the trainer refuses (the trial FAILs)."""
    from trainer.sweep import worker as module

    sweep_path = write_sweep(tmp_path)
    directory = tmp_path / "study"
    reads = iter([9.995, 10.5, 10.5, 10.5])
    monkeypatch.setattr(module, "spent", lambda _: next(reads))
    command = objective_command("dollars_per_trial=1")
    reason = work(
        sweep_path,
        "raced",
        directory,
        8,
        quiet(),
        max_dollars=10.0,
        command=command,
        evaluate=objective_evaluate,
    )
    assert reason == (
        "budget.max_dollars = 10: $0.0050 left (spent $9.9950), under a trial's minimum of $0.01"
    )
    # no trial started: trial 0, the recipe's values, waits in the queue
    assert [t.state for t in _trials(directory, "raced")] == [TrialState.WAITING]


def test_a_worker_takes_back_only_its_own_interrupted_trial(tmp_path):
    sweep_path = write_sweep(tmp_path)
    directory = tmp_path / "study"
    work(
        sweep_path,
        "resume",
        directory,
        1,
        quiet(),
        worker=0,
        command=objective_command(),
        evaluate=objective_evaluate,
    )
    study = optuna.load_study(study_name="resume", storage=storage(directory))
    # Two trials left running: one by worker 1 (stopped, say, by a Spot reclaim), one by worker 0 (still at it).
    for index in (1, 0):
        trial = study.ask()
        trial.set_user_attr(WORKER, index)
        trial.suggest_float("optimizer.lr", 1.0e-4, 1.0e-1, log=True)
    work(
        sweep_path,
        "resume",
        directory,
        4,
        quiet(),
        worker=1,
        command=objective_command(),
        evaluate=objective_evaluate,
    )
    trials = _trials(directory, "resume")
    states = {t.number: (t.state, t.user_attrs.get(WORKER)) for t in trials}
    assert states[1] == (
        TrialState.FAIL,
        1,
    )  # worker 1's own: failed as interrupted, its parameters run again
    assert states[2] == (TrialState.RUNNING, 0)  # worker 0's: left alone
    assert trials[3].params == trials[1].params and trials[3].user_attrs[WORKER] == 1
    # 4 trials: one finished before, worker 0's still running, and two new; the interrupted one does not count.
    assert sum(t.state != TrialState.FAIL for t in trials) == 4


def test_a_workers_index_is_its_array_childs_on_batch_and_its_pods_on_eks():
    # Batch sets AWS_BATCH_JOB_ARRAY_INDEX in an array job's children (Batch user guide, "Array jobs"); an Indexed
    # Job's pods get JOB_COMPLETION_INDEX (Kubernetes docs, "Jobs", completion mode Indexed).
    assert worker_index({"AWS_BATCH_JOB_ARRAY_INDEX": "3"}) == 3
    assert worker_index({"JOB_COMPLETION_INDEX": "2"}) == 2
    assert worker_index({}) == 0


def test_sigterm_stops_the_worker_and_its_trial_and_leaves_the_trial_to_take_back(tmp_path):
    """A stopped container's worker (Batch, or a pod deleted): exits 143 at once, its trial's trainer killed with it,
    the trial left running in the study for the worker of its index to take back."""
    sweep_path = write_sweep(tmp_path)
    directory = tmp_path / "study"
    process = multiprocessing.get_context("spawn").Process(
        target=_stoppable_worker, args=(sweep_path, directory)
    )
    process.start()
    metrics = directory / "trials" / "0000" / "metrics.jsonl"
    deadline = time.monotonic() + 60
    while not (metrics.exists() and metrics.stat().st_size > 0):
        assert time.monotonic() < deadline and process.is_alive()
        time.sleep(0.1)
    os.kill(process.pid, signal.SIGTERM)
    process.join(timeout=30)
    assert process.exitcode == 128 + signal.SIGTERM
    size = metrics.stat().st_size
    time.sleep(0.5)  # the trial's trainer would write a line every 0.05 s
    assert metrics.stat().st_size == size
    [trial] = _trials(directory, "stopped")
    assert trial.state == TrialState.RUNNING and trial.user_attrs[WORKER] == 0


def test_the_driver_and_the_worker_put_back_the_signal_handlers_they_found(tmp_path):
    """Their SIGTERM (and the driver's SIGHUP) handler lasts as long as they run: one left behind in a process that
    called them (a test's) would be inherited by its forked children, which then outlive a SIGTERM while blocked in
    C (trainer/data/prepare.py's pool hung a test run so)."""
    from trainer.__main__ import main as trainer_main

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    with stop_on_sigterm(signal.SIGHUP):
        assert (
            signal.getsignal(signal.SIGTERM) not in before and signal.getsignal(signal.SIGHUP) not in before
        )
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before
    missing = str(tmp_path / "none.yaml")
    assert trainer_main(["sweep", "--sweep", missing, "--runs", str(tmp_path)]) == 2
    assert (
        trainer_main(
            ["sweep-worker", "--sweep", missing, "--name", "s", "--dir", str(tmp_path), "--trials", "1"]
        )
        == 2
    )
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before


@pytest.mark.parametrize("text", ["0", "-5", "nan", "inf", "ten"])
def test_the_worker_refuses_a_cap_that_is_not_a_positive_finite_number(text):
    import argparse

    from trainer.sweep.worker import positive_dollars

    with pytest.raises(argparse.ArgumentTypeError):
        positive_dollars(text)
    assert positive_dollars("12.5") == 12.5


def test_a_workers_trials_are_logged_to_mlflow_as_the_local_sweeps_are(tmp_path):
    """`sweep-worker --mlflow URI` (a stack's MLFLOW=): each trial it decides is an MLflow run of the experiment
    named after the sweep, through the local sweep's own tracker (trainer/sweep/command.py trial_tracker)."""
    from mlflow import MlflowClient

    sweep_path = write_sweep(tmp_path)
    store = f"sqlite:///{tmp_path}/mlflow.db"
    work(
        sweep_path,
        "tracked",
        tmp_path / "study",
        2,
        quiet(),
        worker=1,
        command=objective_command(),
        evaluate=objective_evaluate,
        mlflow=store,
    )
    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("tracked")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(run.info.run_name for run in runs) == ["tracked-t0000", "tracked-t0001"]
    for run in runs:
        assert run.data.tags["sweep"] == "tracked" and run.data.tags["state"] in ("complete", "pruned")
        assert "optimizer.lr" in run.data.params and "val_loss" in run.data.metrics
