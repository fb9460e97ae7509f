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
