"""The health checks in the training loop's terms: one object, three calls (create, `step_done`, `close`).

- Straggler windows (trainer/health/straggler.py): every `health.straggler_interval` steps, one all-gather of a
  float per rank; a rank reported slow prints one line on rank 0, goes into metrics.jsonl (`stragglers`, the
  value `step_done` returns) and into `<run_dir>/health.json`.
- The hang watchdog (trainer/health/watchdog.py), fed by `step_done` and the collective tracker.
"""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

import torch
from rich.console import Console
from rich.markup import escape

from trainer import faults
from trainer.config import TrainConfig
from trainer.device import device_type
from trainer.health import report
from trainer.health.collectives import CollectiveTracker
from trainer.health.straggler import Node, SlowRank, StragglerDetector
from trainer.health.watchdog import HangWatchdog


def prepare_flight_recorder(cfg: TrainConfig) -> None:
    """Before the process group starts, on GPUs: NCCL's own timeout (parallel.distributed_timeout_minutes), should
    it come first, dumps the flight recorder into <run_dir>/hang/ too. Settings already in the environment win.
    torch 2.13 records gloo's collectives as well (2000 entries by default), but only NCCL dumps on its
    timeout; the hang watchdog dumps on both. Names and the pairing rule: torch 2.13's
    torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp and FlightRecorder.hpp, and
    pytorch.org/docs/stable/torch_nccl_environment_variables.html."""
    if not torch.cuda.is_available():
        return
    hang_dir = cfg.run_dir / "hang"
    hang_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")  # entries in the ring buffer; > 0 records
    # Dump on timeout "must be set together with TORCH_NCCL_ENABLE_MONITORING=1 and TORCH_NCCL_TRACE_BUFFER_SIZE > 0".
    os.environ.setdefault("TORCH_NCCL_ENABLE_MONITORING", "1")
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(hang_dir / "nccl_trace_rank_"))  # + rank


class HealthMonitor:
    def __init__(self, cfg: TrainConfig, console: Console):
        h = cfg.health
        self.cfg, self.console = cfg, console
        self.rank = torch.distributed.get_rank()
        self.world_size = torch.distributed.get_world_size()
        self.tracker = CollectiveTracker()
        self.tracker.install()
        self.detector = StragglerDetector(h.straggler_factor, h.straggler_windows)
        self._lookup = ThreadPoolExecutor(1, thread_name_prefix="trainstack-node")
        self._node = self._lookup.submit(Node.this_one)  # IMDS answers in ms on EC2; elsewhere it times out
        self._nodes: list[dict[str, str]] | None = None
        self._window_compute, self._window_steps = 0.0, 0
        self._reported: set[int] = set()
        self.watchdog = None
        if h.watchdog:
            self.watchdog = HangWatchdog(
                self.tracker,
                self._node.result,
                cfg.run_dir,
                min_seconds=h.hang_min_seconds,
                step_multiple=h.hang_step_multiple,
                timeout_seconds=cfg.parallel.distributed_timeout_minutes * 60,
            )
            self.watchdog.start()

    def step_done(self, step: int, step_time: float) -> list[dict[str, Any]]:
        """Count a completed step; at the end of a window, the stragglers (the same list on every rank)."""
        started = time.perf_counter() - step_time
        compute = faults.step_compute(step, max(0.0, step_time - self.tracker.blocked_since(started)))
        if self.watchdog is not None:
            self.watchdog.step_done(step, step_time)
        self._window_compute += compute
        self._window_steps += 1
        if step % self.cfg.health.straggler_interval:
            return []
        mean = self._window_compute / self._window_steps
        self._window_compute, self._window_steps = 0.0, 0
        times = self._gather(mean)
        return self._report(step, times, self.detector.observe(times))

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        self.tracker.uninstall()
        self._lookup.shutdown(wait=False)
        health = report.read_health(self.cfg.run_dir)
        if self.rank == 0 and health:
            line = f"health: {report.summary(health)} ({self.cfg.run_dir / report.HEALTH_FILE})"
            self.console.print(escape(line))

    def _gather(self, mean: float) -> list[float]:
        """The one all-gather of a window: every rank's mean step compute time."""
        local = torch.tensor([mean], dtype=torch.float64, device=device_type())
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        torch.distributed.all_gather(gathered, local)
        return [t.item() for t in gathered]

    def _report(self, step: int, times: list[float], slow: list[SlowRank]) -> list[dict[str, Any]]:
        entries = [self._entry(s) for s in slow]
        now = {e["rank"] for e in entries}
        h = self.cfg.health
        if self.rank == 0:
            for e in entries:
                if e["rank"] not in self._reported:
                    self.console.print(
                        escape(
                            f"step {step}: straggler: {report.describe_rank(e)}: step compute "
                            f"{e['compute_s']:.3g} s, {e['ratio']:.1f}x the median {e['median_s']:.3g} s, for "
                            f"{e['windows']} windows of {h.straggler_interval} steps (health.straggler_factor = "
                            f"{h.straggler_factor:g})"
                        )
                    )
            for rank in sorted(self._reported - now):
                self.console.print(f"step {step}: rank {rank} is no longer a straggler")
            window = {"step": step, "interval": h.straggler_interval, "median_s": statistics.median(times)}
            report.write_health(self.cfg.run_dir, "stragglers", {**window, "ranks": entries})
        self._reported = now
        return entries

    def _entry(self, slow: SlowRank) -> dict[str, Any]:
        node = self._all_nodes()[slow.rank]
        return {
            "rank": slow.rank,
            **node,
            "compute_s": round(slow.compute_s, 4),
            "median_s": round(slow.median_s, 4),
            "ratio": round(slow.ratio, 2),
            "windows": slow.windows,
        }

    def _all_nodes(self) -> list[dict[str, str]]:
        """Every rank's host and instance id, gathered once, when the first straggler is found (every rank
        finds it at the same step, so all take part)."""
        if self._nodes is None:
            nodes: list[Any] = [None] * self.world_size
            torch.distributed.all_gather_object(nodes, asdict(self._node.result()))
            self._nodes = nodes
        return self._nodes
