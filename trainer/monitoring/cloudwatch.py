"""Push on AWS: CloudWatch embedded metric format (EMF) lines on stdout, which the awslogs driver ships to the job's
log stream, where CloudWatch Logs extracts the metrics (no agent, no PutMetricData permission).

The document follows "Specification: Embedded metric format" (Amazon CloudWatch User Guide,
CloudWatch_Embedded_Metric_Format_Specification): one JSON object per log event with `_aws.Timestamp` (ms) and
`_aws.CloudWatchMetrics` directives (Namespace, Dimensions: DimensionSets of at most 9 keys, Metrics: at most 100
MetricDefinitions of Name and Unit), every referenced dimension a string member and every metric a number or an
array of at most 100 numbers on the root. Values gathered between lines go out as arrays, so CloudWatch computes
the statistics over all of them; a metric that reaches 100 values writes its line early rather than drop any, so a
minute's Max and Min keep the spike. Counters go out as their increase since the last line (deltas: CloudWatch's
Sum adds the lines up).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import IO

from trainer.contract import metrics as registry
from trainer.contract.metrics import NODE_DIMENSIONS, RANK_DIMENSIONS, RUN_DIMENSIONS, TASK_DIMENSIONS
from trainer.monitoring.node import Sample

MAX_VALUES = 100  # numeric array targets (spec: "MUST NOT have more than 100 members")
MAX_METRICS = 100  # MetricDefinitions per directive


def dimensions_for(metric: registry.Metric) -> list[list[str]]:
    if "task" in metric.labels:
        return TASK_DIMENSIONS
    if "rank" in metric.labels:
        return RANK_DIMENSIONS
    if "node" in metric.labels:
        return NODE_DIMENSIONS
    return RUN_DIMENSIONS


class EmfWriter:
    """Gathers values and writes one EMF line per dimension group at most every `interval_s` seconds."""

    def __init__(
        self,
        dimensions: dict[str, str],
        *,
        interval_s: float,
        stream: IO[str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.dimensions = dimensions  # JobQueue, Run, Rank, Node -> value
        self.interval_s = interval_s
        self.stream = stream or sys.stdout
        self.clock = clock
        self.gauges: dict[registry.Metric, list[float]] = defaultdict(list)
        self.counters: dict[registry.Metric, float] = defaultdict(float)
        self.last_flush = clock()

    def add(self, metric: registry.Metric, value: float) -> None:
        if metric.cloudwatch is None:
            return
        if metric.kind == "counter":
            self.counters[metric] += value
        else:
            values = self.gauges[metric]
            values.append(value)
            if len(values) == MAX_VALUES:
                self.flush()

    def write_task(self, metric: registry.Metric, task: str, value: float) -> None:
        """A value of one task of the evaluation suite, written at once in a line of its own (Task dimension)."""
        if metric.cloudwatch is None:
            return
        self._write(int(self.clock() * 1000), dimensions_for(metric), {metric: value}, {"Task": task})

    def add_samples(self, samples: Iterable[Sample], previous: dict[tuple, float]) -> None:
        """Node samples: gauges as arrays (one value per GPU), counters as their increase since `previous`."""
        for sample in samples:
            if sample.metric.cloudwatch is None:
                continue
            if sample.metric.kind == "counter":
                if sample.metric is registry.GPU_ECC_ERRORS and sample.labels.get("type") != "uncorrected":
                    continue
                key = (sample.metric.name, tuple(sorted(sample.labels.items())))
                before = previous.get(key)
                previous[key] = sample.value
                if before is not None:
                    self.counters[sample.metric] += max(0.0, sample.value - before)
            else:
                self.add(sample.metric, sample.value)

    def due(self) -> bool:
        return self.clock() - self.last_flush >= self.interval_s

    def flush(self) -> None:
        """Write what was gathered: one line per dimension group; nothing when nothing was gathered."""
        timestamp = int(self.clock() * 1000)
        groups: dict[str, dict[registry.Metric, float | list[float]]] = defaultdict(dict)
        for metric, values in self.gauges.items():
            if values:
                groups[json.dumps(dimensions_for(metric))][metric] = values
        for metric, total in self.counters.items():
            groups[json.dumps(dimensions_for(metric))][metric] = total
        for dimension_sets, group in groups.items():
            self._write(timestamp, json.loads(dimension_sets), group)
        self.gauges.clear()
        self.counters.clear()
        self.last_flush = self.clock()

    def _write(
        self,
        timestamp: int,
        dimension_sets: list[list[str]],
        values: dict,
        more: dict[str, str] | None = None,
    ) -> None:
        dimensions = {**self.dimensions, **(more or {})}
        keys = {key for dimension_set in dimension_sets for key in dimension_set}
        document = {
            "_aws": {
                "Timestamp": timestamp,
                "CloudWatchMetrics": [
                    {
                        "Namespace": registry.CLOUDWATCH_NAMESPACE,
                        "Dimensions": dimension_sets,
                        "Metrics": [
                            {"Name": metric.cloudwatch, "Unit": metric.cloudwatch_unit}
                            for metric in list(values)[:MAX_METRICS]
                        ],
                    }
                ],
            },
            **{key: dimensions[key] for key in sorted(keys)},
            **{metric.cloudwatch: value for metric, value in values.items()},
        }
        # One write per line: lines from several ranks sharing the container's stdout do not interleave.
        self.stream.write(json.dumps(document, separators=(",", ":")) + "\n")
        self.stream.flush()


# The queue of a job on an EKS stack, for the JobQueue dimension where Batch sets AWS_BATCH_JQ_NAME: the JobSet
# (trainer/jobs/jobset.py) sets it to the stack's Kueue LocalQueue, the alarms' dimension on EKS (docs/eks.md).
JOB_QUEUE_ENV = "TRAINSTACK_JOB_QUEUE"


def under_aws_batch() -> bool:
    """AWS Batch sets AWS_BATCH_JOB_ID in every job's container (Batch User Guide, job environment variables)."""
    return "AWS_BATCH_JOB_ID" in os.environ


def on_a_stack() -> bool:
    """A job on a stack's cluster: Batch's, or a JobSet's on EKS; its stdout goes to the stack's log group."""
    return under_aws_batch() or JOB_QUEUE_ENV in os.environ


def job_queue() -> str:
    return os.environ.get("AWS_BATCH_JQ_NAME") or os.environ.get(JOB_QUEUE_ENV, "local")
