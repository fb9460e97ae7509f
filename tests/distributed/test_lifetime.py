"""A trainer process started by another ends with it (trainer/distributed/lifetime.py), really: a parent killed with
SIGKILL takes its child along, and a process nobody of ours started outlives its parent as any program does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from tests.conftest import ROOT
from trainer.distributed.lifetime import STARTED_BY

# The parent: marks its children as its own (or not), starts one that imports the trainer package, prints its pid.
CHILD = """
import sys, time
if sys.argv[1] == "late":
    time.sleep(1)
import trainer
if sys.argv[1] != "late":  # a late child's stdout is a pipe to a dead parent: it says nothing
    print(flush=True)
time.sleep(60)
"""
PARENT = f"""
CHILD = {CHILD!r}
import os, subprocess, sys, time
from trainer.distributed import lifetime
if sys.argv[1] == "ours":
    lifetime.start_children()
late = sys.argv[2] == "late"  # the child imports the trainer package only after its parent is killed
child = subprocess.Popen([sys.executable, "-c", CHILD, sys.argv[2]], stdout=subprocess.PIPE, text=True)
if not late:
    child.stdout.readline()  # the child has imported the trainer package
print(child.pid, flush=True)
time.sleep(60)
"""


def _child_of_a_killed_parent(mode: str, when: str = "started") -> psutil.Process:
    """The child of a parent now killed; with `when` "late", a parent left unreaped (a zombie, as where the
    container's PID 1 reaps nothing) until the child has had time to look."""
    environment = {k: v for k, v in os.environ.items() if k != STARTED_BY}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, mode, when],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env=environment,
    )
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    os.kill(parent.pid, signal.SIGKILL)
    if when == "late":
        gone = _gone(child, within_s=10)
        if not gone:
            child.kill()
        assert gone
    parent.wait()
    return child


def _gone(process: psutil.Process, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_child_of_a_trainer_process_ends_when_its_parent_is_killed():
    assert _gone(_child_of_a_killed_parent("ours"), within_s=5)


def test_a_child_whose_parent_died_before_it_asked_ends_itself():
    _child_of_a_killed_parent("ours", "late")


def test_a_process_no_trainer_process_started_outlives_its_parent():
    child = _child_of_a_killed_parent("theirs")
    try:
        assert not _gone(child, within_s=1)
    finally:
        child.kill()


# A bound process (STARTED_BY names the test) that forks, as megatron's checkpoint writer forks a process per file.
FORKER = """
import os, time
import trainer
pid = os.fork()
if pid == 0:
    time.sleep(60)
    os._exit(0)
print(pid, flush=True)
time.sleep(60)
"""


def test_what_a_bound_process_forks_ends_with_it():
    environment = {**os.environ, STARTED_BY: str(os.getpid())}
    forker = subprocess.Popen(
        [sys.executable, "-c", FORKER], cwd=ROOT, stdout=subprocess.PIPE, text=True, env=environment
    )
    assert forker.stdout is not None
    forked = psutil.Process(int(forker.stdout.readline()))
    forker.kill()
    forker.wait()
    gone = _gone(forked, within_s=5)
    if not gone:
        forked.kill()
    assert gone
