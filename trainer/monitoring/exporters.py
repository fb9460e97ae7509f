"""One process's monitoring: the exporters it runs, the labels its values carry, and the calls the loop makes.

The loop records values it already has (no extra collective, no device synchronisation): `record` for what rank 0
logs, `begin_step` / `end_step` around each optimizer step, `timed` around a phase. With no monitor started (tests
that call the loop directly, tools) every call is a no-op.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping

from trainer.contract import metrics as registry
from trainer.monitoring.cloudwatch import EmfWriter, job_queue, on_a_stack
from trainer.monitoring.config import MonitoringConfig
from trainer.monitoring.node import NodeReaders

# Phases timed inside a step: summed over the step's micro-batches, reported when the step ends.
STEP_PHASES = (registry.FORWARD_BACKWARD_TIME, registry.DATA_WAIT_TIME, registry.PIPELINE_IDLE_TIME)


class Monitor:
    def __init__(
        self,
        labels: dict[str, str],
        *,
        prometheus=None,  # PrometheusExporter | None
        cloudwatch: EmfWriter | None = None,
        node: NodeReaders | None = None,
        config: MonitoringConfig | None = None,
    ) -> None:
        self.labels = labels
        self.config = config or MonitoringConfig()
        self.prometheus, self.cloudwatch, self.node = prometheus, cloudwatch, node
        self.phases: dict[registry.Metric, float] = {}
        self.previous_counters: dict[tuple, float] = {}
        self.started = time.time()
        self.last_step: float | None = None  # this process's last step (Unix time); None before the first
        self.lock = threading.Lock()  # the heartbeat thread writes CloudWatch lines too
        self.heartbeat_stop = threading.Event()

    def record(self, values: Mapping[registry.Metric, float | None]) -> None:
        """Gauges take the value; counters grow by it. None is absent. A non-finite gauge (a NaN loss) reaches
        Prometheus, whose text format carries it; CloudWatch's JSON cannot, and counters never take one."""
        with self.lock:
            for metric, value in values.items():
                if value is None:
                    continue
                finite = math.isfinite(value)
                if self.prometheus is not None and (finite or metric.kind == "gauge"):
                    self.prometheus.record(metric, value)
                if self.cloudwatch is not None and finite:
                    self.cloudwatch.add(metric, value)
            if self.cloudwatch is not None and self.cloudwatch.due():
                self._flush_cloudwatch()

    def record_task(self, metric: registry.Metric, task: str, value: float) -> None:
        """One evaluation-suite task's value (a TASK_LABELS metric): its own series and CloudWatch line."""
        with self.lock:
            if self.prometheus is not None:
                self.prometheus.record(metric, value, task=task)
            if self.cloudwatch is not None and math.isfinite(value):
                self.cloudwatch.write_task(metric, task, value)

    def heartbeat(self) -> None:
        """CloudWatch: how long since this attempt's last step (or its start), written even while the loop hangs;
        the stack's stall alarm takes the Maximum over every job on the queue."""
        since = self.last_step if self.last_step is not None else self.started
        self.record({registry.SECONDS_SINCE_LAST_STEP: time.time() - since})

    def start_heartbeat(self, interval_s: float) -> None:
        def beat() -> None:
            while not self.heartbeat_stop.wait(interval_s):
                self.heartbeat()

        threading.Thread(target=beat, daemon=True, name="cloudwatch-heartbeat").start()

    def begin_step(self) -> None:
        self.phases = dict.fromkeys(STEP_PHASES, 0.0)

    def end_step(self, step_time_s: float) -> None:
        forward_backward = self.phases.get(registry.FORWARD_BACKWARD_TIME)
        phases = {metric: seconds for metric, seconds in self.phases.items() if seconds}
        optimizer = step_time_s - forward_backward if forward_backward else None
        self.last_step = time.time()
        # The run's progress comes from rank 0 alone, so that a CloudWatch Sum counts steps, not steps x ranks.
        progress = (
            {registry.LAST_STEP_TIME: self.last_step, registry.STEPS: 1} if self.labels["rank"] == "0" else {}
        )
        self.record(
            {registry.STEP_TIME: step_time_s, registry.OPTIMIZER_TIME: optimizer, **progress, **phases}
        )

    def add_phase(self, metric: registry.Metric, seconds: float) -> None:
        if metric in STEP_PHASES:
            self.phases[metric] = self.phases.get(metric, 0.0) + seconds
        else:
            self.record({metric: seconds})

    def close(self, *, completed: bool, final_scrape_timeout_s: float = 0) -> None:
        """Flush what is gathered and stop serving; at a clean end, mark it and serve until it was scraped."""
        self.heartbeat_stop.set()
        if completed:
            self.record({registry.PROCESS_COMPLETED: time.time()})
        marked = time.monotonic()  # after the value is set: a scrape that begins later carries it
        if self.cloudwatch is not None:
            with self.lock:
                self._flush_cloudwatch()
        if self.prometheus is not None:
            if completed:
                self.prometheus.wait_for_scrape(marked, final_scrape_timeout_s)
            self.prometheus.close()

    def _flush_cloudwatch(self) -> None:
        assert self.cloudwatch is not None  # its callers check first
        if self.node is not None:
            self.cloudwatch.add_samples(self.node.samples(), self.previous_counters)
        self.cloudwatch.flush()


_active: Monitor | None = None


def start(config: MonitoringConfig, run: str, *, device_type: str, stage: int | None = None) -> Monitor:
    """This process's monitor, from the config and the launch environment (torchrun's RANK / LOCAL_RANK, Batch's
    AWS_BATCH_* variables); it serves or writes only what the config (or its `auto`) turns on."""
    global _active
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    labels = {
        "run": run,
        "job_id": os.environ.get("AWS_BATCH_JOB_ID") or os.environ.get("JOBSET_NAME", "local"),
        "node": socket.gethostname(),
        "rank": str(rank),
        "stage": str(_pipeline_stage() if stage is None else stage),
    }
    serve = _on(config.prometheus, auto=device_type == "cuda")
    push = _on(config.cloudwatch, auto=on_a_stack())
    node = NodeReaders() if local_rank == 0 and (serve or push) else None  # one reader per node
    prometheus = cloudwatch = None
    if serve:
        from trainer.monitoring.prometheus import PrometheusExporter

        prometheus = PrometheusExporter(labels, node)
        port = config.prometheus_port + local_rank
        try:
            prometheus.serve(port, config.prometheus_address)
        except OSError as error:
            raise OSError(
                f"monitoring.prometheus_port: rank {rank} cannot listen on {config.prometheus_address}:{port} "
                f"({error}); choose a free port with --set monitoring.prometheus_port=N, or "
                "--set monitoring.prometheus=off"
            ) from error
    if push:
        dimensions = {
            "JobQueue": job_queue(),
            "Run": run,
            "Rank": str(rank),
            "Node": labels["node"],
        }
        cloudwatch = EmfWriter(dimensions, interval_s=config.cloudwatch_interval_seconds)
    _active = Monitor(labels, prometheus=prometheus, cloudwatch=cloudwatch, node=node, config=config)
    _active.record({registry.PROCESS_START: _active.started})
    if rank == 0:
        restarts = _restarts()
        # Counters start at 0 so that increase() sees their first step; restarts as the registry says.
        if prometheus is not None:
            prometheus.record(registry.RESTARTS, restarts)
        if cloudwatch is not None:
            cloudwatch.add(registry.RESTARTS, 1 if restarts else 0)
            _active.start_heartbeat(config.cloudwatch_interval_seconds)
        _active.record({registry.STEPS: 0, registry.SKIPPED_STEPS: 0})
    return _active


def listen_problems(config: MonitoringConfig, device_type: str, world_size: int) -> list[str]:
    """The Prometheus ports this launch needs that are taken, checked before any work: a torchrun worker checks its
    own (prometheus_port + LOCAL_RANK), the launcher every local rank's."""
    if not _on(config.prometheus, auto=device_type == "cuda"):
        return []
    local_ranks = [int(os.environ["LOCAL_RANK"])] if "LOCAL_RANK" in os.environ else range(world_size)
    problems = []
    for local_rank in local_ranks:
        port = config.prometheus_port + local_rank
        with socket.socket() as probe:
            # As the endpoint's server binds (http.server's allow_reuse_address): the port's connections left in
            # TIME_WAIT by a run that just ended do not make it look taken; a listening program still does.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((config.prometheus_address, port))
            except OSError as error:
                problems.append(
                    f"monitoring.prometheus_port = {config.prometheus_port}: local rank {local_rank} needs "
                    f"{config.prometheus_address}:{port}, which is taken ({error.strerror}); choose a free range "
                    "with --set monitoring.prometheus_port=N, or --set monitoring.prometheus=off"
                )
    return problems


def stop(*, completed: bool) -> None:
    """Close this process's monitor; `completed`: a clean end (train_iters reached, stopped on SIGTERM, or
    nothing left to train), which the alert rules must see before the endpoint goes."""
    global _active
    if _active is not None:
        _active.close(completed=completed, final_scrape_timeout_s=_active.config.final_scrape_timeout_seconds)
    _active = None


def active() -> Monitor | None:
    return _active


def record(values: Mapping[registry.Metric, float | None]) -> None:
    if _active is not None:
        _active.record(values)


def record_task(metric: registry.Metric, task: str, value: float) -> None:
    if _active is not None:
        _active.record_task(metric, task, value)


def begin_step() -> None:
    if _active is not None:
        _active.begin_step()


def end_step(step_time_s: float) -> None:
    if _active is not None:
        _active.end_step(step_time_s)


@contextlib.contextmanager
def timed(metric: registry.Metric) -> Iterator[None]:
    """Time the block into `metric`: a step phase adds up until end_step, anything else is recorded at once."""
    started = time.perf_counter()
    try:
        yield
    finally:
        add_phase(metric, time.perf_counter() - started)


def add_phase(metric: registry.Metric, seconds: float) -> None:
    """Add seconds measured elsewhere to `metric` (a step phase adds up until end_step)."""
    if _active is not None:
        _active.add_phase(metric, seconds)


def pipeline_idle(seconds: float) -> None:
    """A pipeline send/receive's wall time, into this step's pipeline idle time (trainer/distributed/parallel.py
    on_pipeline_wait)."""
    add_phase(registry.PIPELINE_IDLE_TIME, seconds)


def _pipeline_stage() -> int:
    """This rank's pipeline stage from megatron-core's process groups (0 before they exist, and for DeepSpeed)."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 0
    return parallel_state.get_pipeline_model_parallel_rank()


def _on(switch: str, *, auto: bool) -> bool:
    return switch == "on" or (switch == "auto" and auto)


def _restarts() -> int:
    """torchrun's restarts of this worker group (TORCHELASTIC_RESTART_COUNT) plus Batch's retries of the job
    (AWS_BATCH_JOB_ATTEMPT counts from 1)."""
    torchrun = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    batch = int(os.environ.get("AWS_BATCH_JOB_ATTEMPT", "1")) - 1
    return torchrun + batch
