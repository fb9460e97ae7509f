"""A resume under a changed LR schedule: refused without the flag (docs/bad-inputs.md rows
checkpoint-resume-with-another-schedule, checkpoint-load-with-another-data-split), applied honestly with
--allow-schedule-change: the steps after the resume run at the new schedule's learning rates, from the
checkpoint's step on."""

import pytest
import torch

from tests.trainer.test_resilience import Training, _completed
from trainer.config import load_config
from trainer.distributed.optimizer import build_scheduler

pytestmark = pytest.mark.slow


def scheduled_lrs(config, overrides: list[str], steps: range) -> dict[int, float]:
    """The LR each step applies under a config, by megatron's own scheduler as the trainer builds it."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    scheduler = build_scheduler(load_config(config, overrides), optimizer)
    lrs = {}
    for step in range(1, steps.stop):
        if step in steps:
            lrs[step] = optimizer.param_groups[0]["lr"]
        scheduler.step(increment=1)
    return lrs


def test_allowed_schedule_change_takes_effect_from_the_checkpoints_step(tmp_path, tiny_config):
    first = ("schedule.train_iters=4", "checkpoint.save_interval=4")
    _completed(Training(tmp_path, "run", tiny_config, *first))
    changed = ["schedule.train_iters=8", "optimizer.lr=0.002", "schedule.lr_decay_iters=8"]
    resumed = Training(tmp_path, "run", tiny_config, *changed, options=("--allow-schedule-change",))
    output = _completed(resumed)
    assert "resumed from" in output and "(step 4" in output
    logged = {r["step"]: r["lr"] for r in resumed.records() if r["lr"] is not None}
    new = scheduled_lrs(tiny_config, changed, range(5, 9))
    old = scheduled_lrs(tiny_config, list(first), range(1, 5))
    assert {step: logged[step] for step in range(1, 5)} == pytest.approx(
        old
    )  # before the resume: the old one
    assert {step: logged[step] for step in range(5, 9)} == pytest.approx(new, rel=1e-6)
    kept = scheduled_lrs(tiny_config, list(first), range(5, 9))  # what the checkpoint's schedule gives
    assert all(abs(new[step] - kept[step]) > 1e-5 for step in range(5, 9))
