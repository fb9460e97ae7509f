"""Pull: this process's metrics on an HTTP endpoint in Prometheus's text exposition format (prometheus-client).

Training values are set when the loop records them; node values (NVML, EFA, host memory) are read at scrape time
by a collector, so a node costs nothing between scrapes. Each process serves its own port (the configured one plus
its local rank), so every rank's step time is there without a collective; node values come from local rank 0 only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from trainer.contract import metrics as r
from trainer.monitoring.node import NodeReaders


class PrometheusExporter:
    def __init__(self, labels: dict[str, str], node: NodeReaders | None) -> None:
        disable_created_metrics()  # no `_created` series beside each counter: nothing here reads them
        self.labels = labels  # run, job_id, node, rank, stage
        self.registry = CollectorRegistry(auto_describe=True)
        self.families: dict[r.Metric, Gauge | Counter] = {}
        self.children: dict[r.Metric, Any] = {}  # this process's labelled series, looked up once
        for metric in r.METRICS:
            if metric in r.NODE_METRICS:
                continue  # NodeCollector reads them at scrape time
            kind = Counter if metric.kind == "counter" else Gauge
            # prometheus-client appends _total to a counter's name itself.
            name = metric.full_name.removesuffix("_total")
            family = kind(name, metric.help, metric.labels, registry=self.registry)
            self.families[metric] = family
        if node is not None:
            self.registry.register(NodeCollector(node, {k: labels[k] for k in r.NODE_LABELS}))
        self.server = None

    def serve(self, port: int, address: str) -> None:
        self.server, _ = start_http_server(port, addr=address, registry=self.registry)

    def record(self, metric: r.Metric, value: float) -> None:
        child = self.children.get(metric)
        if child is None:
            family = self.families.get(metric)
            if family is None:
                return
            child = self.children[metric] = family.labels(*(self.labels[label] for label in metric.labels))
        if metric.kind == "counter":
            child.inc(value)
        else:
            child.set(value)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class NodeCollector(Collector):
    """NVML, EFA and host-memory samples, read when Prometheus scrapes."""

    def __init__(self, node: NodeReaders, labels: dict[str, str]) -> None:
        self.node, self.labels = node, labels

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        grouped = defaultdict(list)
        for sample in self.node.samples():
            grouped[sample.metric].append(sample)
        for metric, samples in grouped.items():
            extra = [label for label in metric.labels if label not in self.labels]
            names = [*self.labels, *extra]
            if metric.kind == "counter":
                family = CounterMetricFamily(
                    metric.full_name.removesuffix("_total"), metric.help, labels=names
                )
            else:
                family = GaugeMetricFamily(metric.full_name, metric.help, labels=names)
            for sample in samples:
                family.add_metric([*self.labels.values(), *(sample.labels[k] for k in extra)], sample.value)
            yield family
