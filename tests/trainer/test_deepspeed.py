"""engine: deepspeed trains the megatron engine's model step for step at ZeRO stage 1, 2 and 3, resumes exactly, and
its checkpoints convert to the trainer's and back with the same validation loss.

Each run is 2 gloo processes (DP=2) of the tiny fp32 model with the same seed and global batch. The first DeepSpeed
launch on a machine JIT-compiles DeepSpeed's communication op (about 70 s, then cached outside the repository).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.checkpoint import LATEST

ROOT = Path(__file__).resolve().parents[2]

RELATIVE = 1e-5
PARITY_STEPS = 3
# ZeRO-3 as a memory-bound run uses it: weights and optimizer states offloaded, every layer recomputed.
ZERO3 = (
    "engine=deepspeed",
    "zero.stage=3",
    "zero.offload_param=cpu",
    "zero.offload_optimizer=cpu",
    "parallel.recompute=full",
    "schedule.train_iters=6",
    "checkpoint.save_interval=3",
)


@pytest.fixture(scope="session")
def megatron_dp2(launcher):
    """The reference: megatron's engine at TP=1 x PP=1 x DP=2 (distributed optimizer), 3 steps."""
    return launcher.launch("megatron_dp2", 2, f"schedule.train_iters={PARITY_STEPS}")


@pytest.fixture(scope="session")
def zero3(launcher):
    """6 steps of ZeRO-3, saving DeepSpeed checkpoints at steps 3 and 6."""
    return launcher.launch("zero3", 2, *ZERO3)


def assert_same_losses(run, reference, steps):
    losses, expected = run.losses(), reference.losses()
    for step in steps:
        assert losses[step] == pytest.approx(expected[step], rel=RELATIVE), f"loss at step {step}"


def test_zero3_at_dp2_trains_like_megatron_at_dp2(zero3, megatron_dp2):
    assert_same_losses(zero3, megatron_dp2, range(1, PARITY_STEPS + 1))


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("zero1", ("zero.stage=1",)),
        # With optimizer states offloaded and attention recomputed.
        ("zero2", ("zero.stage=2", "zero.offload_optimizer=cpu", "parallel.recompute=selective")),
    ],
)
def test_zero_stage_at_dp2_trains_like_megatron_at_dp2(launcher, megatron_dp2, name, overrides):
    run = launcher.launch(name, 2, "engine=deepspeed", f"schedule.train_iters={PARITY_STEPS}", *overrides)
    assert_same_losses(run, megatron_dp2, range(1, PARITY_STEPS + 1))
    assert run.records[-1]["val_loss"] == pytest.approx(megatron_dp2.records[-1]["val_loss"], rel=RELATIVE)


def test_zero3_saves_deepspeed_checkpoints_under_the_trainer_discipline(zero3):
    checkpoints = zero3.run_dir / "checkpoints"
    assert (checkpoints / LATEST).read_text() == "iter_0000006\n"
    assert sorted(p.name for p in checkpoints.glob("iter_*")) == [
        "iter_0000003",
        "iter_0000006",
    ]  # no .tmp left
    # DeepSpeed's own layout: per-rank ZeRO-3 model and optimizer shards.
    assert sorted(p.name for p in (checkpoints / "iter_0000006").iterdir()) == [
        f"zero_pp_rank_{rank}_mp_rank_00_{kind}_states.pt" for rank in (0, 1) for kind in ("model", "optim")
    ]


def test_zero3_resumed_run_repeats_the_straight_run_exactly(launcher, zero3):
    checkpoints = launcher.run_dir("zero3_resumed") / "checkpoints"
    shutil.copytree(zero3.run_dir / "checkpoints" / "iter_0000003", checkpoints / "iter_0000003")
    (checkpoints / LATEST).write_text("iter_0000003\n")
    resumed = launcher.launch("zero3_resumed", 2, *ZERO3)
    assert sorted(resumed.losses()) == [4, 5, 6]
    assert resumed.losses() == {step: zero3.losses()[step] for step in (4, 5, 6)}
    assert resumed.records[-1]["val_loss"] == zero3.records[-1]["val_loss"]


@pytest.mark.slow
def test_make_train_local_zero3_on_two_processes_learns_and_leaves_a_deepspeed_checkpoint(tmp_path):
    run_dir = tmp_path / "local-zero3"
    args = f"--set logging.run_dir={run_dir} --set schedule.train_iters=30 --set schedule.eval_interval=15"
    args += " --set schedule.lr_warmup_iters=10"
    result = subprocess.run(
        ["make", "train", "CONFIG=trainer/configs/local-zero3.yaml", "NPROC=2", f"ARGS={args}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "TP=1 x PP=1 x DP=2" in result.stderr
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evaluations = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(evaluations) == 3 and evaluations[-1] < 0.85 * evaluations[0]
    assert (run_dir / "checkpoints" / LATEST).read_text() == "iter_0000030\n"
    assert len(list((run_dir / "checkpoints" / "iter_0000030").glob("*_optim_states.pt"))) == 2


def convert(tiny_config, direction: str, source: Path, out: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "trainer",
        "convert",
        "--config",
        str(tiny_config),
        direction,
        str(source),
    ]
    result = subprocess.run(
        [*command, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_deepspeed_checkpoint_converts_to_a_trainer_one_that_scores_the_same_at_tp2(
    launcher, tiny_config, zero3, tmp_path
):
    convert(tiny_config, "--from-deepspeed", zero3.run_dir / "checkpoints", tmp_path / "megatron")
    assert (tmp_path / "megatron" / LATEST).read_text() == "iter_0000006\n"
    loaded = launcher.launch(
        "from_zero3_at_tp2",
        2,
        "parallel.tensor_model_parallel_size=2",
        mode="evaluate",
        checkpoint=tmp_path / "megatron" / "iter_0000006",
    )
    assert loaded.val_loss == pytest.approx(zero3.records[-1]["val_loss"], rel=RELATIVE)


def test_trainer_checkpoint_converts_to_a_deepspeed_one_that_scores_the_same_under_zero3(
    launcher, tiny_config, megatron_dp2, tmp_path
):
    convert(tiny_config, "--to-deepspeed", megatron_dp2.run_dir / "checkpoints", tmp_path / "deepspeed")
    # Written by one process: loaded by two, ZeRO-3 takes the full weights and re-shards them.
    loaded = launcher.launch(
        "to_zero3_at_dp2",
        2,
        "engine=deepspeed",
        "zero.stage=3",
        mode="evaluate",
        checkpoint=tmp_path / "deepspeed" / "iter_0000003",
    )
    assert loaded.val_loss == pytest.approx(megatron_dp2.records[-1]["val_loss"], rel=RELATIVE)
