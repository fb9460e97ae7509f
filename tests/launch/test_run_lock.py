"""One live run per run directory (trainer/launch/run_lock.py): the lock, who holds it, and what a refusal says.
The end-to-end case (a second `train` refused while the first lives) is tests/trainer/test_run_ownership.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from trainer.launch import run_lock
from trainer.launch.run_lock import RunHeld, acquire, held_message

# Holds the lock of the run directory argv[1] until its stdin closes, as a run would.
HOLDER = """
import sys
from trainer.launch import run_lock
lock = run_lock.acquire(__import__("pathlib").Path(sys.argv[1]))
print("held", flush=True)
sys.stdin.read()
"""


def test_a_held_directory_is_refused_naming_the_holder_and_freed_when_it_ends(tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "AWS_BATCH_JOB_ID": ""},
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    with pytest.raises(RunHeld) as refused:
        acquire(run_dir)
    message = str(refused.value)
    assert (
        f"run directory {run_dir} is in use by another run: pid {holder.pid} on {socket.gethostname()}"
        in message
    )
    assert f"kill -TERM {holder.pid} (it saves" in message
    assert holder.stdin is not None
    holder.stdin.close()
    holder.wait()
    acquire(run_dir).release()  # the kernel dropped the lock with its holder


def test_the_holder_is_written_into_the_lock_file_which_goes_with_a_release(tmp_path):
    lock = acquire(tmp_path)
    holder = json.loads((tmp_path / "run.lock").read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    assert holder["command"].startswith("python -m trainer")  # then this process's arguments, if any
    lock.release()
    assert not (tmp_path / "run.lock").exists()  # a refused start leaves its run directory as it found it


def test_a_start_that_got_the_lock_of_a_file_since_removed_takes_the_new_one(tmp_path, monkeypatch):
    import fcntl

    lock_file = tmp_path / "run.lock"
    flock = fcntl.flock

    def released_meanwhile(fd: int, operation: int) -> None:
        # The holder releases between this start's open and its flock: it unlinks the file it held.
        if lock_file.exists() and os.path.samestat(os.fstat(fd), os.stat(lock_file)) and not seen:
            seen.append(fd)
            lock_file.unlink()
        flock(fd, operation)

    seen: list[int] = []
    monkeypatch.setattr(fcntl, "flock", released_meanwhile)
    lock = acquire(tmp_path)
    assert seen and os.path.samestat(
        os.fstat(lock.fd), os.stat(lock_file)
    )  # the lock is the file at the path
    lock.release()


def test_the_lock_is_per_open_file_so_a_second_acquire_in_one_process_is_refused_too(tmp_path):
    first = acquire(tmp_path)
    try:
        with pytest.raises(RunHeld, match=f"pid {os.getpid()}"):
            acquire(tmp_path)
    finally:
        first.release()
    acquire(tmp_path).release()


def test_a_supervisor_hands_its_lock_to_its_ranks_and_takes_it_back(tmp_path, monkeypatch):
    monkeypatch.delenv(run_lock.HELD_ENV, raising=False)
    lock = acquire(tmp_path / "run")
    run_lock.hand_to_ranks(lock)
    assert run_lock.held_by_supervisor(tmp_path / "run")
    assert not run_lock.held_by_supervisor(tmp_path / "other")
    lock.release()
    assert run_lock.HELD_ENV not in os.environ


@pytest.mark.parametrize(
    ("holder", "stop"),
    [
        ({"batch_job": "6e0f-42"}, "make cancel STACK=<env> JOB=6e0f-42 (Batch job 6e0f-42"),
        ({"jobset": "llama-8b"}, "make cancel STACK=<env> JOB=llama-8b (JobSet llama-8b)"),
        ({"host": "elsewhere"}, "kill -TERM 7 on elsewhere"),
        ({}, "kill -TERM 7 (it saves at the next step boundary"),
    ],
)
def test_the_refusal_says_how_to_stop_the_holder_where_it_runs(tmp_path, holder, stop):
    message = held_message(tmp_path, {"pid": 7, "host": socket.gethostname(), "command": "x", **holder})
    assert stop in message
    assert "started at an unknown time" in message


def test_a_file_system_without_flock_refuses_the_run(tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_flock(fd: int, operation: int) -> None:
        raise OSError(
            errno.ENOSYS, os.strerror(errno.ENOSYS)
        )  # Lustre mounted with noflock (mount.lustre(8))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with pytest.raises(RunHeld, match=r"refuses flock\(2\).*mount with `-o flock`"):
        acquire(tmp_path)


# Holds a run's locks (run directory argv[1], checkpoint directory argv[2]) until its stdin closes, as a run would.
RUN_HOLDER = """
import sys
from pathlib import Path
from trainer.launch import run_lock
locks = run_lock.hold(Path(sys.argv[1]), Path(sys.argv[2]))
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("shared", ["elsewhere", "first/checkpoints"])
def test_a_run_whose_checkpoint_directory_a_live_run_holds_is_refused_and_keeps_no_lock(tmp_path, shared):
    checkpoints = tmp_path / shared  # checkpoint.dir elsewhere, or the first run's own checkpoints
    holder = subprocess.Popen(
        [sys.executable, "-c", RUN_HOLDER, str(tmp_path / "first"), str(checkpoints)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(RunHeld) as refused:
            run_lock.hold(tmp_path / "second", checkpoints)
        message = str(refused.value)
        assert f"checkpoint directory {checkpoints} is in use by another run: pid {holder.pid} on" in message
        assert "(--set checkpoint.dir=...)" in message
        assert not (
            tmp_path / "second" / "run.lock"
        ).exists()  # all or none: its run directory's was released
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait()
    run_lock.release(
        run_lock.hold(tmp_path / "second", checkpoints)
    )  # the kernel dropped both with the holder


def test_a_checkpoint_directory_that_is_the_run_directory_is_one_lock(tmp_path):
    locks = run_lock.hold(tmp_path, tmp_path)
    assert [lock.path for lock in locks] == [tmp_path / "run.lock"]
    run_lock.release(locks)
    assert not (tmp_path / "run.lock").exists()


@pytest.mark.parametrize("checkpoint_dir", ["run", "run/checkpoints"])
def test_fresh_removes_the_checkpoints_but_never_a_lock_it_holds(tmp_path, checkpoint_dir):
    from trainer.config import load_config
    from trainer.loop import _remove_run_outputs

    run_dir, checkpoints = tmp_path / "run", tmp_path / checkpoint_dir
    cfg = load_config(
        ROOT / "trainer/configs/local.yaml",
        [f"logging.run_dir={run_dir}", f"checkpoint.dir={checkpoints}", "precision=fp32"],
    )
    locks = run_lock.hold(cfg.run_dir, cfg.checkpoint_dir)
    (checkpoints / "iter_0000090").mkdir(parents=True)
    (checkpoints / "iter_0000090" / "metadata.json").write_text("{}")
    (checkpoints / "latest").write_text("iter_0000090\n")
    (run_dir / "metrics.jsonl").write_text("{}\n")
    try:
        _remove_run_outputs(cfg)
        assert sorted(p.name for p in checkpoints.iterdir()) == ["run.lock"]
        assert not (run_dir / "metrics.jsonl").exists()
        for lock in locks:  # still the files this run holds, so a second run is still refused
            assert os.path.samestat(os.fstat(lock.fd), os.stat(lock.path))
        with pytest.raises(RunHeld, match="is in use by another run"):
            run_lock.hold(cfg.run_dir, cfg.checkpoint_dir)
    finally:
        run_lock.release(locks)
