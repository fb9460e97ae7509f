"""Allocated tensor memory over time, as `torch.cuda.max_memory_allocated` counts it, on CPUs too.

The PyTorch profiler with `profile_memory=True` sees every allocation and free of c10's allocators (every tensor
storage comes from one) together with the running total of bytes allocated since profiling began and not yet
freed. Started before the model is built, that total is the live tensor storage of the run: what CUDA's
allocator statistics report on a GPU, without what a process's resident set size adds (the interpreter,
libraries, numpy arrays, allocator slack and freed pages not yet returned). Frees of storage allocated before
the trace started are not seen, so start it before anything that should count.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile, record_function


@dataclass(frozen=True)
class Phase:
    name: str
    start_ns: int
    end_ns: int


class AllocationTrace:
    """Trace allocations on `device` ("cpu" or "cuda") inside `with AllocationTrace(device) as trace:`, marking
    phases with `with trace.phase(name):`; read levels and peaks after the block."""

    def __init__(self, device: str):
        self.device = device
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        self._profile = profile(activities=activities, profile_memory=True)
        self._totals: list[tuple[int, int]] = []  # (time ns, bytes allocated after the event)
        self._phases: list[Phase] = []
        self._phase_names: set[str] = set()

    def __enter__(self) -> AllocationTrace:
        self._profile.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._profile.__exit__(*exc)
        profiler = self._profile.profiler
        assert profiler is not None and profiler.kineto_results is not None  # both set by the __exit__ above
        stack = list(profiler.kineto_results.experimental_event_tree())
        while stack:
            node = stack.pop()
            if node.typed[0] == _EventType.Allocation and node.typed[1].device.type == self.device:
                self._totals.append((node.start_time_ns, node.typed[1].total_allocated))
            elif node.name in self._phase_names:
                self._phases.append(Phase(node.name, node.start_time_ns, node.end_time_ns))
            stack.extend(node.children)
        self._totals.sort()
        self._phases.sort(key=lambda phase: phase.start_ns)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._phase_names.add(name)
        with record_function(name):
            yield

    def phases(self, name: str) -> list[Phase]:
        return [phase for phase in self._phases if phase.name == name]

    def allocated_at(self, time_ns: int) -> int:
        """Bytes allocated just before `time_ns`."""
        before = [total for when, total in self._totals if when < time_ns]
        return before[-1] if before else 0

    def peak_during(self, phase: Phase) -> int:
        inside = [total for when, total in self._totals if phase.start_ns <= when <= phase.end_ns]
        return max([self.allocated_at(phase.start_ns), *inside])

    @property
    def peak(self) -> int:
        return max((total for _, total in self._totals), default=0)
