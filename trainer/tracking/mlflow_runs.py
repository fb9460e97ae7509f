"""One trainer run directory as one MLflow run, logged when the run ends (or a sweep's trial is decided): the
config as parameters, every numeric metrics.jsonl value by step, and the model version of its newest published
checkpoint as a tag. The run directory is the MLflow run's identity: its resolved path is the `trainstack.run_dir`
tag, for people, and the path's SHA-256 the `trainstack.run_key` tag the run is found by (any path, quotes and all,
is a hex string there). Logging the same directory again, after a resume or from the sweep after the trainer, adds
only the steps not yet logged to the same MLflow run.

The default store is SQLite under runs/ (MLflow's SQLAlchemy store: no server); `tracking.uri` names another, such
as a tracking server on a stack. Imports mlflow only when called."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from trainer.checkpoint.version import RECORD, read_record
from trainer.config.schema import TrackingConfig

DEFAULT_URI = "sqlite:///runs/mlflow.db"
RUN_DIR_TAG = "trainstack.run_dir"
RUN_KEY_TAG = "trainstack.run_key"
MODEL_VERSION_TAG = "trainstack.model_version"
# MLflow's limits per log_batch call and per parameter value (mlflow/utils/validation.py, v3.18.0:
# MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH, MAX_PARAM_VAL_LENGTH).
METRICS_PER_BATCH, PARAMS_PER_BATCH, PARAM_VALUE_LENGTH = 1000, 100, 6000


def tracking_uri(tracking: TrackingConfig) -> str:
    return tracking.uri or DEFAULT_URI


def experiment_for(tracking: TrackingConfig, name: str, run_dir: Path) -> str:
    """The experiment a run logs to: `tracking.experiment`, else the sweep's name for a sweep trial, else the run's
    name. A trial is the run a sweep gives `name=<sweep>-t<NNNN>` and the directory `.../trials/<NNNN>`
    (trainer/sweep/study.py trial_objective), so that the trainer's own log lands in the experiment the sweep's
    --mlflow logs the trial to, as the same MLflow run (one run directory, one run)."""
    if tracking.experiment:
        return tracking.experiment
    number = run_dir.name
    trial = run_dir.parent.name == "trials" and number.isdigit() and name.endswith(f"-t{number}")
    return name.removesuffix(f"-t{number}") if trial and len(name) > len(number) + 2 else name


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as `section.key` parameters (lists and empty mappings as JSON)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat |= flatten(value, name + ".")
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            flat[name] = text[:PARAM_VALUE_LENGTH]
    return flat


def metric_records(run_dir: Path) -> Iterator[tuple[int, str, float]]:
    """(step, key, value) of every finite number on every metrics.jsonl line."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        record = json.loads(line)
        for key, value in record.items():
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if key != "step" and number and math.isfinite(value):
                yield int(record["step"]), key, float(value)


def newest_model_version(run_dir: Path) -> str | None:
    """The model version of the run's newest published checkpoint (its record, trainer/checkpoint/version.py)."""
    records = sorted((run_dir / "checkpoints").glob(f"iter_*/{RECORD}"))
    return read_record(records[-1].parent).version if records else None


def run_key(run_dir: Path) -> tuple[str, str]:
    """The run directory's identity: its resolved path (the readable tag) and that path's SHA-256 (the searched one)."""
    path = str(run_dir.resolve())
    return path, hashlib.sha256(path.encode()).hexdigest()


def _find_run(client: Any, experiment_id: str, path: str, key: str) -> list[Any]:
    """The experiment's MLflow run of this run directory (at most one), by its key tag. A filter's string value is
    cut out of its quotes with nothing in it unescaped (mlflow/utils/search_utils.py SearchUtils._strip_quotes,
    mlflow-skinny 3.18.0), so a path holding both quote characters has no literal: hence the hex key. A run logged
    before the key existed has only the path tag; it is found by that where the path has no `'` (such a path could
    not be logged then) and gets the key."""
    found = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'")
    if found or "'" in path:
        return list(found)
    found = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_DIR_TAG}` = '{path}'")
    if found:
        client.set_tag(found[0].info.run_id, RUN_KEY_TAG, key)
    return list(found)


def log_run(
    run_dir: Path,
    *,
    uri: str,
    experiment: str,
    run_name: str,
    params: Mapping[str, str],
    tags: Mapping[str, str] | None = None,
) -> str:
    """Log (or bring up to date) the MLflow run of `run_dir`; its run id."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    path, key = run_key(run_dir)
    existing = _find_run(client, experiment_id, path, key)
    if existing:
        run_id = existing[0].info.run_id
        logged = existing[0].data.params
        last = max(
            (m.step for k in existing[0].data.metrics for m in client.get_metric_history(run_id, k)),
            default=-1,
        )
    else:
        identity = {RUN_DIR_TAG: path, RUN_KEY_TAG: key}
        run_id = client.create_run(experiment_id, run_name=run_name, tags=identity).info.run_id
        logged, last = {}, -1
    new_params = [Param(k, v) for k, v in params.items() if k not in logged]  # a parameter is set once
    for start in range(0, len(new_params), PARAMS_PER_BATCH):
        client.log_batch(run_id, params=new_params[start : start + PARAMS_PER_BATCH])
    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, step) for step, k, v in metric_records(run_dir) if step > last]
    for start in range(0, len(metrics), METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=metrics[start : start + METRICS_PER_BATCH])
    run_tags = dict(tags or {})
    if (version := newest_model_version(run_dir)) is not None:
        run_tags[MODEL_VERSION_TAG] = version
    if run_tags:
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in run_tags.items()])
    client.set_terminated(run_id)
    return run_id
