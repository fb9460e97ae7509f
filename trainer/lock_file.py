"""A directory's lock file, opened and locked with flock(2) without waiting: the mechanism under the run lock
(trainer/launch/run_lock.py) and the sweep driver's (trainer/sweep/study.py). A directory that cannot hold one (a
regular file where the directory should be, a path under a file, a read-only or immutable directory, a lock file
that cannot be opened) is refused with one sentence naming the path and why, not an OSError's traceback."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path


class LockBusy(Exception):
    """Another open file holds the lock."""


class LockUnusable(Exception):
    """The lock file cannot be made, opened or locked; the message names the path and why. `flock_refused`: the
    file opened but its file system refuses flock(2) (Lustre mounted `noflock`)."""

    def __init__(self, message: str, *, flock_refused: bool = False):
        super().__init__(message)
        self.flock_refused = flock_refused


def open_locked(path: Path) -> int:
    """Create `path`'s directory if need be, open `path` (never truncated: a holder's record stays readable) and
    take its exclusive lock: the open descriptor, which holds the lock until it is closed."""
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise LockUnusable(_no_directory(directory, error)) from None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise LockUnusable(_no_file(path, error)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise LockBusy(str(path)) from None
        raise LockUnusable(
            f"cannot lock {path} ({os.strerror(error.errno or 0)}): its file system refuses flock(2)",
            flock_refused=True,
        ) from None
    return fd


def _no_directory(directory: Path, error: OSError) -> str:
    if isinstance(error, FileExistsError):  # mkdir(exist_ok=True) raises it only for a non-directory
        return f"{directory} is a file, not a directory"
    if isinstance(error, NotADirectoryError):
        above = next((p for p in directory.parents if p.exists() and not p.is_dir()), None)
        return f"{directory} cannot be a directory: {above or 'a path above it'} is a file"
    return f"cannot create {directory} ({os.strerror(error.errno or 0)}){_read_only(error)}"


def _no_file(path: Path, error: OSError) -> str:
    if isinstance(error, IsADirectoryError):
        return f"{path} is a directory, so it cannot be the lock file"
    return f"cannot open {path} for writing ({os.strerror(error.errno or 0)}){_read_only(error)}"


def _read_only(error: OSError) -> str:
    """The usual causes of a refused write, as a hint (an immutable file or directory refuses root too: chattr(1))."""
    if error.errno in (errno.EACCES, errno.EPERM):
        return ": the directory or the file is read-only for this user, or immutable (lsattr shows an i)"
    if error.errno == errno.EROFS:
        return ": the file system is mounted read-only"
    return ""
