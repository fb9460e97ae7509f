"""The model server's Prometheus metrics at /metrics: the families trainer/contract/metrics.py defines
(SERVING_METRICS) in their own registry, served by prometheus-client's ASGI app on the server's own port.
The request path is measured around the API (trainer/serving/app.py `Served`); the tokens are counted as the API
generates them."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, make_asgi_app

from trainer.contract import metrics as registry


class ServingMetrics:
    def __init__(self, labels: dict[str, str]) -> None:
        """labels: run, job_id and model (SERVING_LABELS less the endpoint, which each request names)."""
        disable_created_metrics()
        self.labels = labels
        self.registry = CollectorRegistry(auto_describe=True)
        self.families: dict[registry.Metric, Any] = {}
        for metric in registry.SERVING_METRICS:
            kind = Counter if metric.kind == "counter" else Gauge
            # prometheus-client appends _total to a counter's name itself.
            family = kind(
                metric.full_name.removesuffix("_total"), metric.help, metric.labels, registry=self.registry
            )
            self.families[metric] = family
        self.app = make_asgi_app(self.registry)

    def child(self, metric: registry.Metric, endpoint: str, **extra: str) -> Any:
        values = {**self.labels, "endpoint": endpoint, **extra}
        return self.families[metric].labels(*(values[label] for label in metric.labels))
