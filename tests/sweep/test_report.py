"""What a sweep leaves for people: the table, the plots and the best trial's config."""

from __future__ import annotations

import re

import yaml
from rich.console import Console

from trainer.config import load_config
from trainer.sweep.report import (
    BEST_SET,
    BEST_YAML,
    best_trial,
    failures,
    trials_table,
    write_best,
    write_plots,
)


def test_the_table_has_a_row_per_trial_with_the_best_marked(finished_sweep):
    sweep, study, _ = finished_sweep
    console = Console(record=True, width=200)
    console.print(trials_table(study, sweep))
    text = console.export_text()
    best = best_trial(study)
    assert text.count("pruned") == len([t for t in study.get_trials() if t.state.name == "PRUNED"])
    assert re.search(rf"\b{best.number} +complete \(best\) +{best.value:.4f}", text)
    assert failures(study) == []


def test_the_best_trial_is_written_as_set_lines_and_a_config_the_trainer_reads(finished_sweep, tmp_path):
    sweep, study, _ = finished_sweep
    best = best_trial(study)
    set_file, config_file = write_best(study, sweep, tmp_path)
    assert (set_file.name, config_file.name) == (BEST_SET, BEST_YAML)
    assert set_file.read_text() == f"--set optimizer.lr={best.params['optimizer.lr']!r}\n"
    cfg = load_config(config_file)
    assert cfg.optimizer.lr == best.params["optimizer.lr"] and cfg.schedule.train_iters == 60
    assert cfg.name == "tiny-best"
    assert f"validation loss {best.value:.4f}" in config_file.read_text().splitlines()[0]
    assert yaml.safe_load(config_file.read_text())["schedule"]["lr_decay_iters"] == 60


def test_the_plots_are_pngs(finished_sweep, tmp_path):
    _, study, _ = finished_sweep
    paths = write_plots(study, tmp_path)
    assert sorted(p.name for p in paths) == [
        "history.png",
        "importances.png",
        "intermediate.png",
        "parallel-coordinates.png",
    ]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
