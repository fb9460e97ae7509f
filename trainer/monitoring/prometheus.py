"""Pull: this process's metrics on an HTTP endpoint in Prometheus's text exposition format (prometheus-client).

Training values are set when the loop records them; node values (NVML, EFA, host memory) are read at scrape time
by a collector, so a node costs nothing between scrapes. Each process serves its own port (the configured one plus
its local rank), so every rank's step time is there without a collective; node values come from local rank 0 only.

At a clean end the process keeps serving until one scrape that began after its completion time was delivered (at
most `final_scrape_timeout_seconds`, and not at all when nothing ever scraped it): pull-based monitoring sees a
final state only if a scrape reads it (Prometheus docs, "Instrumentation: batch jobs" and "When to use the
Pushgateway": a process that exits between scrapes leaves no trace of how it ended).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from trainer.contract import metrics as registry
from trainer.monitoring.node import NodeReaders

# How often the endpoint's server looks for close(): what a rank's end waits for it, at most.
SHUTDOWN_POLL_S = 0.05


class PrometheusExporter:
    def __init__(self, labels: dict[str, str], node: NodeReaders | None) -> None:
        disable_created_metrics()  # no `_created` series beside each counter: nothing here reads them
        self.labels = labels  # run, job_id, node, rank, stage
        self.registry = CollectorRegistry(auto_describe=True)
        self.families: dict[registry.Metric, Gauge | Counter] = {}
        self.children: dict[Any, Any] = {}  # this process's labelled series, looked up once
        for metric in registry.METRICS:
            if metric in registry.NODE_METRICS or metric in registry.SERVING_METRICS or not metric.prometheus:
                continue  # NodeCollector reads node metrics at scrape time; a model server exports its own
            kind = Counter if metric.kind == "counter" else Gauge
            # prometheus-client appends _total to a counter's name itself.
            name = metric.full_name.removesuffix("_total")
            family = kind(name, metric.help, metric.labels, registry=self.registry)
            self.families[metric] = family
        if node is not None:
            self.registry.register(NodeCollector(node, {k: labels[k] for k in registry.NODE_LABELS}))
        self.server: ThreadingWSGIServer | None = None
        self.scrapes: list[float] = []  # monotonic start times of the scrapes answered in full

    def serve(self, port: int, address: str) -> None:
        """prometheus-client's WSGI app (what its start_http_server serves) behind a server that notes each
        scrape once its answer was written."""
        app = make_wsgi_app(self.registry)

        def scraped(environ: dict, start_response: Callable) -> Iterable[bytes]:
            began = time.monotonic()
            return _Delivered(app(environ, start_response), lambda: self.scrapes.append(began))

        self.server = server = make_server(address, port, scraped, ThreadingWSGIServer, handler_class=_Quiet)
        # close() waits for serve_forever to look, every poll_interval (0.5 s by default; Python docs,
        # socketserver.BaseServer.serve_forever): each rank's end would wait up to half a second for it.
        threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": SHUTDOWN_POLL_S},
            daemon=True,
            name="prometheus-endpoint",
        ).start()

    def wait_for_scrape(self, since: float, timeout_s: float) -> bool:
        """Keep serving until a scrape that began after `since` (time.monotonic) was answered; give up after two
        of the intervals seen so far (at most `timeout_s`), or at once when nothing has scraped this endpoint."""
        if not self.scrapes:
            return False
        seen = self.scrapes[-1] - self.scrapes[-2] if len(self.scrapes) > 1 else timeout_s
        deadline = since + min(timeout_s, 2 * seen + 1)
        while time.monotonic() < deadline:
            if self.scrapes[-1] > since:
                return True
            time.sleep(0.05)
        return self.scrapes[-1] > since

    def record(self, metric: registry.Metric, value: float, task: str | None = None) -> None:
        """task: the evaluation suite task a TASK_LABELS metric's value belongs to."""
        key = metric if task is None else (metric, task)
        child = self.children.get(key)
        if child is None:
            family = self.families.get(metric)
            if family is None:
                return
            labels = {**self.labels, "task": task or ""}
            child = self.children[key] = family.labels(*(labels[label] for label in metric.labels))
        if isinstance(child, Counter):
            child.inc(value)
        else:
            child.set(value)  # NaN and +-Inf too: the text format carries them (a non-finite loss is news)

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
            family: CounterMetricFamily | GaugeMetricFamily
            if metric.kind == "counter":
                family = CounterMetricFamily(
                    metric.full_name.removesuffix("_total"), metric.help, labels=names
                )
            else:
                family = GaugeMetricFamily(metric.full_name, metric.help, labels=names)
            for sample in samples:
                family.add_metric([*self.labels.values(), *(sample.labels[k] for k in extra)], sample.value)
            yield family


class _Delivered:
    """A WSGI body whose close() (wsgiref calls it after the last byte is written) reports the delivery."""

    def __init__(self, body: Iterable[bytes], delivered: Callable[[], None]) -> None:
        self.body, self.delivered = body, delivered

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.body)

    def close(self) -> None:
        self.delivered()


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log line per scrape on the training console."""
