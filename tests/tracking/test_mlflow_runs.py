"""A run directory logged to a real local MLflow store (SQLite, MLflow's own SQLAlchemy store) and read back with
MLflow's client; and the sweep's trials logged the same way."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient
from rich.console import Console

from tests.sweep.conftest import objective_sweep, quiet, sweep_of
from trainer.sweep.tracking import trial_tracker
from trainer.tracking.mlflow_runs import (
    MODEL_VERSION_TAG,
    RUN_DIR_TAG,
    RUN_KEY_TAG,
    experiment_for,
    flatten,
    log_run,
    run_key,
)


def metrics_lines(run_dir, steps):
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "metrics.jsonl").open("a") as metrics:
        for step in steps:
            record = {
                "step": step,
                "loss": 9.0 - step / 10,
                "lr": None,
                "grad_norm": float("nan"),
                "mfu": None,
            }
            if step % 10 == 0:
                record["val_loss"] = 9.5 - step / 10
            metrics.write(json.dumps(record) + "\n")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


def test_a_run_logs_its_config_metrics_and_once_more_only_the_new_steps(tmp_path, store):
    run_dir = tmp_path / "run"
    metrics_lines(run_dir, range(0, 11))
    params = flatten(
        {"optimizer": {"lr": 0.003, "min_lr": 0.0003}, "data": {"prefixes": ["data/stdlib"]}, "x": {}}
    )
    assert params == {
        "optimizer.lr": "0.003",
        "optimizer.min_lr": "0.0003",
        "data.prefixes": '["data/stdlib"]',
        "x": "{}",
    }
    run_id = log_run(run_dir, uri=store, experiment="e", run_name="local", params=params, tags={"k": "v"})
    metrics_lines(run_dir, range(11, 21))  # the run resumed and trained on
    assert log_run(run_dir, uri=store, experiment="e", run_name="local", params=params) == run_id
    client = MlflowClient(tracking_uri=store)
    run = client.get_run(run_id)
    assert run.data.params == params and run.data.tags["k"] == "v"
    assert run.data.tags[RUN_DIR_TAG] == str(run_dir.resolve()) and run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "val_loss")] == [
        (0, 9.5), (10, 8.5), (20, 7.5)
    ]  # fmt: skip
    assert len(client.get_metric_history(run_id, "loss")) == 21  # each step once
    assert (
        "grad_norm" not in run.data.metrics and "lr" not in run.data.metrics
    )  # nan and null are not numbers
    assert MODEL_VERSION_TAG not in run.data.tags  # it published no checkpoint


@pytest.mark.parametrize("name", ["it's", 'say "hi"', """it's "both\""""])
def test_a_run_directory_with_quotes_in_its_path_is_found_again(tmp_path, store, name):
    run_dir = tmp_path / name / "run"
    metrics_lines(run_dir, range(0, 6))
    run_id = log_run(run_dir, uri=store, experiment="quotes", run_name="q", params={"a": "1"})
    metrics_lines(run_dir, range(6, 11))
    assert log_run(run_dir, uri=store, experiment="quotes", run_name="q", params={"a": "1"}) == run_id
    client = MlflowClient(tracking_uri=store)
    run = client.get_run(run_id)
    assert run.data.tags[RUN_DIR_TAG] == str(run_dir.resolve())  # still readable
    assert len(client.get_metric_history(run_id, "loss")) == 11  # one run, each step once


def test_a_run_logged_before_the_key_tag_is_found_by_its_path_and_gets_the_key(tmp_path, store):
    run_dir = tmp_path / "old"
    metrics_lines(run_dir, range(0, 3))
    client = MlflowClient(tracking_uri=store)
    experiment_id = client.create_experiment("legacy")
    path, key = run_key(run_dir)
    old = client.create_run(experiment_id, tags={RUN_DIR_TAG: path}).info.run_id  # as logged before
    assert log_run(run_dir, uri=store, experiment="legacy", run_name="old", params={}) == old
    assert client.get_run(old).data.tags[RUN_KEY_TAG] == key


def test_a_sweeps_trials_are_runs_of_its_experiment_with_their_state(tmp_path, store):
    sweep = sweep_of(tmp_path)
    track = trial_tracker(sweep, "tracked", store, quiet())
    study = objective_sweep(sweep, "tracked", tmp_path / "s", 4, on_trial=track)
    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("tracked")
    runs = {r.data.tags["trial"]: r for r in client.search_runs([experiment.experiment_id])}
    assert sorted(runs) == [str(t.number) for t in study.get_trials()]
    for trial in study.get_trials():
        run = runs[str(trial.number)]
        assert run.data.tags["state"] == trial.state.name.lower() and run.data.tags["sweep"] == "tracked"
        assert float(run.data.params["optimizer.lr"]) == trial.params["optimizer.lr"]
        assert run.data.params["schedule.train_iters"] == "60"  # the whole config: recipe, shape, parameters
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")]
        assert steps[-1] == trial.user_attrs["steps"]


def test_a_trial_logged_by_the_trainer_and_by_the_sweep_is_one_run_in_the_sweeps_experiment(tmp_path):
    from trainer.config import load_config
    from trainer.loop import _track

    store = f"sqlite:///{tmp_path}/mlflow.db"
    sweep = sweep_of(tmp_path)
    track = trial_tracker(sweep, "both", store, quiet())

    def trainer_then_sweep(trial):
        """What happens to a trial with `--set tracking.mlflow=true` in a sweep with --mlflow: the trainer logs
        itself when it ends (trainer/train.py _track, with the name and directory the sweep gives it), then the
        sweep logs the decided trial."""
        run_dir = trial.user_attrs["run_dir"]
        sets = [
            *sweep.overrides(trial.params),
            f"name=both-t{trial.number:04d}",
            f"logging.run_dir={run_dir}",
        ]
        sets += ["tracking.mlflow=true", f"tracking.uri={store}"]
        _track(load_config(sweep.recipe, sets), quiet())
        track(trial)

    study = objective_sweep(sweep, "both", tmp_path / "s", 3, on_trial=trainer_then_sweep)
    client = MlflowClient(tracking_uri=store)
    assert {e.name for e in client.search_experiments()} == {"both", "Default"}  # not one per trial
    runs = client.search_runs([client.get_experiment_by_name("both").experiment_id])
    assert sorted(r.data.tags["trial"] for r in runs) == ["0", "1", "2"]  # one MLflow run per trial
    assert len(study.get_trials()) == 3
    for run in runs:
        assert run.data.params["model.hidden_size"] == "32"  # the trainer's resolved config, the sweep's tags
        assert run.info.run_name == f"both-t{int(run.data.tags['trial']):04d}"


def test_the_experiment_is_the_given_one_else_a_trials_sweep_else_the_runs_name(tmp_path):
    from trainer.config.schema import TrackingConfig

    trial_dir = tmp_path / "sweeps" / "lr" / "trials" / "0007"
    assert experiment_for(TrackingConfig(), "lr-t0007", trial_dir) == "lr"
    assert experiment_for(TrackingConfig(experiment="mine"), "lr-t0007", trial_dir) == "mine"
    assert experiment_for(TrackingConfig(), "local", tmp_path / "runs" / "local") == "local"
    assert experiment_for(TrackingConfig(), "lr-t0008", trial_dir) == "lr-t0008"  # not this directory's trial
    assert (
        experiment_for(TrackingConfig(), "lr-t0007", tmp_path / "x" / "0007") == "lr-t0007"
    )  # not a trial's


def test_a_store_that_cannot_work_is_a_warning_per_trial_and_the_sweep_goes_on(tmp_path):
    (tmp_path / "a-file").write_text("not a directory")
    uri = f"sqlite:///{tmp_path}/a-file/mlflow.db"  # its directory is a file
    console = Console(record=True, width=400)
    track = trial_tracker(sweep_of(tmp_path), "unstored", uri, console)
    study = objective_sweep(sweep_of(tmp_path), "unstored", tmp_path / "s", 3, on_trial=track)
    assert len(study.get_trials()) == 3  # every trial ran
    warnings = [line for line in console.export_text().splitlines() if "tracking:" in line]
    assert [line.split(":")[1].split()[1] for line in warnings] == ["0", "1", "2"]  # one per trial
    assert all(f"not logged to {uri}" in line and "Error" in line for line in warnings)


@pytest.mark.slow
def test_a_trainer_run_with_tracking_logs_itself_with_its_model_version(tiny_config, tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    store = f"sqlite:///{tmp_path}/mlflow.db"
    run_dir = tmp_path / "run"
    sets = [
        "schedule.train_iters=4", "checkpoint.save_interval=4", f"logging.run_dir={run_dir}",
        "tracking.mlflow=true", f"tracking.uri={store}", "tracking.experiment=tiny",
    ]  # fmt: skip
    command = [sys.executable, "-m", "trainer", "train", "--config", str(tiny_config)]
    done = subprocess.run(
        [*command, *(arg for s in sets for arg in ("--set", s))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert run.data.params["schedule.train_iters"] == "4" and run.data.params["model.hidden_size"] == "32"
    assert run.data.tags[MODEL_VERSION_TAG].startswith("tiny-s4-")
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3, 4]
    assert f"tracking: MLflow run {run.info.run_id}" in done.stderr + done.stdout
