"""The local driver as a real process (tests/sweep/driver.py: `trainer sweep`'s main, each trial's trainer the fast
objective): stopped by Ctrl-C, SIGTERM or SIGHUP mid-trial it leaves no trainer behind and the resumed sweep runs
the interrupted trial's parameters again without counting it; a second driver on the same study is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.conftest import ROOT
from tests.sweep.conftest import write_sweep
from trainer.sweep.study import ERROR, INTERRUPTED, RECIPE, RERUN_OF, storage

pytestmark = pytest.mark.slow  # driver processes, each trial a process of its own: about a minute a test here


def driver(tmp_path: Path, trials: int, *settings: str) -> subprocess.Popen:
    sweep = tmp_path / "tiny-sweep.yaml"
    if not sweep.exists():
        write_sweep(tmp_path, pruner="none")
    argv = [sys.executable, "-m", "tests.sweep.driver", *settings, *(["--"] if settings else [])]
    argv += ["--sweep", str(sweep), "--name", "d", "--runs", str(tmp_path / "runs"), "--trials", str(trials)]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def trial_dir(tmp_path: Path, number: int) -> Path:
    return tmp_path / "runs" / "sweeps" / "d" / "trials" / f"{number:04d}"


def wait_for(condition, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def trainer_pid(run_dir: Path) -> int:
    """The running objective's pid (its process is the trial's process group leader)."""
    found = subprocess.run(["pgrep", "-f", f"logging.run_dir={run_dir}"], capture_output=True, text=True)
    pids = [int(pid) for pid in found.stdout.split()]
    assert pids, f"no trainer running for {run_dir}"
    return pids[0]


def stored(tmp_path: Path) -> list[optuna.trial.FrozenTrial]:
    """The study's trials as stored, read without resuming it."""
    return optuna.load_study(study_name="d", storage=storage(tmp_path / "runs" / "sweeps" / "d")).get_trials()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes; it is not our child, so its parent reaps it
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["int", "term", "hup"])
def test_a_driver_stopped_mid_trial_kills_its_trainer_and_the_rerun_runs_the_trial_again(tmp_path, stop):
    first = driver(tmp_path, 1, "schedule.train_iters=2000")  # a trial of about 10 s
    metrics = trial_dir(tmp_path, 0) / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 2)
    pid = trainer_pid(trial_dir(tmp_path, 0))
    first.send_signal(stop)
    output, _ = first.communicate(timeout=60)
    assert first.returncode != 0, output
    wait_for(lambda: not alive(pid), 5)  # the trainer went with the driver
    if (
        stop == signal.SIGINT
    ):  # Ctrl-C: the trial's line and one line of the driver's, no traceback (issue 48)
        assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
        assert output.rstrip().endswith("sweep: interrupted; run the same command again to resume d"), output

    assert [t.user_attrs.get(ERROR) for t in stored(tmp_path)] == [
        INTERRUPTED
    ]  # it says why, and it is not counted

    again = driver(tmp_path, 1)
    output, _ = again.communicate(timeout=120)
    assert again.returncode == 0, output
    interrupted, rerun = stored(tmp_path)  # one trial run again, one counted: --trials 1 reached
    assert interrupted.state == TrialState.FAIL and interrupted.user_attrs[ERROR] == INTERRUPTED
    assert rerun.state == TrialState.COMPLETE and rerun.params == interrupted.params
    assert rerun.user_attrs[RERUN_OF] == interrupted.number
    assert (
        interrupted.user_attrs[RECIPE] and rerun.user_attrs[RECIPE]
    )  # trial 0, the recipe's values, run again
    assert "0 of 1 trials finished" in output
    # a third run finds the study done: the interrupted trial is queued once, not again
    third = driver(tmp_path, 1)
    assert "1 of 1 trials already finished" in third.communicate(timeout=120)[0]
    assert len(stored(tmp_path)) == 2


def test_a_second_driver_on_the_same_study_is_refused_at_once_naming_the_first(tmp_path):
    first = driver(tmp_path, 1, "schedule.train_iters=40000")  # a trial of minutes, stopped below
    metrics = trial_dir(tmp_path, 0) / "metrics.jsonl"
    wait_for(lambda: metrics.exists())
    try:
        second = driver(tmp_path, 1)
        output, _ = second.communicate(timeout=60)
        assert second.returncode == 2, output
        assert f"being run by another sweep driver: pid {first.pid} on " in output
        assert f"kill -TERM {first.pid}" in output and "another --name" in output
        assert first.poll() is None  # the first goes on, its trial untouched
        assert [t.state for t in stored(tmp_path)] == [TrialState.RUNNING]
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
