"""One live run per run directory and per checkpoint directory: the run holds an exclusive lock on
`<run_dir>/run.lock` while it lives, and one on `<checkpoint directory>/run.lock` (its run directory's
`checkpoints/`, or wherever checkpoint.dir points), so that no two live runs write into the same checkpoints.

`train` takes it before anything else is written to the run directory (and so before `--fresh` removes anything):
outside torchrun the supervisor takes it and tells its ranks (HELD_ENV); a rank 0 with no supervisor of ours holding
it (`launch` on a cluster, a hand-started torchrun) takes it itself. The lock is flock(2) on an open file: the kernel
drops it when the holder's last descriptor closes, at its exit or its death by any signal, so no crash leaves a
stale lock behind (a run that ends removes the file as well; a killed one leaves it there, unlocked). The holder
writes who it is into the file (pid, host, command, start time, its Batch job or
JobSet); a second start on the same directory reads that, refuses at once and says how to stop the holder.

Shared file systems: FSx for Lustre honours flock across nodes only when mounted with `flock` ("Enable full flock
support, coherent across all client nodes", mount.lustre(8); `localflock` locks per node only, `noflock` fails the
call). The stack mounts it so: the Batch nodes' fstab (infra/node_bootstrap.py) and the EKS volume's mountOptions
(infra/cluster_software.py), as the FSx for Lustre User Guide's own mount command does ("Mounting from an Amazon
Elastic Compute Cloud instance": `mount -t lustre -o relatime,flock`); the preflight refuses a Lustre mount without
it (trainer/preflight/storage.py). A file system that refuses flock refuses the run, rather than running unguarded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trainer import lock_file
from trainer.contract.container import JOBSET_NAME_ENV

LOCK_FILE = "run.lock"
RUN_DIRECTORY, CHECKPOINT_DIRECTORY = "run directory", "checkpoint directory"
_SETTING = {RUN_DIRECTORY: "--set logging.run_dir=...", CHECKPOINT_DIRECTORY: "--set checkpoint.dir=..."}
# Set by a supervisor that holds its run's lock, for its ranks: the lock file's path.
HELD_ENV = "TRAINSTACK_RUN_LOCK"
# Batch sets it in every job container (AWS Batch User Guide, "Job environment variables").
BATCH_JOB_ENV = "AWS_BATCH_JOB_ID"


class RunHeld(RuntimeError):
    """Another live run holds the run directory (or the lock cannot be taken there); the message says what to do."""


@dataclass
class RunLock:
    """The held lock: an open descriptor on the lock file. Held until `release` or this process's end."""

    path: Path
    fd: int

    def release(self) -> None:
        """Remove the lock file, then drop the lock (closing the descriptor drops the flock): a start that opened
        the file meanwhile finds it unlinked once it gets the lock, and opens a new one (`acquire`)."""
        if self.fd >= 0:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            os.close(self.fd)
            self.fd = -1
        if os.environ.get(HELD_ENV) == str(self.path):
            del os.environ[HELD_ENV]


def lock_path(run_dir: Path) -> Path:
    return Path(os.path.abspath(run_dir / LOCK_FILE))


def acquire(run_dir: Path, what: str = RUN_DIRECTORY) -> RunLock:
    """Take the lock of `run_dir` (a run directory, or `what` else: a checkpoint directory), or raise RunHeld naming
    its holder or why the directory cannot be used. Creates the directory if need be."""
    path = lock_path(run_dir)
    while True:
        try:
            fd = lock_file.open_locked(path)  # never truncated before the lock is ours
        except lock_file.LockBusy:
            raise RunHeld(held_message(run_dir, _holder(path), what)) from None
        except lock_file.LockUnusable as error:
            raise RunHeld(_unusable_message(error, what)) from None
        if _same_file(fd, path):
            break
        os.close(
            fd
        )  # its holder released it (and unlinked it) while this one waited: the lock is the new file's
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(_me()) + "\n").encode(), 0)
    return RunLock(path, fd)


def hold(run_dir: Path, checkpoint_dir: Path) -> list[RunLock]:
    """A run's locks: its run directory's and its checkpoint directory's (one lock where they are the same), so
    that no two live runs share either, wherever checkpoint.dir points. All or none: RunHeld releases any taken."""
    held: list[RunLock] = []
    try:
        for directory, what in ((run_dir, RUN_DIRECTORY), (checkpoint_dir, CHECKPOINT_DIRECTORY)):
            if all(lock.path != lock_path(directory) for lock in held):
                held.append(acquire(directory, what))
    except RunHeld:
        release(held)
        raise
    return held


def release(locks: list[RunLock]) -> None:
    for lock in reversed(locks):
        lock.release()


def held_by_supervisor(run_dir: Path) -> bool:
    """Whether a supervisor above this process holds `run_dir`'s lock (it said so in HELD_ENV)."""
    return os.environ.get(HELD_ENV) == str(lock_path(run_dir))


def hand_to_ranks(lock: RunLock) -> None:
    """Tell the processes this one starts (torchrun, its ranks) that their run's lock is held for them."""
    os.environ[HELD_ENV] = str(lock.path)


def held_message(run_dir: Path, holder: dict, what: str = RUN_DIRECTORY) -> str:
    """Why a second start is refused: who holds `run_dir`, and how to stop it."""
    pid, host = holder.get("pid", "?"), holder.get("host", "?")
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if started else "at an unknown time"
    who = f"pid {pid} on {host} ({holder.get('command', 'command unknown')}), started {when}"
    if job := holder.get("batch_job"):
        stop = f"stop it with make cancel STACK=<env> JOB={job} (Batch job {job}; make status lists them)"
    elif job := holder.get("jobset"):
        stop = f"stop it with make cancel STACK=<env> JOB={job} (JobSet {job})"
    else:
        where = "" if host == socket.gethostname() else f" on {host}"
        stop = f"stop it with kill -TERM {pid}{where} (it saves at the next step boundary, then exits)"
    return (
        f"{what} {run_dir} is in use by another run: {who}. Wait for it to end, {stop}, or give this "
        f"run another directory ({_SETTING[what]}). The lock ({lock_path(run_dir)}) goes with that "
        "process: a crash leaves none behind"
    )


def _unusable_message(error: lock_file.LockUnusable, what: str) -> str:
    if error.flock_refused:
        return (
            f"{error}, so nothing would stop a second run from writing into this {what}. On Lustre, mount with "
            "`-o flock` (mount.lustre(8); the stack's nodes do: infra/node_bootstrap.py), or choose a "
            f"{what} on a file system that supports it ({_SETTING[what]})"
        )
    return f"{what} cannot be used: {error}. Choose a {what} that is a writable directory ({_SETTING[what]})"


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _me() -> dict:
    me: dict = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": shlex.join(["python", "-m", "trainer", *sys.argv[1:]]),  # only `train` takes the lock
        "started": time.time(),
    }
    if job := os.environ.get(BATCH_JOB_ENV):
        me["batch_job"] = job
    if jobset := os.environ.get(JOBSET_NAME_ENV):
        me["jobset"] = jobset
    return me


def _holder(path: Path) -> dict:
    """What the holder wrote; it writes just after it takes the lock, so a moment's wait covers that gap."""
    for _ in range(10):
        with contextlib.suppress(OSError, ValueError):
            holder = json.loads(path.read_text())
            if isinstance(holder, dict):
                return holder
        time.sleep(0.05)
    return {}
