"""A trainer process started by another trainer process ends when its parent does.

The supervisor (`train` outside torchrun, `launch`, `bench`) starts torchrun, torchrun starts the ranks (each in a
session of its own: torch 2.13 torch/distributed/elastic/multiprocessing/subprocess_handler, start_new_session), and
each rank its checkpoint writer. Killed with SIGKILL, or by the out-of-memory killer, a parent cannot pass a signal
on, and its children would go on training, saving and holding their devices, re-parented to init. So each process
asks the kernel for SIGKILL when its parent goes (prctl(2), PR_SET_PDEATHSIG), as the first thing the trainer
package does in it (trainer/__init__.py): ranks, torchrun, the writers, bench workers, evaluations started by a rank.

Which processes: those whose environment carries STARTED_BY, the pid of the trainer process that started them
(`start_children`: `python -m trainer` and torchrun set it for their children). A process started from a shell, a
Makefile or a test has none, and outlives its caller as any program does (nohup make train keeps working).

prctl(2), PR_SET_PDEATHSIG: the signal comes when the *thread* that created the process exits, not the whole parent;
every process here is started from its parent's main thread (subprocess.Popen in the supervisor and in torch's
agent, multiprocessing's spawn in the rank), so thread and process end together. The setting survives execve(2)
and is cleared in a fork(2) child, so a bound process binds what it forks as well. A parent that died before the call
sends nothing; then the process ends itself.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

# The pid of the trainer process that started this one; set by `start_children`.
STARTED_BY = "TRAINSTACK_STARTED_BY"
# <linux/prctl.h>
_PR_SET_PDEATHSIG = 1


def end_with_parent() -> None:
    """If a trainer process started this one, be killed (SIGKILL) when it ends (Linux; elsewhere nothing)."""
    started_by = os.environ.get(STARTED_BY, "")
    if not started_by.isdigit() or int(started_by) == os.getpid() or not sys.platform.startswith("linux"):
        return  # not started by one of ours, or the same process after execve (local.exec_torchrun)
    _die_with_parent()
    # Its parent ended before the call above: nothing will signal this process. (Started through a shell, say, the
    # parent is another process; then the trainer process that started it is asked.)
    if os.getppid() != int(started_by) and not _alive(int(started_by)):
        os.kill(os.getpid(), signal.SIGKILL)
    # What it forks ends with it too: megatron's writer forks a process per file, which blocks forever on its queue
    # once the writer is gone (os.register_at_fork: os.fork and multiprocessing's fork, not a subprocess's exec).
    os.register_at_fork(before=_remember_forker, after_in_child=_end_with_forker)


_forker = 0  # in a forked child: the pid of the process that forked it


def _remember_forker() -> None:
    global _forker
    _forker = os.getpid()


def _end_with_forker() -> None:
    _die_with_parent()
    if os.getppid() != _forker:  # it ended between the fork and the call above
        os.kill(os.getpid(), signal.SIGKILL)


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def start_children() -> None:
    """The processes this one starts from now on end when it does (they read STARTED_BY in `end_with_parent`)."""
    os.environ[STARTED_BY] = str(os.getpid())


def _alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie does not (proc(5), /proc/<pid>/stat: the state after the command's ")"), and a
    killed process whose parent died too stays one where nothing reaps it (a container whose PID 1 does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")
