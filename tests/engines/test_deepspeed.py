"""engine: deepspeed trains the megatron engine's model step for step at ZeRO stage 1, 2 and 3, resumes exactly, and
its checkpoints convert to the trainer's and back with the same validation loss.

Each run is 2 gloo processes (DP=2) of the tiny fp32 model with the same seed and global batch. The first DeepSpeed
launch on a machine JIT-compiles DeepSpeed's communication op (about 70 s, then cached outside the repository).
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from trainer.checkpoint.store import LATEST, damage

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


@pytest.mark.slow
def test_zero3_at_dp2_trains_like_megatron_at_dp2(zero3, megatron_dp2):
    assert_same_losses(zero3, megatron_dp2, range(1, PARITY_STEPS + 1))


@pytest.mark.slow
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


@pytest.mark.slow
def test_zero3_saves_deepspeed_checkpoints_under_the_trainer_discipline(zero3):
    checkpoints = zero3.run_dir / "checkpoints"
    assert (checkpoints / LATEST).read_text() == "iter_0000006\n"
    assert sorted(p.name for p in checkpoints.glob("iter_*")) == [
        "iter_0000003",
        "iter_0000006",
    ]  # no .tmp left
    # DeepSpeed's own layout: per-rank ZeRO-3 model and optimizer shards; sealed by the trainer's manifest.
    assert sorted(p.name for p in (checkpoints / "iter_0000006").iterdir()) == [
        "manifest.json",
        "model_version.json",  # written after the seal (trainer/checkpoint/version.py)
        *(
            f"zero_pp_rank_{rank}_mp_rank_00_{kind}_states.pt"
            for rank in (0, 1)
            for kind in ("model", "optim")
        ),
    ]
    assert damage(checkpoints / "iter_0000006") is None


@pytest.mark.slow
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


def trainer(launcher, name: str, *args: str) -> str:
    """`python -m trainer ARGS` to success (it starts torchrun itself); its output."""
    return launcher.run(name, [sys.executable, "-m", "trainer", *args])


def score(launcher, tiny_corpus, name: str, checkpoint: Path, *layout: str) -> float:
    """`score`'s loss of a checkpoint over the first 6 windows of the tiny corpus."""
    args = ["--checkpoint", str(checkpoint), "--data", tiny_corpus, "--samples", "6", "--json", *layout]
    return json.loads(trainer(launcher, name, "score", *args).strip().splitlines()[-1])["loss"]


@pytest.mark.slow
def test_deepspeed_checkpoint_converts_to_a_trainer_one_at_tp2_that_scores_the_same_at_pp2(
    launcher, tiny_corpus, zero3
):
    source = zero3.run_dir / "checkpoints"
    converted = launcher.base / "from-zero3"
    trainer(
        launcher,
        "convert-from-zero3",
        "convert",
        "--from-deepspeed",
        str(source),
        "--out",
        str(converted),
        "--tp",
        "2",
    )
    assert sorted(p.name for p in converted.iterdir()) == ["iter_0000000", "latest"]
    before = score(launcher, tiny_corpus, "score-zero3", source)  # scored straight from DeepSpeed's format
    after = score(launcher, tiny_corpus, "score-from-zero3", converted, "--pp", "2")
    assert after == pytest.approx(before, rel=RELATIVE)


@pytest.mark.slow
def test_trainer_checkpoint_converts_to_a_deepspeed_one_that_scores_the_same_and_trains_on_under_zero3(
    launcher, tiny_corpus, megatron_dp2
):
    source = megatron_dp2.run_dir / "checkpoints"
    converted = launcher.base / "to-deepspeed"
    trainer(
        launcher, "convert-to-deepspeed", "convert", "--to-deepspeed", str(source), "--out", str(converted)
    )
    assert (converted / LATEST).read_text() == "iter_0000000\n"
    assert any((converted / "iter_0000000").glob("*_optim_states.pt"))  # DeepSpeed's own tools read it
    before = score(launcher, tiny_corpus, "score-megatron-dp2", source)
    after = score(launcher, tiny_corpus, "score-to-deepspeed", converted)
    assert after == pytest.approx(before, rel=RELATIVE)
    # Written by one process, loaded by two: ZeRO-3 takes the full weights and shards them.
    loaded = launcher.launch(
        "to_zero3_at_dp2",
        2,
        "engine=deepspeed",
        "zero.stage=3",
        mode="evaluate",
        checkpoint=converted / "iter_0000000",
    )
    assert loaded.val_loss == pytest.approx(megatron_dp2.records[-1]["val_loss"], rel=RELATIVE)


def fake_checkpoint(directory: Path, file: str) -> Path:
    """An intact (sealed) checkpoint directory that a format check recognizes by its files, whose contents are
    never read."""
    from trainer.checkpoint.store import write_manifest

    directory.mkdir(parents=True)
    (directory / file).write_text("")
    write_manifest(directory, 3)
    return directory


@pytest.mark.parametrize(
    ("flag", "file", "message"),
    [
        (
            "--from-deepspeed",
            "metadata.json",
            "is a trainer (megatron) checkpoint; give it to --to-deepspeed",
        ),
        (
            "--to-deepspeed",
            "zero_pp_rank_0_mp_rank_00_model_states.pt",
            "is a DeepSpeed checkpoint; give it to --from-deepspeed",
        ),
    ],
)
def test_convert_refuses_a_checkpoint_of_the_other_engine_before_starting(
    flag, file, message, tmp_path, capsys
):
    from trainer.__main__ import main

    source = fake_checkpoint(tmp_path / "iter_0000003", file)
    assert main(["convert", flag, str(source), "--out", str(tmp_path / "out")]) == 2
    assert f"convert: {flag} {source}: {source} {message}" in capsys.readouterr().err


def test_convert_to_deepspeed_refuses_a_layout(tmp_path, capsys):
    from trainer.__main__ import main

    source = fake_checkpoint(tmp_path / "iter_0000003", "metadata.json")
    assert main(["convert", "--to-deepspeed", str(source), "--out", str(tmp_path / "out"), "--tp", "2"]) == 2
    assert (
        "--tp/--pp apply to --from-hf and --from-deepspeed; --to-deepspeed reads any checkpoint in one process"
        in (capsys.readouterr().err)
    )


@pytest.mark.parametrize(
    ("engine", "saved_by", "file"),
    [
        ("megatron", "deepspeed", "zero_pp_rank_0_mp_rank_00_model_states.pt"),
        ("deepspeed", "megatron", "metadata.json"),
    ],
)
def test_a_run_refuses_to_resume_the_other_engines_checkpoint(engine, saved_by, file, tiny_config, tmp_path):
    from trainer.checkpoint.start import start_problems
    from trainer.config import load_config

    cfg = load_config(tiny_config, [f"engine={engine}", f"logging.run_dir={tmp_path}"])
    fake_checkpoint(cfg.checkpoint_dir / "iter_0000003", file)
    (cfg.checkpoint_dir / LATEST).write_text("iter_0000003\n")
    (problem,) = start_problems(cfg, cfg.model)
    assert problem.startswith(
        f"resuming from {cfg.checkpoint_dir / 'iter_0000003'}: saved by engine: {saved_by}, and this run has engine: "
        f"{engine}; set engine: {saved_by} to resume it"
    )
