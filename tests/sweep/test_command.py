"""`python -m trainer sweep` end to end: real trainer runs (two tiny trials on one process each, trial 0 the recipe's
values), each finished one scored on the held-out windows by `trainer score`, the stored study resumed, the verdict
against the recipe (the best re-run on one more seed), the report written and the returned configuration's
checkpoint registered as a model version's tag."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from trainer.config import load_config


@pytest.mark.slow
def test_a_sweep_of_real_trainer_runs_resumes_reports_and_registers_the_best(tiny_config, tmp_path):
    sweep = tmp_path / "tiny-sweep.yaml"
    sweep.write_text(
        f"recipe: {tiny_config}\n"
        "trials: 1\n"
        "sampler: {seed: 0, startup_trials: 2}\n"
        "pruner: {kind: none}\n"
        "evaluation: {sequences: 8, seeds: 1}\n"
        "set: {schedule.train_iters: 10, schedule.eval_interval: 5, checkpoint.save_interval: 10}\n"
        "space:\n"
        "  optimizer.lr: {low: 1.0e-3, high: 1.0e-2, log: true}\n"
    )
    runs = tmp_path / "runs"

    def sweep_command(*extra: str) -> subprocess.CompletedProcess:
        command = [
            sys.executable,
            "-m",
            "trainer",
            "sweep",
            "--sweep",
            str(sweep),
            "--runs",
            str(runs),
            *extra,
        ]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1200)

    first = sweep_command()
    assert first.returncode == 0, first.stdout + first.stderr
    # one trial: the recipe's own values (tiny.yaml's lr 1e-3), nothing to beat it
    assert "trial 0: lr=0.001" in first.stdout
    assert "no trial beat the recipe: its own values (trial 0) scored best" in first.stdout
    second = sweep_command("--trials", "2", "--register", "sweep-best")  # resumes: one more trial
    assert second.returncode == 0, second.stdout + second.stderr
    assert "1 of 2 trials finished, running 1" in second.stdout
    directory = runs / "sweeps" / "tiny-sweep"
    windows = json.loads((directory / "heldout.json").read_text())
    assert len(windows) == 8 and {len(w) for w in windows} == {33}  # tiny.yaml's seq_length 32, + 1
    for trial in ("0000", "0001"):
        metrics = [json.loads(line) for line in (directory / "trials" / trial / "metrics.jsonl").open()]
        assert [r["step"] for r in metrics if r.get("val_loss") is not None] == [0, 5, 10]
        score = json.loads((directory / "trials" / trial / "score.log").read_text().splitlines()[0])
        assert len(score["sequence_losses"]) == 8 and score["tokens"] == 8 * 32
    verdict = json.loads((directory / "verdict.json").read_text())
    assert verdict["summary"] in second.stdout
    best = load_config(directory / "best.yaml")
    assert best.schedule.train_iters == 10 and best.optimizer.lr == verdict["winner"]["optimizer.lr"]
    assert f"--set optimizer.lr={best.optimizer.lr!r}" in (directory / "best.set").read_text()
    if verdict["best_trial"] != 0:  # the best and the recipe's values were trained again on seed 8
        assert verdict["seeds"] == [7, 8] and len(verdict["best_losses"]) == 2
        assert (directory / "confirm" / "best-seed8" / "result.json").is_file()
    assert "tag sweep-best -> tiny-sweep-t000" in second.stdout
    shown = subprocess.run(
        [sys.executable, "-m", "trainer", "models", "show", "sweep-best", "--dir", str(runs), "--format", "json"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    version = json.loads(shown.stdout)
    assert version["config"]["optimizer"]["lr"] == best.optimizer.lr and version["step"] == 10
