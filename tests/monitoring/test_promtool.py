"""The generated rules pass `promtool check rules`, and `promtool test rules` plays each case an operator meets:
a clean end, a killed run (still paging two hours later), a hang before step 1, a run resumed after a clean end,
a NaN loss, skipped steps, a loss spike, one of two jobs stalled, and a healthy run that pages nothing.

Input series are what the exporter serves (trainer/contract/metrics.py names and labels) plus the `up` series
Prometheus writes per target; a process that exits gets a staleness marker, as Prometheus writes at the first
failed scrape ("Staleness", Prometheus querying docs). Notation: promtool's unit-test format (Prometheus docs,
"Unit testing for rules"): one value per minute here, `_` for no sample.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
import yaml

from trainer.contract import metrics as r
from trainer.monitoring.rules import alert_rules

MINUTE = 60
PAGES = ("TrainingStalled", "TrainingNeverStarted", "TrainingTargetDown")


def timeline(minutes: int, value: Callable[[int], float | str | None]) -> str:
    """One value per minute 0..minutes-1: a number, 'stale', or None for no sample."""
    out = []
    for t in range(minutes):
        v = value(t)
        out.append("_" if v is None else str(v))
    return " ".join(out)


class Process:
    """One training process (rank 0) of `run` served at `instance`, alive from minute `start` to `end`
    (exclusive), stepping once a minute from `first_step` to `last_step`, marking a clean end if `completed`."""

    def __init__(self, run="r", instance="node-a:9500", *, start, end, first_step=None, last_step=None,
                 completed=False):  # fmt: skip
        self.run, self.instance = run, instance
        self.start, self.end = start, end
        self.first_step, self.last_step = first_step, last_step
        self.completed = completed

    def alive(self, t: int) -> bool:
        return self.start <= t < self.end

    def gauge(self, t: int, value: float | None) -> float | str | None:
        if t == self.end:
            return "stale"  # the first failed scrape after the process exited
        return value if self.alive(t) else None

    def series(self, minutes: int) -> list[dict[str, str]]:
        process = f'run="{self.run}",job_id="j",node="n",rank="0",stage="0"'
        target = f'instance="{self.instance}",job="trainstack"'
        run = f'run="{self.run}",job_id="j",{target}'

        def last_step(t: int) -> float | None:
            if self.first_step is None or t < self.first_step:
                return None
            return min(t, self.last_step) * MINUTE

        def completed(t: int) -> float | None:
            return (self.end - 1) * MINUTE if self.completed and t == self.end - 1 else None

        return [
            {
                "series": f"{r.PROCESS_START.full_name}{{{process},{target}}}",
                "values": timeline(minutes, lambda t: self.gauge(t, self.start * MINUTE)),
            },
            {
                "series": f"{r.LAST_STEP_TIME.full_name}{{{run}}}",
                "values": timeline(minutes, lambda t: self.gauge(t, last_step(t))),
            },
            {
                "series": f"{r.PROCESS_COMPLETED.full_name}{{{process},{target}}}",
                "values": timeline(minutes, lambda t: self.gauge(t, completed(t))),
            },
        ]


def up(instance: str, minutes: int, answering: Callable[[int], bool]) -> dict[str, str]:
    """Prometheus's `up` for a statically configured target: 1 while a process answers, 0 otherwise."""
    return {
        "series": f'up{{instance="{instance}",job="trainstack"}}',
        "values": timeline(minutes, lambda t: 1 if answering(t) else 0),
    }


def merge_series(*processes: Process, minutes: int) -> list[dict[str, str]]:
    """Processes on the same target one after another share its series: later values fill earlier gaps."""
    merged: dict[str, list[str]] = {}
    for process in processes:
        for item in process.series(minutes):
            values = item["values"].split()
            before = merged.setdefault(item["series"], ["_"] * minutes)
            merged[item["series"]] = [v if v != "_" else b for v, b in zip(values, before, strict=True)]
    series = [{"series": name, "values": " ".join(values)} for name, values in merged.items()]
    for instance in {p.instance for p in processes}:
        on_target = [p for p in processes if p.instance == instance]
        series.append(up(instance, minutes, lambda t, ps=on_target: any(p.alive(t) for p in ps)))
    return series


def alerts_at(
    rules: dict, promtool: str, tmp_path, series, expected: dict[str, dict[str, list]], interval: str = "1m"
) -> str:
    """Run promtool with `expected` = {eval_time: {alertname: [labels of each firing alert]}}; return its output
    (empty when every expectation held). Annotations are checked by summary in the tests that need them."""
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    tests = []
    for eval_time, by_name in expected.items():
        for name, labels in by_name.items():
            tests.append(
                {
                    "eval_time": eval_time,
                    "alertname": name,
                    "exp_alerts": [{"exp_labels": lab, "exp_annotations": annotations(rules, name, lab)}
                                   for lab in labels],
                }
            )  # fmt: skip
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": interval, "input_series": series, "alert_rule_test": tests}],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    return "" if result.returncode == 0 else result.stdout + result.stderr


RENDERED: dict[tuple[str, str], str] = {}  # (alertname, run) -> the summary a test expects


def annotations(rules: dict, name: str, labels: dict) -> dict[str, str]:
    [rule] = [rule for group in rules["groups"] for rule in group["rules"] if rule.get("alert") == name]
    return {
        "summary": RENDERED[name, labels.get("run", labels.get("instance"))],
        "runbook": rule["annotations"]["runbook"],
    }


def run_labels(run: str = "r", severity: str = "page") -> dict[str, str]:
    return {"run": run, "job_id": "j", "severity": severity}


def target_labels(instance: str = "node-a:9500", run: str = "r") -> dict[str, str]:
    return {"instance": instance, "job": "trainstack", "run": run, "job_id": "j", "severity": "page"}


@pytest.fixture
def rules():
    RENDERED.clear()
    return alert_rules(stall_minutes=10, start_minutes=10, target_down_minutes=2)


def quiet() -> dict[str, list]:
    return {name: [] for name in PAGES}


def no_pages(*times: str) -> dict[str, dict[str, list]]:
    return {time: quiet() for time in times}


def test_rules_pass_promtool_check(promtool, tmp_path):
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(alert_rules(min_mfu=0.3, min_tokens_per_second=1000), sort_keys=False))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 15 rules found" in result.stdout  # 6 recorded states, 9 alerts


def test_a_healthy_run_pages_nothing(promtool, tmp_path, rules):
    series = merge_series(Process(start=1, end=200, first_step=2, last_step=199), minutes=200)
    assert alerts_at(rules, promtool, tmp_path, series, no_pages("30m", "150m")) == ""


def test_a_clean_end_pages_nothing_then_or_two_hours_later(promtool, tmp_path, rules):
    series = merge_series(Process(start=1, end=12, first_step=2, last_step=10, completed=True), minutes=160)
    assert alerts_at(rules, promtool, tmp_path, series, no_pages("13m", "40m", "155m")) == ""


def test_a_completion_scraped_once_between_two_rule_evaluations_still_counts(promtool, tmp_path, rules):
    """Scrapes every 15 s, rules every minute: the completion is served for one scrape (11m30s), stale at the next,
    and no rule evaluation falls in between; the rules still see the clean end."""
    scrapes = 4 * 60  # one hour of 15-second samples
    alive = range(4, 47)

    def at(i: int, value: float | None) -> float | str | None:
        return "stale" if i == 47 else (value if i in alive else None)

    process = 'run="r",job_id="j",node="n",rank="0",stage="0",instance="node-a:9500",job="trainstack"'
    series = [
        {
            "series": f"{r.PROCESS_START.full_name}{{{process}}}",
            "values": timeline(scrapes, lambda i: at(i, 60)),
        },
        {
            "series": f'{r.LAST_STEP_TIME.full_name}{{run="r",job_id="j",instance="node-a:9500",job="trainstack"}}',
            "values": timeline(scrapes, lambda i: at(i, 15 * min(i, 44) if i >= 8 else None)),
        },
        {
            "series": f"{r.PROCESS_COMPLETED.full_name}{{{process}}}",
            "values": timeline(scrapes, lambda i: at(i, 690 if i == 46 else None)),
        },
        up("node-a:9500", scrapes, lambda i: i in alive),
    ]
    assert alerts_at(rules, promtool, tmp_path, series, no_pages("30m", "55m"), interval="15s") == ""


def test_a_killed_run_pages_target_down_then_stalled_and_still_does_two_hours_later(
    promtool, tmp_path, rules
):
    series = merge_series(Process(start=1, end=12, first_step=2, last_step=11), minutes=160)
    RENDERED["TrainingTargetDown", "r"] = "Training process at node-a:9500 (run r) does not answer scrapes"
    RENDERED["TrainingStalled", "r"] = "Run r (job j) has made no step for 2h 24m 0s (limit 10 min)"
    expected = {
        "13m": quiet(),  # down one minute: under the target-down window
        "15m": {"TrainingTargetDown": [target_labels()], "TrainingStalled": []},
        "155m": {"TrainingTargetDown": [target_labels()], "TrainingStalled": [run_labels()],
                 "TrainingNeverStarted": []},
    }  # fmt: skip
    assert alerts_at(rules, promtool, tmp_path, series, expected) == ""


def test_a_dead_run_is_forgotten_after_remember_hours(promtool, tmp_path):
    rules = alert_rules(stall_minutes=10, remember_hours=1)
    series = [s for s in merge_series(Process(start=1, end=12, first_step=2, last_step=11), minutes=160)
              if not s["series"].startswith("up")]  # fmt: skip
    RENDERED.clear()
    RENDERED["TrainingStalled", "r"] = "Run r (job j) has made no step for 49m 0s (limit 10 min)"
    expected = {"60m": {"TrainingStalled": [run_labels()]}, "90m": {"TrainingStalled": []}}
    assert alerts_at(rules, promtool, tmp_path, series, expected) == ""


def test_a_run_hung_before_its_first_step_pages_never_started(promtool, tmp_path, rules):
    series = merge_series(Process(start=1, end=200), minutes=200)
    RENDERED["TrainingNeverStarted", "r"] = "Run r (job j) started 11m 0s ago and has not completed a step"
    expected = {
        "8m": quiet(),
        "12m": {"TrainingNeverStarted": [run_labels()], "TrainingStalled": [], "TrainingTargetDown": []},
    }
    assert alerts_at(rules, promtool, tmp_path, series, expected) == ""


def test_a_run_that_dies_before_its_first_step_pages_and_keeps_paging(promtool, tmp_path, rules):
    series = merge_series(Process(start=1, end=5), minutes=160)
    RENDERED["TrainingTargetDown", "r"] = "Training process at node-a:9500 (run r) does not answer scrapes"
    RENDERED["TrainingNeverStarted", "r"] = "Run r (job j) started 2h 34m 0s ago and has not completed a step"
    expected = {
        "8m": {"TrainingTargetDown": [target_labels()], "TrainingNeverStarted": []},
        "155m": {"TrainingTargetDown": [target_labels()], "TrainingNeverStarted": [run_labels()],
                 "TrainingStalled": []},
    }  # fmt: skip
    assert alerts_at(rules, promtool, tmp_path, series, expected) == ""


def test_a_run_resumed_after_a_clean_end_is_watched_at_once(promtool, tmp_path, rules):
    first = Process(start=1, end=12, first_step=2, last_step=10, completed=True)
    hangs_at_start = Process(start=20, end=200)
    series = merge_series(first, hangs_at_start, minutes=200)
    RENDERED["TrainingNeverStarted", "r"] = "Run r (job j) started 11m 0s ago and has not completed a step"
    expected = {
        "18m": quiet(),
        "31m": {"TrainingNeverStarted": [run_labels()], "TrainingStalled": [], "TrainingTargetDown": []},
    }
    assert alerts_at(rules, promtool, tmp_path, series, expected) == ""


def test_a_run_resumed_after_a_clean_end_pages_when_it_stalls(promtool, tmp_path, rules):
    first = Process(start=1, end=12, first_step=2, last_step=10, completed=True)
    stalls = Process(start=20, end=200, first_step=21, last_step=25)
    series = merge_series(first, stalls, minutes=200)
    RENDERED["TrainingStalled", "r"] = "Run r (job j) has made no step for 11m 0s (limit 10 min)"
    expected = {
        "34m": quiet(),
        "36m": {"TrainingStalled": [run_labels()], "TrainingNeverStarted": [], "TrainingTargetDown": []},
    }
    assert alerts_at(rules, promtool, tmp_path, series, expected) == ""


def test_one_of_two_jobs_stalled_pages_for_that_job_alone(promtool, tmp_path, rules):
    healthy = Process("a", "node-a:9500", start=1, end=200, first_step=2, last_step=199)
    stalled = Process("b", "node-b:9500", start=1, end=200, first_step=2, last_step=20)
    series = merge_series(healthy, stalled, minutes=200)
    RENDERED["TrainingStalled", "b"] = "Run b (job j) has made no step for 20m 0s (limit 10 min)"
    expected = {"40m": {"TrainingStalled": [run_labels("b")], "TrainingTargetDown": []}}
    assert alerts_at(rules, promtool, tmp_path, series, expected) == ""


def loss_series(values: str) -> list[dict[str, str]]:
    return [{"series": f'{r.TRAINING_LOSS.full_name}{{run="r",job_id="j"}}', "values": values}]


def test_a_nan_loss_is_numerical_trouble(promtool, tmp_path, rules):
    RENDERED["TrainingLossNotFinite", "r"] = "Run r (job j): the last logged loss is NaN"
    expected = {
        "2m": {"TrainingLossNotFinite": []},
        "3m": {"TrainingLossNotFinite": [run_labels(severity="warning")]},
    }
    assert alerts_at(rules, promtool, tmp_path, loss_series("2.5 2.4 2.3 NaN NaN"), expected) == ""


def test_skipped_steps_are_numerical_trouble(promtool, tmp_path, rules):
    series = [{"series": f'{r.SKIPPED_STEPS.full_name}{{run="r",job_id="j"}}', "values": "0 0 0 2 2 2"}]
    RENDERED["TrainingStepsSkipped", "r"] = (
        "Run r (job j) skipped 2 step(s) in 15 minutes (non-finite loss or gradient norm)"
    )
    expected = {
        "2m": {"TrainingStepsSkipped": []},
        "4m": {"TrainingStepsSkipped": [run_labels(severity="warning")]},
    }
    assert alerts_at(rules, promtool, tmp_path, series, expected) == ""


def test_a_loss_spike_that_lasts_is_numerical_trouble(promtool, tmp_path, rules):
    values = " ".join(["2"] * 30 + ["5"] * 5)
    RENDERED["TrainingLossSpike", "r"] = (
        "Run r (job j): loss 5 is over 1.5x its median of the last 30 minutes"
    )
    expected = {
        "29m": {"TrainingLossSpike": []},
        "33m": {"TrainingLossSpike": [run_labels(severity="warning")]},
    }
    assert alerts_at(rules, promtool, tmp_path, loss_series(values), expected) == ""


def test_a_wrong_expectation_fails(promtool, tmp_path, rules):
    """The harness can fail: expecting silence from a killed run is reported by promtool."""
    series = merge_series(Process(start=1, end=12, first_step=2, last_step=11), minutes=60)
    output = alerts_at(rules, promtool, tmp_path, series, no_pages("40m"))
    assert "TrainingStalled" in output and "TrainingTargetDown" in output
