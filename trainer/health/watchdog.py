"""The hang watchdog: a thread per rank that ends a run in which no step completes.

Its limit is max(`health.hang_min_seconds`, `health.hang_step_multiple` x the median of recent step times), and
never beyond the process group's timeout (`parallel.distributed_timeout_minutes`), which would otherwise end the
run first with no dumps. Its clock restarts when a step or a collective completes (so a long evaluation or save,
made of collectives, is not a hang). When it runs out, every rank (all are stuck: the one that hangs and those
waiting for it) writes into `<run_dir>/hang/`:
- `rank<R>.txt`: where it is (the collective it is in, or the last it completed) and every thread's Python stack
  (faulthandler.dump_traceback(all_threads=True));
- `flight_recorder/rank_<R>`: PyTorch's flight recorder of its recent collectives (a pickle,
  `torch._C._distributed_c10d._dump_fr_trace`; `python -m torch.distributed.flight_recorder.fr_trace DIR -p rank_`
  analyses NCCL dumps; torch 2.13's analyser fails on gloo's (KeyError in build_collectives), so read those with
  pickle);
then publishes where it is through the rendezvous store (a TCP key-value store, alive while collectives hang).
Rank 0 names the collective and the ranks that never entered it in one line, `hang/summary.json` and
health.json, and every rank exits with the retry code (trainer/contract/retry.py).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from trainer.contract import retry
from trainer.health import report
from trainer.health.collectives import CollectiveTracker
from trainer.health.straggler import Node

EXCHANGE_TIMEOUT_S = 30.0  # how long ranks wait for each other's reports through the store
STEP_TIMES_KEPT = 20


class HangWatchdog(threading.Thread):
    def __init__(
        self,
        tracker: CollectiveTracker,
        node: Callable[[], Node],
        run_dir: Path,
        *,
        min_seconds: float,
        step_multiple: float,
        timeout_seconds: float,
        poll_seconds: float = 1.0,
    ):
        super().__init__(name="trainstack-hang-watchdog", daemon=True)
        self.tracker, self.node, self.run_dir = tracker, node, run_dir
        self.min_seconds, self.step_multiple, self.timeout_seconds = (
            min_seconds,
            step_multiple,
            timeout_seconds,
        )
        self.poll_seconds = min(poll_seconds, min_seconds / 4)
        self.rank = torch.distributed.get_rank()
        self.world_size = torch.distributed.get_world_size()
        self.step = 0
        self.step_times: deque[float] = deque(maxlen=STEP_TIMES_KEPT)
        self.last_step = time.monotonic()
        # Not `_stop`: threading.Thread has a method of that name, which a fork's child calls on every other
        # thread (CPython 3.11 threading.py _after_fork); shadowed, each forked checkpoint writer printed a TypeError.
        self._stopping = threading.Event()

    def step_done(self, step: int, step_time: float) -> None:
        self.step = step
        self.step_times.append(step_time)
        self.last_step = time.monotonic()

    def limit(self) -> float:
        median = statistics.median(self.step_times) if self.step_times else 0.0
        return min(max(self.min_seconds, self.step_multiple * median), self.timeout_seconds)

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        while not self._stopping.wait(self.poll_seconds):
            idle = time.monotonic() - max(self.last_step, self.tracker.last_progress)
            if idle > self.limit():
                self._on_hang(idle)
                return

    def _on_hang(self, idle: float) -> None:
        hang_dir = self.run_dir / "hang"
        (hang_dir / "flight_recorder").mkdir(parents=True, exist_ok=True)
        node = self.node()
        current, last = self.tracker.current, self.tracker.last_completed
        state = {
            "rank": self.rank,
            "host": node.host,
            "instance_id": node.instance_id,
            "step": self.step,
            "current": {**current.record(), "seconds": round(time.monotonic() - current.entered, 1)}
            if current
            else None,
            "last_completed": last.record() if last else None,
        }
        with (hang_dir / f"rank{self.rank}.txt").open("w") as out:
            out.write(
                f"rank {self.rank} on {node.host} ({node.instance_id}): no step completed for {idle:.0f} s "
                f"(limit {self.limit():.0f} s) after step {self.step}\n{where(state)}\n"
                f"{flight_recorder(hang_dir / 'flight_recorder' / f'rank_{self.rank}')}\n\n"
                "Python stacks, every thread (faulthandler):\n"
            )
            out.flush()
            faulthandler.dump_traceback(out, all_threads=True)
        states = exchange(state, self.rank, self.world_size)
        if self.rank == 0:
            summary = hang_summary(states, self.world_size, idle, self.step)
            summary["message"] += f"; stacks and flight recorder in {hang_dir}"
            (hang_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
            report.write_health(self.run_dir, "hang", summary)
            print(
                f"train: hang: {summary['message']}; exiting {retry.RETRY_EXIT_CODE} (retry)",
                file=sys.stderr,
                flush=True,
            )
            _store_set("summarized", "1")
        else:
            _store_wait("summarized")
        sys.stdout.flush()
        os._exit(retry.request_retry())


def flight_recorder(path: Path) -> str:
    """Write this rank's flight-recorder dump (torch >= 2.7 names it _dump_fr_trace, older _dump_nccl_trace)."""
    c10d = torch._C._distributed_c10d
    dump = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
    if dump is None:
        return "flight recorder: none in this torch build"
    try:
        path.write_bytes(dump(includeCollectives=True, includeStackTraces=True, onlyActive=False))
    except RuntimeError as error:
        return f"flight recorder: dump failed: {error}"
    return f"flight recorder: {path}"


def where(state: dict[str, Any]) -> str:
    """Where a rank is, in words."""
    if state.get("current"):
        call = state["current"]
        return f"in {_describe(call)} for {call['seconds']:.0f} s"
    last = state.get("last_completed")
    return "not in a collective" + (f"; last completed {_describe(last)}" if last else "")


def _describe(call: dict[str, Any]) -> str:
    return f"{call['name']} #{call['number']} on {_ranks(call['ranks'])} (called from {call['caller']})"


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def hang_summary(
    states: dict[int, dict[str, Any]], world_size: int, idle: float, step: int
) -> dict[str, Any]:
    """The collective most ranks are stuck in, who is in it, and who never entered it (and where they are)."""
    waiting = {rank: s["current"] for rank, s in states.items() if s.get("current")}
    base = {"step": step, "idle_s": round(idle, 1), "ranks": states}
    if not waiting:
        return {
            **base,
            "collective": None,
            "entered": [],
            "never_entered": sorted(states),
            "message": f"no step for {idle:.0f} s after step {step}, and no rank is in a collective: each is "
            "stuck in its own code (see its stack)",
        }

    def identity(call: dict[str, Any]) -> tuple:  # the same collective on every member
        return call["name"], tuple(call["ranks"]), call["number"]

    key = Counter(identity(c) for c in waiting.values()).most_common(1)[0][0]
    entered = sorted(r for r, c in waiting.items() if identity(c) == key)
    missing = [r for r in key[1] if r not in entered]
    collective = next(c for r, c in waiting.items() if r == entered[0])

    def absent(rank: int) -> str:
        if rank not in states:
            return f"rank {rank} sent no report (dead, or stuck holding the Python interpreter)"
        s = states[rank]
        return f"{report.describe_rank(s)} never entered it: {where(s)}"

    never = "; ".join(absent(r) for r in missing) or "every member entered it (the transport is stuck)"
    return {
        **base,
        "collective": collective,
        "entered": entered,
        "never_entered": missing,
        "message": f"no step for {idle:.0f} s after step {step}: {_ranks(entered)} wait{'s' if len(entered) == 1 else ''} in "
        f"{_describe(collective)}; {never}",
    }


# The rendezvous store: torch.distributed's default store (distributed_c10d._get_default_store, torch 2.13),
# served over TCP by torchrun's store and independent of the stuck collectives. Keys are per restart.
def _key(name: str) -> str:
    return f"trainstack/hang/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{name}"


def _store():
    store = torch.distributed.distributed_c10d._get_default_store()
    store.set_timeout(timedelta(seconds=EXCHANGE_TIMEOUT_S))
    return store


def _store_set(name: str, value: str) -> None:
    with contextlib.suppress(RuntimeError):  # the store went with the rank hosting it; the dumps stand
        _store().set(_key(name), value)


def _store_wait(name: str) -> bool:
    try:
        _store().wait([_key(name)], timedelta(seconds=EXCHANGE_TIMEOUT_S))
        return True
    except RuntimeError:  # DistStoreError (a RuntimeError) on timeout
        return False


def exchange(state: dict[str, Any], rank: int, world_size: int) -> dict[int, dict[str, Any]]:
    """Every rank's state, as far as the ranks could publish it within EXCHANGE_TIMEOUT_S."""
    _store_set(f"rank{rank}", json.dumps(state))
    states = {rank: state}
    deadline = time.monotonic() + EXCHANGE_TIMEOUT_S
    for other in range(world_size):
        if other == rank:
            continue
        try:
            store = _store()
            remaining = max(0.1, deadline - time.monotonic())
            store.wait([_key(f"rank{other}")], timedelta(seconds=remaining))
            states[other] = json.loads(store.get(_key(f"rank{other}")))
        except RuntimeError:
            continue
    return states
