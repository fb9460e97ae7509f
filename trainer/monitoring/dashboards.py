"""The Grafana dashboard from the metric registry, built with Grafana's own SDK (grafana-foundation-sdk), for a
Prometheus data source: loss, throughput, MFU, step time and its parts per rank, GPUs, EFA, host memory."""

from __future__ import annotations

import json

from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from trainer.contract import metrics as registry

UID = "trainstack-training"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


def _panel(title: str, unit: str, *queries: tuple[str, str]) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).unit(unit).datasource(DATASOURCE).height(8).span(12)
    for expr, legend in queries:
        panel = panel.with_target(prometheus.Dataquery().expr(expr).legend_format(legend))
    return panel


def _by_run(metric: registry.Metric) -> str:
    return f'{metric.full_name}{{run=~"$run"}}'


def grafana_dashboard() -> dict:
    rank_legend = "rank {{rank}} (stage {{stage}})"
    rate = 'rate({name}{{run=~"$run"}}[5m])'
    built = (
        dashboard.Dashboard("trainstack: training")
        .uid(UID)
        .tags(["trainstack"])
        .refresh("30s")
        .time("now-6h", "now")
        .with_variable(dashboard.DatasourceVariable("datasource").type("prometheus"))
        .with_variable(
            dashboard.QueryVariable("run")
            .datasource(DATASOURCE)
            .query(f"label_values({registry.STEP.full_name}, run)")
            .include_all(True)
            .multi(True)
        )
        .with_row(dashboard.Row("Run"))
        .with_panel(
            _panel(
                "Loss",
                "none",
                (_by_run(registry.TRAINING_LOSS), "train {{run}}"),
                (_by_run(registry.VALIDATION_LOSS), "validation {{run}}"),
            )
        )
        .with_panel(_panel("Tokens/s", "none", (_by_run(registry.TOKENS_PER_SECOND), "{{run}}")))
        .with_panel(_panel("MFU", "percentunit", (_by_run(registry.MFU), "{{run}}")))
        .with_panel(_panel("Step time per rank", "s", (_by_run(registry.STEP_TIME), rank_legend)))
        .with_panel(
            _panel(
                "Step parts (rank 0)",
                "s",
                *(
                    (f'{m.full_name}{{run=~"$run",rank="0"}}', m.name)
                    for m in (
                        registry.FORWARD_BACKWARD_TIME,
                        registry.OPTIMIZER_TIME,
                        registry.DATA_WAIT_TIME,
                        registry.PIPELINE_IDLE_TIME,
                    )
                ),
            )
        )
        .with_panel(_panel("Gradient norm", "none", (_by_run(registry.GRADIENT_NORM), "{{run}}")))
        .with_row(dashboard.Row("Nodes"))
        .with_panel(
            _panel(
                "GPU utilisation", "percentunit", (_by_run(registry.GPU_UTILIZATION), "{{node}} gpu {{gpu}}")
            )
        )
        .with_panel(
            _panel("GPU temperature", "celsius", (_by_run(registry.GPU_TEMPERATURE), "{{node}} gpu {{gpu}}"))
        )
        .with_panel(_panel("GPU power", "watt", (_by_run(registry.GPU_POWER), "{{node}} gpu {{gpu}}")))
        .with_panel(
            _panel("GPU memory used", "bytes", (_by_run(registry.GPU_MEMORY_USED), "{{node}} gpu {{gpu}}"))
        )
        .with_panel(
            _panel(
                "EFA throughput",
                "Bps",
                (rate.format(name=registry.EFA_TRANSMITTED.full_name), "tx {{node}} {{device}}"),
                (rate.format(name=registry.EFA_RECEIVED.full_name), "rx {{node}} {{device}}"),
            )
        )
        .with_panel(
            _panel(
                "EFA retransmits",
                "pps",
                (rate.format(name=registry.EFA_RETRANSMITTED_PACKETS.full_name), "{{node}} {{device}}"),
            )
        )
        .with_panel(_panel("Host memory used", "bytes", (_by_run(registry.HOST_MEMORY_USED), "{{node}}")))
    ).build()
    return json.loads(json.dumps(built, cls=JSONEncoder))
