"""plan --calibration FILE.measured.json: the real planner's step times scaled by the measured/predicted ratio a
plan --measure record holds (the record's format: trainer/plan/measure.py write_record), and records of another
world size or config shape refused before anything is planned."""

from __future__ import annotations

import json

from trainer.__main__ import main as trainer_main

CONFIG = "trainer/configs/llama3-8b.yaml"
PLAN = ["plan", "--config", CONFIG, "--instance", "p5.48xlarge", "--nodes", "4", "--top", "1"]


def record(tmp_path, *, machine="4 x p5.48xlarge (stack dev)", config=CONFIG, ratios=(1.5, 2.0, 3.0)):
    """A record as measure-stack writes it: three layouts measured at `ratios` x their prediction, one failed."""
    layouts = [
        {"rank": i, "layout": "x", "overrides": [], "predicted_s": 2.0, "measured_s": 2.0 * r, "error": None}
        for i, r in enumerate(ratios, 1)
    ]
    layouts.append({"rank": 9, "layout": "y", "overrides": [], "predicted_s": 1.0, "measured_s": None})
    values = {
        "config": config,
        "machine": machine,
        "steps": 6,
        "warmup_steps": 2,
        "model": {},
        "layouts": layouts,
    }
    path = tmp_path / "planned.yaml.measured.json"
    path.write_text(json.dumps(values))
    return path


def _step_s(printed: str) -> float:
    return float(printed.split("\nstep ")[1].split(" s = ")[0])


def test_the_median_measured_over_predicted_scales_the_step_times_and_says_so(tmp_path, capsys):
    assert trainer_main(PLAN) == 0
    plain = capsys.readouterr().out
    assert "calibration" not in plain
    assert trainer_main([*PLAN, "--calibration", str(record(tmp_path))]) == 0
    calibrated = capsys.readouterr().out
    assert (
        "calibration applied: predicted step times x 2.000, the median measured/predicted of 3 layout(s)"
        in (calibrated)
    )
    assert abs(_step_s(calibrated) - 2 * _step_s(plain)) <= 0.011  # printed to 2 decimals


def test_a_record_of_another_world_size_or_config_shape_is_refused(tmp_path, capsys):
    other_world = record(tmp_path, machine="8 x p5.48xlarge (stack dev)")
    assert trainer_main([*PLAN, "--calibration", str(other_world)]) == 2
    captured = capsys.readouterr()
    assert (
        "measured on 8 x p5.48xlarge (stack dev), not this plan's 32 GPUs" in captured.err
        and not captured.out
    )
    local = record(tmp_path, machine="4 CPU processes on 2 cores")
    assert trainer_main([*PLAN, "--calibration", str(local)]) == 2
    assert "not this plan's 32 GPUs" in capsys.readouterr().err
    other_shape = record(tmp_path, config="trainer/configs/llama3-70b.yaml")
    assert trainer_main([*PLAN, "--calibration", str(other_shape)]) == 2
    assert "whose model, sequence or global batch differs" in capsys.readouterr().err
    assert trainer_main([*PLAN, "--calibration", str(tmp_path / "none.json")]) == 2
    assert "not a plan --measure record" in capsys.readouterr().err
    failed = record(tmp_path, ratios=())
    assert trainer_main([*PLAN, "--calibration", str(failed)]) == 2
    assert "no layout was measured there" in capsys.readouterr().err
