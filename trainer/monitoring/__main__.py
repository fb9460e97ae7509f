"""`python -m trainer.monitoring --out DIR` (make monitoring): the Prometheus alert rules, the Alertmanager
inhibitions that go with them and the Grafana dashboard, generated from the metric registry, plus a scrape config
for a local run (docs/monitoring.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from trainer.monitoring.config import MonitoringConfig
from trainer.monitoring.dashboards import grafana_dashboard
from trainer.monitoring.rules import SCRAPE_JOB, alert_rules, inhibit_rules

RULES_FILE, DASHBOARD_FILE, SCRAPE_FILE = "prometheus-rules.yml", "grafana-dashboard.json", "prometheus.yml"
INHIBIT_FILE = "alertmanager-inhibit.yml"  # merge its inhibit_rules into your alertmanager.yml


def scrape_config(processes: int, port: int = MonitoringConfig().prometheus_port) -> dict:
    """A Prometheus config that scrapes this machine's training processes (one port per local rank)."""
    targets = [f"localhost:{port + rank}" for rank in range(processes)]
    return {
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "rule_files": [RULES_FILE],
        "scrape_configs": [{"job_name": SCRAPE_JOB, "static_configs": [{"targets": targets}]}],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.monitoring", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("runs/monitoring"))
    parser.add_argument("--stall-minutes", type=float, default=15, help="page after this long without a step")
    parser.add_argument(
        "--start-minutes", type=float, default=10, help="page when no first step after this long"
    )
    parser.add_argument(
        "--target-down-minutes", type=float, default=2, help="page when a process stops answering"
    )
    parser.add_argument("--remember-hours", type=float, default=24, help="how long a dead run keeps paging")
    parser.add_argument("--loss-spike-ratio", type=float, default=1.5, help="loss over its 30-minute median")
    parser.add_argument("--min-mfu", type=float)
    parser.add_argument("--min-tokens-per-second", type=float)
    parser.add_argument("--processes", type=int, default=4, help="local training processes to scrape")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rules = alert_rules(
        stall_minutes=args.stall_minutes,
        start_minutes=args.start_minutes,
        target_down_minutes=args.target_down_minutes,
        remember_hours=args.remember_hours,
        loss_spike_ratio=args.loss_spike_ratio,
        min_mfu=args.min_mfu,
        min_tokens_per_second=args.min_tokens_per_second,
    )
    (args.out / RULES_FILE).write_text(yaml.safe_dump(rules, sort_keys=False))
    (args.out / INHIBIT_FILE).write_text(yaml.safe_dump({"inhibit_rules": inhibit_rules()}, sort_keys=False))
    (args.out / DASHBOARD_FILE).write_text(json.dumps(grafana_dashboard(), indent=2) + "\n")
    (args.out / SCRAPE_FILE).write_text(yaml.safe_dump(scrape_config(args.processes), sort_keys=False))
    written = (RULES_FILE, INHIBIT_FILE, DASHBOARD_FILE, SCRAPE_FILE)
    print("wrote " + ", ".join(str(args.out / name) for name in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
