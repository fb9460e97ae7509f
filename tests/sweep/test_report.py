"""What a sweep leaves for people: the table, the plots and the configuration it returns."""

from __future__ import annotations

import re

import yaml
from rich.console import Console

from tests.sweep.conftest import objective_command, objective_evaluate, objective_sweep, quiet, sweep_of
from trainer.config import load_config
from trainer.sweep.confirm import confirm
from trainer.sweep.report import (
    BEST_SET,
    BEST_YAML,
    MIN_IMPORTANCE_TRIALS,
    _history,
    best_trial,
    failures,
    trials_table,
    write_best,
    write_plots,
)


def test_the_table_has_a_row_per_trial_with_the_best_and_the_recipe_marked(finished_sweep):
    sweep, study, _ = finished_sweep
    console = Console(record=True, width=200)
    console.print(trials_table(study, sweep))
    text = console.export_text()
    best = best_trial(study)
    assert text.count("pruned") == len([t for t in study.get_trials() if t.state.name == "PRUNED"])
    assert re.search(rf"\b{best.number} +complete \(best\)", text)
    assert re.search(r"\b0 +complete( \(best\))? \(recipe\)", text)
    assert failures(study) == []


def test_the_returned_config_is_written_as_set_lines_and_a_config_the_trainer_reads(finished_sweep, tmp_path):
    sweep, study, directory = finished_sweep
    verdict = confirm(study, sweep, directory, quiet(), objective_evaluate, objective_command())
    assert verdict.beat  # tiny.yaml's lr 1e-3 is far from the objective's best, 10^-2.5
    lr = verdict.winner["optimizer.lr"]
    assert lr == best_trial(study).params["optimizer.lr"]
    set_file, config_file = write_best(study, sweep, tmp_path, verdict)
    assert (set_file.name, config_file.name) == (BEST_SET, BEST_YAML)
    assert set_file.read_text() == f"--set optimizer.lr={lr!r}\n"
    cfg = load_config(config_file)
    assert cfg.optimizer.lr == lr and cfg.schedule.train_iters == 60
    assert cfg.name == "tiny-best"
    assert verdict.summary in config_file.read_text().splitlines()[0]
    assert yaml.safe_load(config_file.read_text())["schedule"]["lr_decay_iters"] == 60


def test_the_history_shows_pruned_trials_at_their_last_value_and_importances_wait_for_enough_trials(
    finished_sweep, tmp_path
):
    _, study, _ = finished_sweep
    paths, left_out = write_plots(study, tmp_path)
    complete = [t for t in study.get_trials() if t.state.name == "COMPLETE"]
    assert len(complete) < MIN_IMPORTANCE_TRIALS
    assert sorted(p.name for p in paths) == ["history.png", "intermediate.png", "parallel-coordinates.png"]
    assert left_out == [
        f"importances.png left out: {len(complete)} complete trial(s), {MIN_IMPORTANCE_TRIALS} needed for "
        "importances that are not one trial's noise"
    ]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    axes = _history(study)
    dots, crosses = (collection.get_offsets().tolist() for collection in axes.collections[:2])
    assert dots == [[t.number, t.value] for t in complete]
    pruned = [t for t in study.get_trials() if t.state.name == "PRUNED"]
    assert pruned and crosses == [
        [t.number, t.intermediate_values[max(t.intermediate_values)]] for t in pruned
    ]
    assert (axes.get_xlabel(), axes.get_ylabel()) == ("trial", "validation loss (nats per token)")


def test_importances_are_drawn_from_enough_complete_trials(tmp_path):
    sweep = sweep_of(tmp_path, pruner="none", extra="  optimizer.weight_decay: {low: 0.0, high: 0.2}\n")
    study = objective_sweep(sweep, "many", tmp_path / "s", MIN_IMPORTANCE_TRIALS)  # fmt: skip
    paths, left_out = write_plots(study, tmp_path / "s")
    assert "importances.png" in {p.name for p in paths} and left_out == []


def test_a_trial_pruned_after_several_evaluations_is_drawn_at_its_last_one():
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial

    from trainer.sweep.study import RECIPE

    space = {"optimizer.lr": FloatDistribution(1e-4, 1e-1, log=True)}
    study = optuna.create_study()
    study.add_trial(
        create_trial(params={"optimizer.lr": 1e-3}, distributions=space, value=6.8, user_attrs={RECIPE: True})
    )
    study.add_trial(
        create_trial(
            state=TrialState.PRUNED,
            params={"optimizer.lr": 3e-2},
            distributions=space,
            intermediate_values={10: 8.0, 20: 7.5, 30: 7.2},
        )
    )
    axes = _history(study)
    dots, crosses = (collection.get_offsets().tolist() for collection in axes.collections[:2])
    assert dots == [[0, 6.8]] and crosses == [[1, 7.2]]
    assert [text.get_text() for text in axes.texts] == ["step 30"]
    assert axes.collections[2].get_offsets().tolist() == [[0, 6.8]]  # the recipe's trial, ringed
    # pruner.progress: past_warmup reports steps past each trial's own warm-up: the label says so
    assert [text.get_text() for text in _history(study, "past_warmup").texts] == ["30 past warm-up"]
