"""`make monitoring`'s output: the Grafana dashboard built by grafana-foundation-sdk from the registry, the rules and
a scrape config that promtool accepts."""

from __future__ import annotations

import json
import re
import subprocess

from trainer.contract import metrics as r
from trainer.monitoring.__main__ import main
from trainer.monitoring.dashboards import UID, grafana_dashboard


def test_dashboard_queries_only_registry_metrics_and_shows_the_run():
    dashboard = grafana_dashboard()
    assert dashboard["uid"] == UID
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    used = {name for expr in exprs for name in re.findall(r"trainstack_[a-z_]+", expr)}
    assert used <= {m.full_name for m in r.METRICS}
    for metric in (
        r.TRAINING_LOSS,
        r.TOKENS_PER_SECOND,
        r.MFU,
        r.STEP_TIME,
        r.GPU_UTILIZATION,
        r.EFA_TRANSMITTED,
    ):
        assert metric.full_name in used, metric.name
    titles = [panel["title"] for panel in dashboard["panels"]]
    assert "Step time per rank" in titles and "EFA retransmits" in titles


def test_make_monitoring_writes_files_promtool_accepts(tmp_path, promtool):
    assert main(["--out", str(tmp_path), "--min-mfu", "0.3", "--processes", "8"]) == 0
    result = subprocess.run(
        [promtool, "check", "config", "prometheus.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 3 rules found" in result.stdout
    assert "localhost:9507" in (tmp_path / "prometheus.yml").read_text()
    assert json.loads((tmp_path / "grafana-dashboard.json").read_text())["uid"] == UID
