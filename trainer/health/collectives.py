"""Which collective this rank is in, and how long it waited in them: a thin wrapper over torch.distributed.

Each wrapped call records its name, its group's global ranks, its number among this rank's calls on groups of
those ranks (members call their groups' collectives in the same order, so (ranks, number) is the same collective
on every member, also where two groups have the same members), and the trainer or megatron function that called it. The hang watchdog reads that when no step
completes; the straggler windows subtract the time spent blocked in synchronous calls from the step time, so a
rank that waits for a slow one is not itself counted slow.

Limits: async calls (`async_op=True`, `batch_isend_irecv`) are recorded when issued, and the wait on their
handle is not timed; NCCL calls return before the GPU runs them, so on GPUs the waited time seen here is small
and the step time is mostly compute plus the waits at host synchronisations (`.item()`).
`isend` / `irecv` stay unwrapped: torch's `P2POp` checks that its op is one of those two functions.
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass

import torch

# torch.distributed's collective entry points that megatron-core and the trainer call (torch 2.13).
WRAPPED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
)


@dataclass(frozen=True)
class CollectiveCall:
    """One call of a collective on this rank."""

    name: str  # e.g. torch.distributed.all_reduce
    ranks: tuple[int, ...]  # the group's global ranks (for batch_isend_irecv: this rank and its peers)
    number: int  # its number among this rank's calls on groups of these ranks, from 1
    caller: str  # module.function that called it
    entered: float  # time.monotonic()

    def record(self) -> dict:
        return {**asdict(self), "ranks": list(self.ranks)}


class CollectiveTracker:
    """Installs the wrappers on torch.distributed; `current` is the call this rank is blocked in (or None)."""

    def __init__(self, history: int = 4096):
        self.current: CollectiveCall | None = None
        self.last_completed: CollectiveCall | None = None
        self.last_progress = time.monotonic()  # when a call last returned
        # (perf_counter at entry, seconds blocked) of recent synchronous calls
        self.blocked: deque[tuple[float, float]] = deque(maxlen=history)
        self._counts: dict[tuple[int, ...], int] = {}
        self._group_ranks: dict[int, tuple[int, ...]] = {}
        self._originals: dict[str, object] = {}

    def install(self) -> None:
        for name in WRAPPED:
            original = getattr(torch.distributed, name)
            self._originals[name] = original
            setattr(torch.distributed, name, self._wrap(name, original))

    def uninstall(self) -> None:
        for name, original in self._originals.items():
            setattr(torch.distributed, name, original)
        self._originals.clear()

    def blocked_since(self, start: float) -> float:
        """Seconds spent blocked in synchronous collectives entered at or after `start` (perf_counter)."""
        total = 0.0
        for entered, seconds in reversed(self.blocked):
            if entered < start:
                break
            total += seconds
        return total

    def _wrap(self, name: str, original):
        parameters = list(inspect.signature(original).parameters)
        group_at = parameters.index("group") if "group" in parameters else None  # its positional index
        qualified = f"torch.distributed.{name}"

        @functools.wraps(original)
        def tracked(*args, **kwargs):
            ranks = self._ranks(name, group_at, args, kwargs)
            self._counts[ranks] = number = self._counts.get(ranks, 0) + 1
            call = CollectiveCall(qualified, ranks, number, _caller(), time.monotonic())
            self.current = call
            started = time.perf_counter()
            result = original(*args, **kwargs)
            if name != "batch_isend_irecv" and not kwargs.get("async_op"):
                self.blocked.append((started, time.perf_counter() - started))
            self.current = None
            self.last_completed = call
            self.last_progress = time.monotonic()
            return result

        return tracked

    def _ranks(self, name: str, group_at: int | None, args, kwargs) -> tuple[int, ...]:
        if name == "batch_isend_irecv":
            ops = args[0] if args else kwargs["p2p_op_list"]
            return tuple(sorted({torch.distributed.get_rank(), *(op.peer for op in ops)}))
        group = kwargs.get("group", args[group_at] if group_at is not None and len(args) > group_at else None)
        key = id(group)
        if key not in self._group_ranks:
            world = group is None or group is torch.distributed.GroupMember.WORLD
            self._group_ranks[key] = tuple(
                range(torch.distributed.get_world_size())
                if world
                else torch.distributed.get_process_group_ranks(group)
            )
        return self._group_ranks[key]


def _caller() -> str:
    frame = sys._getframe(2)  # tracked() -> the function that called the collective
    return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name}"
