"""One run, one owner (issue 40), for real on CPU: a supervisor killed with SIGKILL takes its ranks and their
checkpoint writers along (trainer/distributed/lifetime.py), and a run directory admits one live run
(trainer/launch/run_lock.py): a second start, `--fresh` included, is refused while the first lives, and accepted
once it is gone."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil
import pytest

from tests.support.training import TIMEOUT_S
from tests.trainer.test_resilience import Training

# Seconds the killed run's ranks and torchrun get to be gone: the kernel signals them at once.
GONE_WITHIN_S = 10
# The rest: the writers and what they forked go with their rank at once, multiprocessing's resource trackers once
# the last process using them is gone; on 2 busy cores that can take a while.
REST_GONE_WITHIN_S = 60


def _of_run(run_dir) -> list[psutil.Process]:
    """Every process of the run started in `run_dir` outside torchrun: they all inherit its lock's variable."""
    lock = str(run_dir / "run.lock")
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("TRAINSTACK_RUN_LOCK") == lock:
                found.append(process)
    return found


def _living(processes: list[psutil.Process]) -> tuple[list[psutil.Process], list[str]]:
    """The processes still running and their command lines: a short-lived child (a writer's helper) that exited and
    is not yet reaped has no command line left (psutil's ZombieProcess, a NoSuchProcess), seen on a loaded machine."""
    living, commands = [], []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            commands.append(" ".join(process.cmdline()))
            living.append(process)
    return living, commands


def _alive(processes: list[psutil.Process]) -> list[str]:
    alive = []
    for process in processes:
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{process.pid} {' '.join(process.cmdline()[:5])}")
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.slow
def test_a_killed_supervisor_leaves_no_rank_and_its_directory_admits_one_run_at_a_time(tmp_path, tiny_config):
    long_run = ("schedule.train_iters=400", "checkpoint.save_interval=2")
    first = Training(tmp_path, "run", tiny_config, *long_run, options=("--nproc", "2"))
    deadline = time.monotonic() + TIMEOUT_S
    while not any(r["step"] >= 3 for r in first.records()) and first.process.poll() is None:
        assert time.monotonic() < deadline, first.log.read_text()[-4000:]
        time.sleep(0.2)  # training, a background save behind it (each rank's writer process started)

    # A second start on the same directory, and one that would start over: refused at once, nothing removed.
    for name, options in (("second", ()), ("fresh", ("--fresh",))):
        into_first = f"logging.run_dir={first.run_dir}"  # the later --set wins
        status, output = Training(tmp_path, name, tiny_config, *long_run, into_first, options=options).wait()
        assert status == 2, output[-4000:]
        assert f"is in use by another run: pid {first.process.pid} on" in output, output[-4000:]
        assert f"kill -TERM {first.process.pid}" in output
        assert (first.run_dir / "metrics.jsonl").exists() and any(first.checkpoints.glob("iter_*"))

    # The supervisor killed as the out-of-memory killer would: nothing it started outlives it.
    started, commands = _living(psutil.Process(first.process.pid).children(recursive=True))
    assert sum("trainer train" in c and "torchrun" not in c for c in commands) == 2, commands  # the ranks
    assert any("trainer.distributed.torchrun" in c for c in commands), commands
    assert sum("multiprocessing" in c for c in commands) >= 2, commands  # the writers (and resource trackers)
    os.kill(first.process.pid, signal.SIGKILL)
    first.process.wait()
    ranks = [
        p for p, c in zip(started, commands, strict=True) if "trainer" in c and "multiprocessing" not in c
    ]
    deadline = time.monotonic() + GONE_WITHIN_S
    while _alive(ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(ranks), _alive(ranks)
    # And everything else of the run: the writers, what they forked, multiprocessing's resource trackers.
    deadline = time.monotonic() + REST_GONE_WITHIN_S
    while (left := _alive(_of_run(first.run_dir))) and time.monotonic() < deadline:
        time.sleep(0.2)
    for process in _of_run(first.run_dir):  # a failure here leaves nothing behind
        with contextlib.suppress(psutil.Error):
            process.kill()
    assert not left, left

    # The lock went with its holder: the same command now starts, resumes from the killed run's newest checkpoint.
    again = Training(tmp_path, "again", tiny_config, *long_run, f"logging.run_dir={first.run_dir}")
    while "resumed from" not in again.log.read_text() and again.process.poll() is None:
        assert time.monotonic() < deadline + TIMEOUT_S, again.log.read_text()[-4000:]
        time.sleep(0.2)
    again.process.send_signal(signal.SIGTERM)  # enough: it started; it saves and stops
    status, output = again.wait()
    assert status == 0 and "resumed from" in output, output[-4000:]
