"""Writing a checkpoint, in the foreground or in the background, up to the moment it may be published.

`Write` is one checkpoint being written into its staging directory (trainer/checkpoint/store.py): `done()` asks,
without waiting, whether every rank's write has finished; `finish()` waits for it, agrees over the ranks and
publishes. A format's save returns one, written already (synchronous) or still being written by the `Writer`.

`Writer` is one rank's background writer: a process started once with the run (spawned, niced, torch imported
while the run starts), fed through megatron-core's AsyncCallsQueue (megatron-core 0.16.1
dist_checkpointing/strategies/async_utils.py) by a caller of our own, `StagedCaller`. A save copies the rank's
tensors into a staging buffer that the writer process maps too (a memfd, allocated at the first save and reused),
sends it the write plan, and training goes on: what a save blocks is that copy, not a fork of the rank (a fork
copies the page tables of the rank's whole memory: 0.03-0.31 s a rank on 2 cores, docs/bench.md) nor a process
start. The writer runs megatron's own write (`write_preloaded_data_multiproc`), hashing every byte
(trainer/checkpoint/digest.py), and sends its write results back; the rank hands them to megatron's finalization
through a queue inside the rank (`install_results_queue`) instead of megatron's Manager process.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import mmap
import multiprocessing
import os
import queue
import signal
import tempfile
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler, recv_handle, send_handle
from pathlib import Path
from typing import Any

import torch
from megatron.core.dist_checkpointing.strategies import filesystem_async
from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCaller, AsyncCallsQueue, AsyncRequest
from torch.distributed.checkpoint.api import CheckpointException

from trainer.checkpoint.store import WRITER_ENDED, agree_or_raise, publish

# The background writer's niceness (nice(2)): a CPU share well below a training rank's, not starved.
WRITER_NICENESS = 10
# Each staged tensor starts on this boundary, so that its bytes view as any dtype.
_ALIGN = 64


@dataclass
class Write:
    """A checkpoint being written into its staging directory; published by `finish` once every rank is done."""

    staging: Path
    step: int
    # The distributed optimizer's format (megatron); None where there is nothing to choose.
    optimizer_format: str | None = None
    # The background write; None: written already.
    queue: AsyncCallsQueue | None = None
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
            except (CheckpointException, OSError, EOFError) as error:
                self.failure = error
            self.queue = None
        agree_or_raise(self.failure, f"saving step {self.step} to {self.staging}", self.staging)
        return publish(self.staging, self.step, self.metrics)


def install_results_queue() -> None:
    """Give megatron's writes a write-results queue inside this process. A synchronous save's write runs here and a
    background one's results come back through StagedCaller, so nothing needs megatron's own queue, a Manager
    process started by spawn at the first save (megatron-core 0.16.1 strategies/filesystem_async.py
    _get_write_results_queue, cached in the module's `_results_queue`)."""
    if filesystem_async._results_queue is None:
        filesystem_async._results_queue = queue.Queue()


class Writer:
    """One rank's background checkpoint writer (one write in flight), its process started now."""

    def __init__(self) -> None:
        install_results_queue()
        self.caller = StagedCaller()
        self.queue = AsyncCallsQueue(persistent=True)
        self.queue.persistent_caller = self.caller  # megatron's queue asks it for the caller of every request

    def ready(self) -> None:
        """Wait until the writer process has started (a fresh Python importing torch: seconds, while training)."""
        self.caller.ready()

    def schedule(self, write: Write, request: AsyncRequest) -> None:
        """Start `request` (dist_checkpointing.save's async request): stage its tensors, hand them to the writer."""
        write.queue = self.queue
        self.queue.schedule_async_request(request._replace(async_fn_kwargs={"step": write.step}))


@dataclass(frozen=True)
class _Slot:
    """Where one tensor of a write plan lies in the staging buffer."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def view(self, staged: torch.Tensor) -> torch.Tensor:
        """This slot of the staging buffer (a view into it)."""
        return staged[self.offset : self.offset + self.nbytes].view(self.dtype).view(self.shape)

    def tensor(self, buffer: mmap.mmap) -> torch.Tensor:
        """This slot as a tensor of its own storage (torch.save writes a tensor's whole storage, not a view's
        part)."""
        count = self.nbytes // self.dtype.itemsize
        return torch.frombuffer(buffer, dtype=self.dtype, count=count, offset=self.offset).view(self.shape)


class StagedCaller(AsyncCaller):
    """megatron's AsyncCaller over one persistent writer process: `schedule_async_call` copies the request's
    tensors into the staging buffer and sends the plan; `is_current_async_call_done` asks the ranks together
    (one integer all-reduce, as megatron's callers do) and, once every rank is done, puts this rank's write
    results where megatron's finalization reads them."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        # Not a daemon: megatron's write forks one process per file it writes, which a daemon may not.
        self._process = context.Process(
            target=serve, args=(child, os.getpid()), name="checkpoint-writer", daemon=False
        )
        self._process.start()
        # Niced from its first instruction, not once its imports are done: on a host with few cores the spawned
        # interpreter's imports (torch, megatron-core) would otherwise take CPU from the ranks' first steps.
        assert self._process.pid is not None  # started
        os.setpriority(
            os.PRIO_PROCESS, self._process.pid, os.getpriority(os.PRIO_PROCESS, 0) + WRITER_NICENESS
        )
        child.close()
        self._started = False
        self._fd: int | None = None
        self._buffer: mmap.mmap | None = None
        self._staged: torch.Tensor | None = None
        self._busy = False
        self._outcome: Any = None  # the write's results (or exception) once the writer sent them
        self._sending: threading.Thread | None = None
        self._released = True  # whether the write in flight may start
        # Closed before multiprocessing's own exit hook, which joins every child it started and would wait forever.
        atexit.register(self.close)

    def ready(self) -> None:
        if not self._started:
            self._receive("ready")
            self._started = True

    def schedule_async_call(self, async_req: AsyncRequest) -> None:
        if self._busy:
            raise RuntimeError("a checkpoint write is already in flight; publish it before the next save")
        if async_req.async_fn is None:  # nothing on this rank to write
            self._outcome, self._busy = _NOTHING, True
            return
        self.ready()
        rank, buckets, _results_queue = async_req.async_fn_args
        plan, slots = _plan(buckets)
        self._stage(slots[-1].offset + slots[-1].nbytes if slots else 0)
        assert self._staged is not None
        for (_item, tensor), slot in zip(_tensors(buckets), slots, strict=True):
            slot.view(self._staged).copy_(tensor.detach())
        self._send(("write", async_req.async_fn, rank, plan, async_req.async_fn_kwargs["step"]))
        self._outcome, self._busy, self._released = None, True, False

    def _release(self) -> None:
        """Let the writer start: at the first check after the save, a step later, once every rank's save is
        through. A writer that starts while the other ranks still copy and plan holds them back: 0.3 s steady
        against 0.09 s released a step later (docs/bench.md)."""
        if not self._released:
            self._send(("go",))
            self._released = True

    def is_current_async_call_done(self, blocking: bool = False, no_dist: bool = False) -> bool:
        if self._busy and self._outcome is None:
            self._release()
        if self._busy and self._outcome is None and (blocking or self._conn.poll()):
            self._outcome = self._receive("written")
        is_alive = int(self._busy and self._outcome is None)
        done = (not is_alive) if no_dist else bool(self.sync_all_async_calls(is_alive))
        if done:
            if self._outcome is not _NOTHING and self._outcome is not None:
                filesystem_async._get_write_results_queue().put(self._outcome)
            self._outcome, self._busy = None, False
        return done

    def close(self, abort: bool = False) -> None:
        if self._process.pid is None or self._process.exitcode is not None:
            return
        if abort:
            self._process.kill()
        else:
            with contextlib.suppress(OSError):  # the writer is gone already
                self._send(("close",))
                self._sent()
        self._process.join(timeout=60)
        if self._process.exitcode is None:
            self._process.kill()
            self._process.join()

    def __del__(self) -> None:
        pass  # closed at exit (atexit), never by the garbage collector in the middle of a step

    def _send(self, message: tuple) -> None:
        """Pickle `message` here and write it from a thread: a write plan is larger than the socket's buffer, and
        the niced writer reads it when the CPUs let it, which training should not wait for."""
        self._sent()
        payload = ForkingPickler.dumps(message)
        self._sending = threading.Thread(target=self._write, args=(payload,), daemon=True)
        self._sending.start()

    def _write(self, payload: bytes) -> None:
        # A writer that is gone is read as such at the next check (`_receive`): the save fails on every rank.
        with contextlib.suppress(OSError):
            self._conn.send_bytes(payload)

    def _sent(self) -> None:
        """Wait until the message before is written (messages go in order)."""
        if self._sending is not None:
            self._sending.join()
            self._sending = None

    def _receive(self, expected: str) -> Any:
        try:
            kind, value = self._conn.recv()
        except (EOFError, OSError):
            self._process.join(timeout=10)
            return RuntimeError(f"{WRITER_ENDED} (exit code {self._process.exitcode})")
        assert kind == expected, (kind, expected)
        return value

    def _stage(self, nbytes: int) -> None:
        """A staging buffer of at least `nbytes`, shared with the writer: the run's first save allocates it, a
        later save reuses it, or replaces it where its plan grew."""
        if self._buffer is not None and len(self._buffer) >= nbytes:
            return
        if self._buffer is not None:
            self._staged = None
            self._buffer.close()
            os.close(self._fd)  # type: ignore[arg-type]
        fd = _shared_file()
        size = max(nbytes, mmap.PAGESIZE)
        os.ftruncate(fd, size)
        self._fd, self._buffer = fd, mmap.mmap(fd, size)
        self._staged = torch.frombuffer(self._buffer, dtype=torch.uint8)
        self._send(("staging", size))
        self._sent()
        send_handle(self._conn, fd, self._process.pid)


def _shared_file() -> int:
    """A file descriptor for the staging buffer: memfd_create(2), anonymous shared memory counted against the
    job's memory as /dev/shm is but not bounded by /dev/shm's size (Linux); elsewhere an unlinked temporary file."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("trainstack-checkpoint-staging")
    with tempfile.TemporaryFile() as file:
        return os.dup(file.fileno())


_NOTHING = object()  # a write with nothing on this rank: done at once, no results


def _tensors(buckets: list) -> list[tuple[Any, torch.Tensor]]:
    """The (item, tensor) pairs of megatron's write buckets, in order: (file, key, (bytes items, tensor items))."""
    return [pair for _file, _key, (_bytes, tensor_data) in buckets for pair in tensor_data]


def _plan(buckets: list) -> tuple[list, list[_Slot]]:
    """The write buckets with each tensor replaced by its slot in the staging buffer (what the writer is sent)."""
    slots: list[_Slot] = []
    offset = 0
    plan = []
    for file_name, storage_key, (bytes_data, tensor_data) in buckets:
        placed = []
        for item, tensor in tensor_data:
            slot = _Slot(offset, tensor.dtype, tuple(tensor.shape))
            slots.append(slot)
            placed.append((item, slot))
            offset += -(-slot.nbytes // _ALIGN) * _ALIGN
        plan.append((file_name, storage_key, (bytes_data, placed)))
    return plan, slots


class _Results:
    """What megatron's write puts for the rank (its `global_results_queue`): kept to send back."""

    def __init__(self) -> None:
        self.value: Any = RuntimeError("the checkpoint write put no results")

    def put(self, value: Any) -> None:
        self.value = value


def serve(conn: Connection, rank_pid: int) -> None:
    """The writer process: maps the staging buffer, writes each plan it is sent as megatron would in a forked
    writer, and sends back the results (or the exception); ends when the rank closes it or goes away."""
    from trainer import faults
    from trainer.checkpoint import digest

    # A stop signal to the process group (Ctrl-C, SIGTERM) is the rank's to handle: a write in flight finishes, and
    # the rank publishes it before its stop save; the writer ends when its rank closes it or is gone.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    digest.install()  # every tensor file hashed as it is written
    conn.send(("ready", None))
    buffer: mmap.mmap | None = None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the rank is gone
            return
        if message[0] == "close":
            return
        if message[0] == "staging":
            fd = recv_handle(conn)
            if buffer is not None:
                buffer.close()
            buffer = mmap.mmap(fd, message[1])
            os.close(fd)
            continue
        _kind, write, rank, plan, step = message
        assert buffer is not None
        try:  # the rank's go, at its first check after the save (StagedCaller._release)
            if conn.recv()[0] != "go":
                return
        except (EOFError, OSError):
            return
        buckets = [
            (file_name, key, (bytes_data, [(item, slot.tensor(buffer)) for item, slot in placed]))
            for file_name, key, (bytes_data, placed) in plan
        ]
        results = _Results()
        try:
            # TRAINSTACK_FAULT's save faults strike in this process's writes as in a synchronous save's.
            with faults.inject_in_save(step, rank_pid=rank_pid):
                write(rank, buckets, results)
        except Exception as error:  # the rank raises it on every rank, as megatron's writes do
            results.value = error
        del buckets
        try:
            conn.send(("written", results.value))
        except (EOFError, OSError):
            return
        except Exception as error:  # an exception that does not pickle
            conn.send(("written", RuntimeError(f"checkpoint write failed: {error!r}")))
