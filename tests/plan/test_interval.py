"""The plan's checkpoint interval from a run's ledger (trainer/plan/command.py with the real planner): the time per
save is what the run measured over the saves it counted, whatever interval the planning config has; the
recommended interval goes into the written config."""

from __future__ import annotations

import json

from trainer.__main__ import main as trainer_main
from trainer.cost.ledger import Ledger

CONFIG = "trainer/configs/llama3-8b.yaml"
PLAN = ["plan", "--config", CONFIG, "--instance", "p5.48xlarge", "--nodes", "4", "--top", "1"]


def write_ledger(directory, *, saves: int | None, step: int = 4000, stall_s: float = 60.0):
    """A run's ledger.json: `stall_s` of checkpoint stalls over `saves` saves (None: a ledger written before saves
    were counted, without the key), two attempts that started up in 900 s."""
    ledger = Ledger(step=step, attempts=2, saves=saves)
    ledger.seconds.update(checkpoint_stall=stall_s, startup=900.0, productive=10_000.0)
    values = ledger.to_dict()
    if saves is None:
        del values["saves"]
    path = directory / "ledger.json"
    path.write_text(json.dumps(values))
    return path


def test_the_time_per_save_is_the_ledgers_stalls_over_its_saves_whatever_the_planning_interval(
    tmp_path, capsys
):
    ledger = write_ledger(tmp_path, saves=5)  # 60 s over 5 saves (the last one off the interval): 12 s a save
    for interval in ("1000", "300"):
        argv = [*PLAN, "--ledger", str(ledger), "--set", f"checkpoint.save_interval={interval}"]
        assert trainer_main(argv) == 0
        printed = capsys.readouterr().out
        assert "x save 12.0 s x MTBF" in printed and "does not count its saves" not in printed


def test_an_old_ledger_without_a_save_count_falls_back_to_the_interval_and_says_so(tmp_path, capsys):
    ledger = write_ledger(tmp_path, saves=None)  # step 4000 at the interval 1000: 4 saves assumed, 15 s each
    assert trainer_main([*PLAN, "--ledger", str(ledger), "--set", "checkpoint.save_interval=1000"]) == 0
    printed = capsys.readouterr().out
    assert "x save 15.0 s x MTBF" in printed
    assert "the ledger does not count its saves (written before they were counted): assumed 4" in printed


def _set_interval(printed: str) -> int:
    return int(printed.split("--set checkpoint.save_interval=")[1].split()[0])


def test_out_writes_the_recommended_save_interval_into_the_config(tmp_path, capsys):
    import yaml

    from trainer.config import load_config

    out = tmp_path / "planned.yaml"
    ledger = write_ledger(tmp_path, saves=5)
    assert trainer_main([*PLAN, "--ledger", str(ledger), "--out", str(out)]) == 0
    steps = _set_interval(capsys.readouterr().out)
    assert yaml.safe_load(out.read_text())["checkpoint"]["save_interval"] == steps != 1000  # not the recipe's
    assert load_config(out).checkpoint.save_interval == steps  # train accepts it


def test_another_interruption_rate_changes_the_mtbf_and_the_interval(tmp_path, capsys):
    from trainer.cost.resilience import INTERRUPTIONS_PER_GPU_HOUR

    ledger = write_ledger(tmp_path, saves=5)
    assert trainer_main([*PLAN, "--ledger", str(ledger)]) == 0
    published = capsys.readouterr().out
    rate = 4 * INTERRUPTIONS_PER_GPU_HOUR
    assert trainer_main([*PLAN, "--ledger", str(ledger), "--interruptions-per-gpu-hour", str(rate)]) == 0
    given = capsys.readouterr().out
    assert f"at {rate:.3g} interruptions per GPU-hour (given: --interruptions-per-gpu-hour)" in given
    # Young's interval goes as 1 / sqrt(rate): 4 times the rate, half the interval
    assert abs(_set_interval(given) - _set_interval(published) / 2) <= 1


def test_an_interruption_rate_that_is_not_a_finite_positive_number_is_refused(tmp_path, capsys):
    import pytest

    for rate in ("0", "-1", "inf", "nan", "often"):
        with pytest.raises(SystemExit) as exit:
            trainer_main([*PLAN, "--interruptions-per-gpu-hour", rate])
        assert exit.value.code == 2
        assert "argument --interruptions-per-gpu-hour: " in capsys.readouterr().err  # why, not "unrecognized"
