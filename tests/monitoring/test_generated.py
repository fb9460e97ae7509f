"""`make monitoring`'s output: the Grafana dashboard built by grafana-foundation-sdk from the registry, the rules and
a scrape config that promtool accepts."""

from __future__ import annotations

import json
import re
import subprocess

import yaml

from trainer.contract import metrics as r
from trainer.monitoring.__main__ import main
from trainer.monitoring.dashboards import UID, grafana_dashboard
from trainer.monitoring.rules import alert_rules, inhibit_rules


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
    assert "SUCCESS: 14 rules found" in result.stdout  # 6 recorded states, 7 alerts, LowMFU
    assert "localhost:9507" in (tmp_path / "prometheus.yml").read_text()
    assert json.loads((tmp_path / "grafana-dashboard.json").read_text())["uid"] == UID


def test_inhibit_rules_pass_amtool_check_config(tmp_path, amtool):
    assert main(["--out", str(tmp_path)]) == 0
    config = {
        "route": {"receiver": "oncall"},
        "receivers": [{"name": "oncall"}],
        **yaml.safe_load((tmp_path / "alertmanager-inhibit.yml").read_text()),
    }
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [amtool, "check-config", "alertmanager.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert " - 2 inhibit rules" in result.stdout
    broken = {**config, "inhibit_rules": [{"source_matchers": ['alertname=~"("']}]}  # a bad regex
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(broken))
    result = subprocess.run(
        [amtool, "check-config", "alertmanager.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode != 0  # the checker refuses what Alertmanager would refuse


def test_every_alert_carries_a_runbook_and_inhibitions_name_real_alerts():
    rules = alert_rules(min_mfu=0.3, min_tokens_per_second=1)
    alerts = {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule}
    assert all(len(rule["annotations"]["runbook"]) > 80 for rule in alerts.values())
    for inhibit in inhibit_rules():
        for matcher in (*inhibit["source_matchers"], *inhibit["target_matchers"]):
            names = re.fullmatch(r'alertname=~?"(.+)"', matcher).group(1).split("|")
            assert set(names) <= set(alerts), names
