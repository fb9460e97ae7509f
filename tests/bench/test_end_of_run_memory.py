"""A run's end must not need more memory than its steady state: the final evaluation runs while the last
interval's background save may still be in flight (its staging copies held), after every training step's
allocator state. The whole loop of trainer/loop.py runs with every allocation traced (trainer/bench/allocations.py,
on CPU the same counts torch.cuda.max_memory_allocated reports on a GPU)."""

import json
import os
import subprocess

import pytest

from tests.conftest import ROOT
from tests.support.training import torchrun

pytestmark = pytest.mark.slow  # one torchrun launch of the whole loop


def test_final_evaluation_with_a_background_save_in_flight_peaks_no_higher_than_a_training_step(
    tiny_config, tmp_path
):
    command = torchrun(1, "tests.bench.end_of_run_worker", str(tiny_config), str(tmp_path))
    overrides = [
        f"logging.run_dir={tmp_path / 'run'}",
        "schedule.train_iters=6",
        "schedule.eval_interval=3",  # an evaluation right after the step-3 background save, and at the end
        "checkpoint.save_interval=3",
        "checkpoint.async_save=true",
    ]
    command += [arg for o in overrides for arg in ("--set", o)]
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    peaks = json.loads((tmp_path / "peaks.json").read_text())
    assert len(peaks["steps"]) == 6 and len(peaks["evaluations"]) == 3  # the untrained model's, steps 3 and 6
    steady = max(peaks["steps"][1:])  # from the second step on, Adam's states exist
    for evaluation in peaks["evaluations"][1:]:
        assert evaluation <= steady, (
            f"{peaks}: evaluation peak {evaluation} B above the steady step's {steady} B"
        )
