"""The checkpoint interval from the failure rate: Young's interval against a simulated run with injected faults."""

from __future__ import annotations

import math
import random

import pytest

from trainer.cost.resilience import (
    INTERRUPTIONS_PER_GPU_HOUR,
    expected_goodput,
    expected_lost_seconds,
    mtbf_seconds,
    recommend,
    young_interval_seconds,
)


def simulate(
    interval_s: float, save_s: float, restart_s: float, mtbf_s: float, work_s: float, seed: int
) -> float:
    """A virtual run of `work_s` seconds of work, saving after every `interval_s` of it; interruptions arrive with
    exponential gaps of mean `mtbf_s` at any moment (in a step, a save or a restart), each losing the work since
    the last completed save and costing a restart. The kept work's share of wall time."""
    rng = random.Random(seed)
    now, kept = 0.0, 0.0
    fault = rng.expovariate(1 / mtbf_s)
    while kept < work_s:
        segment = min(interval_s, work_s - kept)
        if now + segment + save_s <= fault:
            now += segment + save_s
            kept += segment
            continue
        now = fault  # the segment and its save are lost
        while True:  # restart, perhaps interrupted itself
            fault = now + rng.expovariate(1 / mtbf_s)
            if now + restart_s <= fault:
                now += restart_s
                break
            now = fault
    return kept / now


def test_the_rate_is_llama_3s_unexpected_interruptions_per_gpu_hour():
    assert math.isclose(INTERRUPTIONS_PER_GPU_HOUR * 16_384 * 54 * 24, 419)
    # the same job: one interruption about every three hours
    assert mtbf_seconds(16_384) / 3600 == pytest.approx(54 * 24 / 419)


@pytest.mark.parametrize(
    ("gpus", "save_s", "restart_s"),
    [(16_384, 60.0, 600.0), (2_048, 120.0, 900.0), (1_024, 30.0, 600.0)],
)
def test_youngs_interval_is_within_1_percent_of_the_best_goodput_on_a_grid(gpus, save_s, restart_s):
    mtbf = mtbf_seconds(gpus)
    young = young_interval_seconds(save_s, mtbf)
    work = 1500 * mtbf  # about 1500 interruptions a run
    grid = [young * 2 ** (k / 4) for k in range(-14, 15)]  # 1/11 x .. 11 x Young's, 29 intervals
    simulated = {interval: simulate(interval, save_s, restart_s, mtbf, work, seed=7) for interval in grid}
    best = max(simulated.values())
    assert simulated[young] >= 0.99 * best
    # the grid's ends are well below it: the choice matters, and the simulation can tell
    assert max(simulated[grid[0]], simulated[grid[-1]]) < 0.97 * best
    # the model the plan prints agrees with the simulation: within 1 % from 1/4 x to 4 x Young's; beyond, where a
    # segment often outlasts the MTBF and few complete, within the simulation's noise
    for interval, goodput in simulated.items():
        near = young / 4 <= interval <= young * 4
        expected = expected_goodput(interval, save_s, restart_s, mtbf)
        assert expected == pytest.approx(goodput, rel=0.01 if near else 0.03)


def test_the_recommendation_is_a_whole_number_of_steps_and_its_goodput():
    r = recommend(gpus=1_024, save_s=30.0, restart_s=600.0, step_s=4.0)
    assert r.interval_s == pytest.approx(math.sqrt(2 * 30.0 * mtbf_seconds(1_024)))
    assert r.steps == round(r.interval_s / 4.0)
    assert r.goodput == pytest.approx(expected_goodput(r.steps * 4.0, 30.0, 600.0, r.mtbf_s))
    assert "save every" in r.lines()[1] and "Young's" in r.lines()[1]
    assert recommend(gpus=8, save_s=1.0, restart_s=10.0, step_s=1e9).steps == 1  # never 0


def test_expected_lost_work_is_half_an_interval_and_a_restart_per_interruption():
    gpu_hours = 16_384 * 54 * 24
    assert expected_lost_seconds(gpu_hours, 1200.0, 600.0) == pytest.approx(419 * (600 + 600))


def _ledger(tmp_path, *, stall_s: float, startup_s: float, step: int, attempts: int):
    from trainer.cost.ledger import Ledger

    ledger = Ledger(step=step, attempts=attempts)
    ledger.seconds.update(checkpoint_stall=stall_s, startup=startup_s, productive=1000.0)
    ledger.write(tmp_path)
    return tmp_path / "ledger.json"


def test_the_plan_recommends_the_interval_from_a_runs_measured_save_and_restart(tmp_path, capsys):
    from trainer.__main__ import main as trainer_main
    from trainer.config import load_config
    from trainer.contract.catalog import INSTANCE_TYPES
    from trainer.plan.search import search

    config = "trainer/configs/llama3-8b.yaml"
    save_interval = load_config(config).checkpoint.save_interval
    # 4 saves stalled 48 s in all, 2 attempts started up in 900 s: 12 s a save, 450 s a restart
    ledger = _ledger(tmp_path, stall_s=48.0, startup_s=900.0, step=4 * save_interval, attempts=2)
    argv = ["plan", "--config", config, "--instance", "p5.48xlarge", "--nodes", "4", "--top", "1"]
    assert trainer_main([*argv, "--ledger", str(ledger)]) == 0
    printed = capsys.readouterr().out
    chosen = search(load_config(config), INSTANCE_TYPES["p5.48xlarge"], 4).chosen
    expected = recommend(32, 12.0, 450.0, chosen.step.total_s)
    assert f"save every {expected.steps:,} steps" in printed and "restart 450 s" in printed
    assert f"expected goodput {expected.goodput:.1%}" in printed
    assert f"--set checkpoint.save_interval={expected.steps}" in printed
    # without measurements it says what it needs; a missing ledger is refused before anything is printed
    assert trainer_main(argv) == 0
    assert "give --ledger runs/<run>/ledger.json" in capsys.readouterr().out
    assert trainer_main([*argv, "--ledger", str(tmp_path / "none.json")]) == 2
    assert "--ledger" in capsys.readouterr().err
