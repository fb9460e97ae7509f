"""`make train` end to end: prepares the stdlib corpus (cached), launches 4 CPU processes, trains, checkpoints."""

import json
import os
import subprocess

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_make_train_learns_and_leaves_a_checkpoint_then_resumes(tmp_path):
    run_dir = tmp_path / "local"
    args = f"--set logging.run_dir={run_dir} --set schedule.train_iters=30 --set schedule.eval_interval=15"
    args += " --set schedule.lr_warmup_iters=10"
    first = subprocess.run(
        ["make", "train", f"ARGS={args}"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evaluations = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(evaluations) == 3 and evaluations[-1] < 0.85 * evaluations[0]
    assert (run_dir / "checkpoints" / "latest").read_text() == "iter_0000030\n"
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert f"--- a sample from {run_dir}/checkpoints/iter_0000030 (greedy, 48 tokens):\ndef" in first.stdout

    again = subprocess.run(
        ["make", "train", f"ARGS={args}"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0 and "already trained to step 30 of 30" in again.stderr


def test_make_train_with_a_stack_but_no_pulumi_cli_asks_for_an_outputs_file():
    result = subprocess.run(
        ["make", "train", "STACK=dev"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PATH": "/usr/bin:/bin"},  # no Pulumi CLI
    )
    assert result.returncode != 0
    assert "the Pulumi CLI is not installed" in result.stderr and "OUTPUTS=path.json" in result.stderr


def test_train_refuses_a_bad_layout_before_starting_any_process():
    result = subprocess.run(
        ["make", "train", "ARGS=--set parallel.tensor_model_parallel_size=3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 2
    assert (
        "model.num_attention_heads = 4 is not divisible by parallel.tensor_model_parallel_size = 3"
        in result.stderr
    )
    assert "torch.distributed.run" not in result.stderr
