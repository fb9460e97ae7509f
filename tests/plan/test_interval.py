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


def test_the_docs_first_plan_on_a_stack_prints_an_interval_from_the_estimated_save(capsys):
    """No ledger yet: the save is the checkpoint's bytes at the stack's FSx throughput, labelled an estimate."""
    from trainer.cost.resilience import mtbf_seconds

    assert trainer_main(["plan", "--config", CONFIG, "--stack", "prod", "--top", "1"]) in (0, 1)
    printed = capsys.readouterr().out.replace("\n", " ")
    # Pulumi.prod.yaml: PERSISTENT_2, 4800 GiB x 250 MB/s per TiB; llama3-8b: 8.03 B parameters x 14 bytes (bf16)
    throughput = 4800 / 1024 * 250e6
    parameters = 8.03e9
    save_s = parameters * 14 / throughput
    assert "ESTIMATED, no run measured them: checkpoint 112 GB (8.03 B parameters x 14 bytes" in printed
    assert "FSx for Lustre PERSISTENT_2 4,800 GiB x 250 MB/s per TiB = 1,172 MB/s" in printed
    assert f"save {save_s:.0f} s; restart = start-up 300 s (assumed" in printed
    # Young's interval on that save: prod's 4 p5 nodes, 32 GPUs
    young_min = (2 * save_s * mtbf_seconds(32)) ** 0.5 / 60
    shown = float(printed.split("x MTBF) = ")[1].split(" min")[0])
    assert abs(shown - young_min) / young_min < 0.005  # 8.03 B is the printed rounding of the count


def _cpu_run(directory, model: dict, parallel: dict, where: str = "local"):
    """A run directory's ledger.json (paid time `where`) and the model version record beside its checkpoint."""
    ledger = Ledger(step=60, attempts=1, saves=1, node_hours={where: 0.01})
    ledger.seconds.update(checkpoint_stall=0.8, startup=19.8, productive=19.2)
    (directory / "ledger.json").write_text(json.dumps(ledger.to_dict()))
    version = directory / "checkpoints" / "iter_0000060"
    version.mkdir(parents=True)
    (version / "model_version.json").write_text(
        json.dumps({"config": {"model": model, "parallel": parallel}})
    )
    return directory / "ledger.json"


def test_a_ledger_of_another_model_run_on_this_machine_is_refused_for_a_70b_job_on_p5(tmp_path, capsys):
    tiny = {"num_layers": 4, "hidden_size": 128, "ffn_hidden_size": 352, "num_attention_heads": 4}
    ledger = _cpu_run(tmp_path, tiny, {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2})
    argv = [
        "plan",
        "--config",
        "trainer/configs/llama3-70b.yaml",
        "--instance",
        "p5.48xlarge",
        "--nodes",
        "8",
    ]
    assert trainer_main([*argv, "--ledger", str(ledger)]) == 2
    error = capsys.readouterr().err.replace("\n", " ")
    assert f"--ledger {ledger} measured another job's saves: it ran on this machine" in error
    assert "its model differs: num_layers 4 (planned 80), hidden_size 128 (planned 8192)" in error


def test_a_ledger_of_the_same_model_on_another_layout_is_used_with_a_warning(tmp_path, capsys):
    from trainer.config import load_config

    model = load_config(CONFIG).model.model_dump(mode="json")
    ledger = _cpu_run(
        tmp_path, model, {"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 1}, "on_demand"
    )
    assert trainer_main([*PLAN, "--ledger", str(ledger)]) == 0
    printed = capsys.readouterr().out.replace("\n", " ")
    assert f"(save and restart: measured in {ledger})" in printed
    assert "warning: the ledger's run had TP=8 x PP=1, the chosen layout TP=" in printed
