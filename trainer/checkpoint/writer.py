"""Writing a checkpoint, in the foreground or in the background, up to the moment it may be published.

`Write` is one checkpoint being written into its staging directory (trainer/checkpoint/store.py): `done()` asks,
without waiting, whether every rank's write has finished; `finish()` waits for it, agrees over the ranks and
publishes. A format's save returns one, written already (synchronous) or still being written by the `Writer`.

`Writer` is one process's background writer: megatron-core's AsyncCallsQueue (megatron-core 0.16.1
dist_checkpointing/strategies/async_utils.py), whose writes run in a forked process at a lower CPU priority than
training, and megatron's write-results queue, started while training runs instead of at the first save.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron.core.dist_checkpointing.strategies import filesystem_async
from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue, AsyncRequest
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.storage import WriteResult

from trainer.checkpoint.store import agree_or_raise, publish

# The background writer's niceness (nice(2)): a CPU share well below a training rank's, not starved.
WRITER_NICENESS = 10


@dataclass
class Write:
    """A checkpoint being written into its staging directory; published by `finish` once every rank is done."""

    staging: Path
    step: int
    optimizer_format: str | None = (
        None  # the distributed optimizer's (megatron); None where nothing to choose
    )
    queue: AsyncCallsQueue | None = None  # the background write; None: written already
    failure: BaseException | None = None
    # What the manifest records besides its files (validation loss at this step, for keep-best retention; the
    # run's cost ledger, so that a resume counts what was spent).
    metrics: dict[str, Any] = field(default_factory=dict)

    def done(self) -> bool:
        """Whether every rank's write has finished (a collective while one is in flight: call it on every rank
        at the same point)."""
        if self.queue is None:
            return True
        try:
            if not self.queue.maybe_finalize_async_calls(blocking=False):
                return False
        except (CheckpointException, OSError, EOFError) as error:  # megatron gathers every rank's failures
            self.failure = error
        self.queue = None
        return True

    def finish(self) -> Path:
        """Wait for every rank's write, then seal and publish (store.publish); raises CheckpointSaveError on every
        rank when any rank's write failed, leaving the previous checkpoint as the newest."""
        if self.queue is not None:
            try:
                self.queue.maybe_finalize_async_calls(blocking=True)
            except (CheckpointException, OSError, EOFError) as error:  # EOFError: the writer's helpers died
                self.failure = error
            self.queue = None
        agree_or_raise(self.failure, f"saving step {self.step} to {self.staging}", self.staging)
        return publish(self.staging, self.step, self.metrics)


class Writer:
    """One process's background checkpoint writer (megatron-core's AsyncCallsQueue, one write in flight)."""

    def __init__(self) -> None:
        self.queue = AsyncCallsQueue()
        self._results_queue = _start_results_queue()

    def ready(self) -> None:
        """Wait until megatron's write-results queue has started; every save (background or not) uses it."""
        self._results_queue.join()

    def schedule(self, write: Write, request: AsyncRequest) -> None:
        """Start `request` (dist_checkpointing.save's async request) in a forked, niced writer process."""
        write.queue = self.queue
        # A fork that fails (the OS out of processes or memory) raises on that rank alone: its process ends
        # and torchrun stops the others and restarts the group, which resumes from the newest checkpoint.
        self.queue.schedule_async_request(request._replace(async_fn=_yielding(request.async_fn)))


def _yielding(write):
    """The background writer, run at a lower CPU priority than training (it and the processes it starts): where
    cores are few, the ranks' next steps come first and the writer takes what they leave."""

    def run(*args, **kwargs):
        os.nice(WRITER_NICENESS)
        try:
            return write(*args, **kwargs)
        except (EOFError, ConnectionError) as error:  # BrokenPipe, ConnectionRefused, ConnectionReset
            # megatron's write-results Manager died under the writer (a signal to the process group): the rank
            # reads the same and says so; one line here instead of a traceback from a process nobody asked about.
            print(
                f"checkpoint writer: stopped, its result queue is gone ({type(error).__name__})",
                file=sys.stderr,
            )
            os._exit(1)

    return run


def _start_results_queue() -> threading.Thread:
    """Start megatron's write-results queue now, in a thread, while training runs, and have its process import what
    a save's results are made of. The queue is a Manager process started by spawn (a fresh Python's start-up,
    seconds; tens of seconds on a loaded machine) that the first save would otherwise wait for (megatron-core
    0.16.1 strategies/filesystem_async.py _get_write_results_queue, created once per process). Each save's writer
    puts its WriteResults there, which that fresh process unpickles, importing torch.distributed.checkpoint and so
    torch: 6.6 s of a first synchronous save's 7.1 s (2.8 M parameters, 4 ranks on 2 cores, profiled), also
    here while training runs."""
    thread = threading.Thread(target=_warm_results_queue, daemon=True)
    thread.start()
    # A process that exits while the thread is still starting the Manager would wait forever at exit for a
    # Manager process nobody shuts down (multiprocessing joins its children at exit): let the start finish
    # first, so that the Manager's own finalizer shuts it down (atexit runs this before multiprocessing's hook,
    # which was registered earlier).
    atexit.register(thread.join)
    return thread


def _warm_results_queue() -> None:
    results = filesystem_async._get_write_results_queue()
    # What write_preloaded_data puts: WriteResults holding the file system writer's _StorageInfo (torch 2.13
    # distributed/checkpoint/filesystem.py _write_item).
    results.put([WriteResult(MetadataIndex("warm-up"), 0, _StorageInfo("warm-up", 0, 0))])
    results.get()
