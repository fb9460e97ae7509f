"""`evaluation.suite` during training: a run evaluates its checkpoints in a process of its own and logs the figures
to metrics.jsonl and TensorBoard, equal to `evaluate` on the same checkpoint; the task-labelled metrics reach a real
Prometheus exposition and a valid CloudWatch EMF line; bad settings are refused before training starts."""

import io
import json
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import free_port
from tests.monitoring.test_cloudwatch import spec_problems
from trainer.config import load_config
from trainer.contract import metrics as r
from trainer.evaluation.suite import evaluation_problems
from trainer.monitoring import exporters
from trainer.monitoring.cloudwatch import EmfWriter
from trainer.monitoring.prometheus import PrometheusExporter

LABELS = {"run": "local", "job_id": "local", "node": "laptop", "rank": "0", "stage": "1"}


@pytest.fixture
def suite(tmp_path, tiny_corpus):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "import ", "reference": "email"}\n{"prompt": "def ", "reference": "x"}\n')
    path = tmp_path / "suite.yaml"
    path.write_text(
        f"perplexity:\n  - {{name: heldout, data: {tiny_corpus}, samples: 3}}\n"
        f"generation:\n  - {{name: names, file: {tasks}, max_new_tokens: 4, stop: ['\\n']}}\n"
    )
    return path


@pytest.mark.slow
def test_a_run_logs_each_checkpoints_evaluation_equal_to_evaluate_on_it(
    tiny_config, suite, launcher, tmp_path
):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = launcher.base / "evaluated" / "run"
    settings = [f"logging.run_dir={run_dir}", "schedule.train_iters=4", "checkpoint.save_interval=2"]
    settings += ["checkpoint.keep_last=3", f"evaluation.suite={suite}", "logging.tensorboard=true"]
    command = [sys.executable, "-m", "trainer", "train", "--config", str(tiny_config), "--nproc", "1"]
    launcher.run("evaluated", command + [arg for s in settings for arg in ("--set", s)])

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evaluations = [record["evaluation"] for record in records if "evaluation" in record]
    assert [e["checkpoint"] for e in evaluations] == [
        str(run_dir / "checkpoints" / "iter_0000002"),
        str(run_dir / "checkpoints" / "iter_0000004"),
    ]
    again = launcher.run(
        "evaluate-step-4",
        [sys.executable, "-m", "trainer", "evaluate", "--checkpoint", evaluations[-1]["checkpoint"],
         "--suite", str(suite), "--tokenizer", str(load_config(tiny_config).data.tokenizer_path), "--format", "json"],
    )  # fmt: skip
    alone = json.loads(next(line for line in again.splitlines() if line.startswith("{")))
    assert evaluations[-1] == alone
    assert evaluations[0]["perplexity"]["heldout"]["loss"] > evaluations[1]["perplexity"]["heldout"]["loss"]

    events = EventAccumulator(str(run_dir / "tensorboard")).Reload()
    perplexities = [event.value for event in events.Scalars("evaluation/heldout/perplexity")]
    assert perplexities == pytest.approx([e["perplexity"]["heldout"]["perplexity"] for e in evaluations])
    assert "evaluation/names/exact_match" in events.Tags()["scalars"]


def test_task_metrics_are_served_with_a_task_label():
    exporter = PrometheusExporter(LABELS, None)
    port = free_port()
    exporter.serve(port, "127.0.0.1")
    try:
        monitor = exporters.Monitor(LABELS, prometheus=exporter)
        monitor.record_task(r.EVALUATION_PERPLEXITY, "heldout", 41.5)
        monitor.record_task(r.EVALUATION_PERPLEXITY, "other", 12.0)
        monitor.record_task(r.EVALUATION_EXACT_MATCH, "names", 0.5)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        exporter.close()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    samples = {s.labels["task"]: s.value for s in families["trainstack_evaluation_perplexity"].samples}
    assert samples == {"heldout": 41.5, "other": 12.0}
    [match] = families["trainstack_evaluation_exact_match_ratio"].samples
    assert match.labels == {"run": "local", "job_id": "local", "task": "names"} and match.value == 0.5


def test_task_metrics_go_to_cloudwatch_with_a_task_dimension_in_a_valid_emf_line():
    out = io.StringIO()
    writer = EmfWriter({"JobQueue": "q", "Run": "r", "Rank": "0", "Node": "n"}, interval_s=60, stream=out)
    exporters.Monitor(LABELS, cloudwatch=writer).record_task(r.EVALUATION_EXACT_MATCH, "names", 0.25)
    [line] = out.getvalue().splitlines()
    assert spec_problems(line) == []
    document = json.loads(line)
    assert document["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["JobQueue", "Run", "Task"]]
    assert (document["Task"], document["Run"], document["EvaluationExactMatch"]) == ("names", "r", 0.25)


def test_evaluation_settings_are_checked_before_training(tiny_config, suite, tmp_path):
    def problems(*overrides: str) -> list[str]:
        return evaluation_problems(load_config(tiny_config, list(overrides)))

    assert problems() == []
    assert problems(f"evaluation.suite={suite}", "checkpoint.save_interval=5", "evaluation.interval=10") == []
    assert problems(f"evaluation.suite={suite}", "checkpoint.save_interval=5", "evaluation.interval=7") == [
        "evaluation.interval = 7: evaluation runs on a saved checkpoint, so give a multiple of "
        "checkpoint.save_interval (5), or leave it unset to evaluate at every save"
    ]
    assert problems("evaluation.interval=10") == [
        "evaluation.interval is set but evaluation.suite is not: give both"
    ]
    [problem] = problems(f"evaluation.suite={tmp_path / 'missing.yaml'}")
    assert problem.startswith("evaluation.suite = ") and "no such file" in problem
