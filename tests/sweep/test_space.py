"""The sweep YAML: every problem refused before a trial starts, naming the key, the bad value and what would do."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tests.sweep.conftest import TINY, sweep_of
from trainer.sweep.space import SweepError, load_sweep

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(f"recipe: {TINY}\n" + text)
    return path


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("space: {}\n", "space is empty"),
        ("space: {optimizer.lr: {low: 0.1, high: 0.01}}\n", "low = 0.1 is not below high = 0.01"),
        ("space: {optimizer.lr: {low: 0.0, high: 0.01, log: true}}\n", "log = true needs low > 0"),
        ("space: {optimizer.lr: {low: 0.001, high: 0.01, choices: [1]}}\n", "either choices or low/high"),
        ("space: {optimizer.lr: {high: 0.01}}\n", "give low and high"),
        ("space: {optimizer.lr: {choices: []}}\n", "choices is empty"),
        ("space: {schedule.lr_warmup_iters: {low: 0.5, high: 4, step: 1}}\n", "must be whole numbers"),
        ("space: {optimizer.lrr: {low: 0.001, high: 0.01}}\n", "did you mean 'optimizer.lr'"),
        # tiny.yaml's min_lr is 1e-4: an lr range reaching below it is refused by the trainer's own check
        (
            "space: {optimizer.lr: {low: 1.0e-5, high: 0.01, log: true}}\n",
            "space.optimizer.lr = 1e-05: optimizer",
        ),
        (
            "set: {optimizer.lr: 0.01}\nspace: {optimizer.lr: {low: 0.001, high: 0.01}}\n",
            "optimizer.lr in both set and space",
        ),
        ("trials: 0\nspace: {optimizer.lr: {low: 0.001, high: 0.01}}\n", "trials = 0"),
        ("pruner: {kind: asha}\nspace: {optimizer.lr: {low: 0.001, high: 0.01}}\n", "pruner.kind = 'asha'"),
        (
            "space: {optimizer.lr: {low: 0.001, high: 0.01}}\nsampler: {kind: bayes}\n",
            "sampler.kind = 'bayes'",
        ),
        (
            "sampler: {kind: grid}\nspace: {optimizer.lr: {low: 0.001, high: 0.01}}\n",
            "sampler.kind = grid needs choices for every dimension; optimizer.lr is a range",
        ),
        # a space every trial would fail on, or a pruner that cannot prune
        (
            "space: {schedule.lr_warmup_iters: {low: 0, high: 4.5}}\n",
            "space.schedule.lr_warmup_iters.high = 4.5: schedule.lr_warmup_iters is an integer in the trainer's "
            "config; give whole numbers for low and high",
        ),
        # tiny.yaml: micro_batch_size 2 on one process; 9 is no multiple of it
        (
            "space: {schedule.global_batch_size: {choices: [8, 9]}}\n",
            "space.schedule.global_batch_size = 9: schedule.global_batch_size = 9 is not divisible by "
            "schedule.micro_batch_size x data parallel size = 2 x 1 (a trial's 1 cpu process(es))",
        ),
        (
            "pruner: {min_resource: 20}\nset: {schedule.eval_interval: 5}\n"
            "space: {optimizer.lr: {low: 0.001, high: 0.01}}\n",
            "pruner.min_resource = 20 is not below the trials' schedule.train_iters = 20: no trial could be stopped",
        ),
        # a pruner that would judge trials while a warm-up still ramps (issue 48)
        (
            "pruner: {min_resource: 5}\nset: {schedule.eval_interval: 5}\n"
            "space: {schedule.lr_warmup_iters: {low: 0, high: 10}}\n",
            "pruner.min_resource = 5 would judge trials before their warm-up has ended (the longest, "
            "schedule.lr_warmup_iters, is 10 steps): give min_resource >= 10",
        ),
        # judged past each trial's own warm-up: the longest warm-up plus min_resource must leave a rung to judge at
        (
            "pruner: {min_resource: 10, progress: past_warmup}\nset: {schedule.eval_interval: 5}\n"
            "space: {schedule.lr_warmup_iters: {low: 0, high: 10}}\n",
            "pruner.min_resource = 10 steps past the longest warm-up (schedule.lr_warmup_iters up to 10) first "
            "falls on the evaluation at step 20, not before the trials' schedule.train_iters = 20: those trials "
            "could never be stopped; give min_resource <= 5",
        ),
        # ... and judged at an evaluation before the end, not at min_resource itself: evaluations every 30 of 60
        (
            "pruner: {min_resource: 15, progress: past_warmup}\n"
            "set: {schedule.eval_interval: 30, schedule.train_iters: 60, schedule.lr_decay_iters: 60}\n"
            "space: {schedule.lr_warmup_iters: {low: 0, high: 20}}\n",
            "pruner.min_resource = 15 steps past the longest warm-up (schedule.lr_warmup_iters up to 20) first falls "
            "on the evaluation at step 60, not before the trials' schedule.train_iters = 60: those trials could "
            "never be stopped; give min_resource <= 10",
        ),
        # counted in steps too, a trial is judged at its first evaluation at or past min_resource, which must come
        # before the run's end (a stop there is ignored): evaluations every 15 of 20 put min_resource 10 on step 15
        # and min_resource 16 on the run's end (20)
        (
            "pruner: {min_resource: 16}\nset: {schedule.eval_interval: 15}\n"
            "space: {optimizer.lr: {low: 0.001, high: 0.01}}\n",
            "pruner.min_resource = 16 first falls on the evaluation at step 20 (schedule.eval_interval = 15), not "
            "before the trials' schedule.train_iters = 20: no trial could be stopped; give min_resource <= 15",
        ),
        (
            "pruner: {kind: none, progress: past_warmup}\nspace: {optimizer.lr: {low: 0.001, high: 0.01}}\n",
            "pruner.progress = past_warmup needs pruner.kind: successive_halving (it is none)",
        ),
        # only successive halving compares trials whose evaluations fall at different steps past their warm-ups
        (
            "pruner: {kind: median, min_resource: 2, progress: past_warmup}\nset: {schedule.eval_interval: 5}\n"
            "space: {optimizer.lr: {low: 0.001, high: 0.01}}\n",
            "pruner.progress = past_warmup needs pruner.kind: successive_halving (it is median)",
        ),
        # trial 0 is the recipe's own values (tiny.yaml: lr 1e-3, warm-up 2): they must lie in the space
        (
            "space: {optimizer.lr: {low: 0.002, high: 0.01}}\n",
            "space.optimizer.lr: the recipe's own value 0.001 is outside the space (low 0.002, high 0.01)",
        ),
        (
            "pruner: {kind: none}\nspace: {schedule.global_batch_size: {choices: [4, 16]}}\n",
            "space.schedule.global_batch_size: the recipe's own value 8 is outside the space (choices [4, 16])",
        ),
        (
            "pruner: {kind: none}\nbaseline: {schedule.global_batch_size: 12}\n"
            "space: {schedule.global_batch_size: {choices: [4, 16]}}\n",
            "space.schedule.global_batch_size: baseline 12 is outside the space (choices [4, 16])",
        ),
        (
            "baseline: {optimizer.min_lr: 0.001}\nspace: {optimizer.lr: {low: 0.001, high: 0.01}}\n",
            "baseline names optimizer.min_lr, not in space",
        ),
        (
            "pruner: {kind: median}\nspace: {optimizer.lr: {low: 0.001, high: 0.01}}\n",
            "schedule.eval_interval = 1000 is not below the trials' schedule.train_iters = 20: a trial reports a "
            "validation loss only at its end, so pruner.kind = median has nothing to stop on",
        ),
    ],
)
def test_a_bad_sweep_is_refused_with_the_key_and_value(tmp_path, body, message):
    with pytest.raises(SweepError, match="invalid sweep") as error:
        load_sweep(write(tmp_path, body))
    assert message in str(error.value)


def test_a_first_rung_on_an_evaluation_before_the_runs_end_is_accepted(tmp_path):
    """The refusal above stops where a trial can be judged: min_resource 15 falls on step 15's evaluation of 20."""
    body = (
        "pruner: {min_resource: 15}\nset: {schedule.eval_interval: 15}\n"
        "space: {optimizer.lr: {low: 0.001, high: 0.01}}\n"
    )
    assert load_sweep(write(tmp_path, body)).spec.pruner.min_resource == 15


def test_a_missing_file_or_recipe_is_named(tmp_path):
    with pytest.raises(SweepError, match=r"sweep file .* not found"):
        load_sweep(tmp_path / "none.yaml")
    path = tmp_path / "s.yaml"
    path.write_text("recipe: nowhere.yaml\nspace: {optimizer.lr: {low: 0.001, high: 0.01}}\n")
    with pytest.raises(SweepError, match=r"recipe = 'nowhere\.yaml': no such file beside"):
        load_sweep(path)


def test_dimensions_become_optunas_distributions_and_overrides_the_trainers_set_lines(tmp_path):
    sweep = sweep_of(
        tmp_path,
        extra="  schedule.lr_warmup_iters: {low: 0, high: 10, step: 2}\n"
        "  schedule.global_batch_size: {choices: [8, 16]}\n",
    )
    assert sweep.spec.distributions() == {
        "optimizer.lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True),
        "schedule.lr_warmup_iters": optuna.distributions.IntDistribution(0, 10, step=2),
        "schedule.global_batch_size": optuna.distributions.CategoricalDistribution([8, 16]),
    }
    assert sweep.overrides({"optimizer.lr": 0.003, "schedule.global_batch_size": 16}) == [
        "schedule.train_iters=60",
        "schedule.lr_decay_iters=60",
        "schedule.eval_interval=10",
        "optimizer.lr=0.003",
        "schedule.global_batch_size=16",
    ]


def test_the_fingerprint_changes_with_the_space_or_the_shape_but_not_the_trial_count(tmp_path):
    base = sweep_of(tmp_path)
    assert load_sweep(base.path, ("schedule.eval_iters=3",)).fingerprint != base.fingerprint
    (tmp_path / "other").mkdir()
    assert sweep_of(tmp_path / "other", pruner="median").fingerprint != base.fingerprint
    path = base.path
    path.write_text(path.read_text().replace("trials: 8", "trials: 20"))
    assert load_sweep(path).fingerprint == base.fingerprint


def test_the_shipped_sweep_reads():
    sweep = load_sweep(ROOT / "trainer" / "configs" / "local-sweep.yaml")
    assert sweep.recipe == ROOT / "trainer" / "configs" / "local.yaml"
    assert set(sweep.spec.space) == {
        "optimizer.lr",
        "optimizer.min_lr",
        "optimizer.weight_decay",
        "schedule.lr_warmup_iters",
    }  # no global batch size: a step of a wider batch costs more than the trial-step budget counts
    assert sweep.spec.pruner.min_resource == 30 and sweep.spec.pruner.progress == "step"


@pytest.mark.parametrize(
    ("dimension", "distribution"),
    [
        ("schedule.lr_warmup_iters: {low: 0, high: 10}", optuna.distributions.IntDistribution(0, 10)),
        (
            "schedule.global_batch_size: {low: 8, high: 64, log: true}",
            optuna.distributions.IntDistribution(8, 64, log=True),
        ),
    ],
)
def test_a_range_over_an_integer_key_draws_integers(tmp_path, dimension, distribution):
    sweep = sweep_of(tmp_path, extra=f"  {dimension}\n")
    key = dimension.split(":")[0]
    assert sweep.spec.distributions()[key] == distribution


def test_a_stack_sweep_is_checked_at_the_nodes_world_not_this_machines(tmp_path):
    """Sequence parallelism runs on GPUs only (trainer/config/checks.py): a stack sweep submitted from a machine
    without one is checked at its trials' world, a node's 8 GPUs, not refused for this machine's CPU."""
    body = (
        "pruner: {kind: none}\n"
        "set: {parallel.tensor_model_parallel_size: 2, parallel.sequence_parallel: true}\n"
        "space: {optimizer.lr: {low: 0.001, high: 0.01}}\n"
    )
    with pytest.raises(SweepError, match=r"parallel\.sequence_parallel = true cannot run on CPU"):
        load_sweep(write(tmp_path, body), world=(4, "cpu"))
    assert load_sweep(write(tmp_path, body), world=(8, "cuda")).spec.space
