"""`python -m trainer.monitoring --out DIR` (make monitoring): the Prometheus alert rules and the Grafana dashboard,
generated from the metric registry, plus a scrape config for a local run (docs/monitoring.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from trainer.monitoring.config import MonitoringConfig
from trainer.monitoring.dashboards import grafana_dashboard
from trainer.monitoring.rules import alert_rules

RULES_FILE, DASHBOARD_FILE, SCRAPE_FILE = "prometheus-rules.yml", "grafana-dashboard.json", "prometheus.yml"


def scrape_config(processes: int, port: int = MonitoringConfig().prometheus_port) -> dict:
    """A Prometheus config that scrapes this machine's training processes (one port per local rank)."""
    targets = [f"localhost:{port + rank}" for rank in range(processes)]
    return {
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "rule_files": [RULES_FILE],
        "scrape_configs": [{"job_name": "trainstack", "static_configs": [{"targets": targets}]}],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.monitoring", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("runs/monitoring"))
    parser.add_argument("--stall-minutes", type=int, default=15)
    parser.add_argument("--min-mfu", type=float)
    parser.add_argument("--min-tokens-per-second", type=float)
    parser.add_argument("--processes", type=int, default=4, help="local training processes to scrape")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rules = alert_rules(
        stall_minutes=args.stall_minutes,
        min_mfu=args.min_mfu,
        min_tokens_per_second=args.min_tokens_per_second,
    )
    (args.out / RULES_FILE).write_text(yaml.safe_dump(rules, sort_keys=False))
    (args.out / DASHBOARD_FILE).write_text(json.dumps(grafana_dashboard(), indent=2) + "\n")
    (args.out / SCRAPE_FILE).write_text(yaml.safe_dump(scrape_config(args.processes), sort_keys=False))
    print(f"wrote {args.out / RULES_FILE}, {args.out / DASHBOARD_FILE}, {args.out / SCRAPE_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
