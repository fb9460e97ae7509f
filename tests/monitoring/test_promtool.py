"""The generated alert rules pass `promtool check rules`, and `promtool test rules` shows TrainingStalled firing on
a stalled series (and on a process that died) and not on a healthy or finished run."""

from __future__ import annotations

import subprocess

import yaml

from trainer.monitoring.rules import alert_rules

# Series notation: promtool's unit-test format (Prometheus docs, "Unit testing for rules"): 'a+bxN' is N+1 samples.
STEP_TIME = "trainstack_last_step_timestamp_seconds"


def write_rules(tmp_path, **options):
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(alert_rules(**options), sort_keys=False))
    return path


def run_promtool_test(promtool, tmp_path, series, alerts, eval_time="30m"):
    rules = write_rules(tmp_path, stall_minutes=10)
    test = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": eval_time, "alertname": "TrainingStalled", "exp_alerts": alerts}
                ],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    return subprocess.run(
        [promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True
    )


def stalled_alert(ago="19m 0s"):
    return {
        "exp_labels": {"severity": "page", "run": "r", "job_id": "local"},
        "exp_annotations": {
            "summary": "Run r (job local) has made no step for 10 minutes",
            "description": f"The last step completed {ago} ago.",
        },
    }


def test_rules_pass_promtool_check(promtool, tmp_path):
    path = write_rules(tmp_path, min_mfu=0.3, min_tokens_per_second=1000)
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 4 rules found" in result.stdout


def test_stall_alert_fires_when_steps_stop(promtool, tmp_path):
    # A step a minute (timestamps 60 s apart) for 10 minutes, then the same timestamp: no new step for 20 minutes.
    series = [{"series": f'{STEP_TIME}{{run="r",job_id="local"}}', "values": "60+60x10 660x20"}]
    result = run_promtool_test(promtool, tmp_path, series, [stalled_alert()])
    assert result.returncode == 0, result.stdout + result.stderr


def test_stall_alert_fires_when_the_process_is_gone(promtool, tmp_path):
    series = [{"series": f'{STEP_TIME}{{run="r",job_id="local"}}', "values": "60+60x10"}]  # then nothing
    result = run_promtool_test(promtool, tmp_path, series, [stalled_alert()])
    assert result.returncode == 0, result.stdout + result.stderr


def test_stall_alert_silent_on_a_healthy_run(promtool, tmp_path):
    series = [{"series": f'{STEP_TIME}{{run="r",job_id="local"}}', "values": "60+60x40"}]
    result = run_promtool_test(promtool, tmp_path, series, [])
    assert result.returncode == 0, result.stdout + result.stderr


def test_stall_alert_silent_once_the_run_completed(promtool, tmp_path):
    series = [
        {"series": f'{STEP_TIME}{{run="r",job_id="local"}}', "values": "60+60x10"},
        {"series": 'trainstack_run_completed{run="r",job_id="local"}', "values": "_x9 1"},
    ]
    result = run_promtool_test(promtool, tmp_path, series, [])
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_expectation_fails(promtool, tmp_path):
    """The harness can fail: expecting no alert on the stalled series is reported by promtool."""
    series = [{"series": f'{STEP_TIME}{{run="r",job_id="local"}}', "values": "60+60x10 660x20"}]
    result = run_promtool_test(promtool, tmp_path, series, [])
    assert result.returncode != 0 and "TrainingStalled" in result.stdout + result.stderr
