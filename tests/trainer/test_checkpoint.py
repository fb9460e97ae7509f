"""Checkpoints: resume continues exactly, layouts reshard, old ones are pruned, a half-written one is ignored."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.checkpoint.megatron import saved_state
from trainer.checkpoint.store import (
    LATEST,
    MANIFEST,
    checkpoint_dirs,
    checkpoint_name,
    latest_checkpoint,
    prune,
)

from .conftest import ROOT, sealed_checkpoint


@pytest.mark.slow
def test_resumed_run_repeats_the_straight_run_exactly(launcher, single):
    # A run stopped right after saving step 15 (same config, 20 steps planned) continues from that checkpoint:
    # the run's third save in the background, written with the plan its first made and its second checked
    # (trainer/checkpoint/megatron.py Plans), in dp_reshardable (checkpoint.optimizer_format auto).
    checkpoints = launcher.run_dir("resumed") / "checkpoints"
    shutil.copytree(single.run_dir / "checkpoints" / "iter_0000015", checkpoints / "iter_0000015")
    (checkpoints / LATEST).write_text("iter_0000015\n")
    resumed = launcher.launch("resumed", 1)
    straight = single.losses()
    assert sorted(resumed.losses()) == list(range(16, 21))
    assert resumed.losses() == {step: straight[step] for step in range(16, 21)}
    assert resumed.records[-1]["val_loss"] == single.records[-1]["val_loss"]


def test_interval_saves_skip_the_gather_and_the_last_save_loads_at_any_layout(single):
    # checkpoint.optimizer_format auto: the background saves on the interval dp_reshardable, the last fully.
    formats = {
        path.name: saved_state(path)["optimizer_format"]
        for path in sorted((single.run_dir / "checkpoints").glob("iter_*"))
    }
    assert formats == {
        "iter_0000010": "dp_reshardable",
        "iter_0000015": "dp_reshardable",
        "iter_0000020": "fully_reshardable",
    }


def test_straight_run_keeps_the_last_three_checkpoints_and_points_at_the_newest(single):
    checkpoints = single.run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "iter_0000010",
        "iter_0000015",
        "iter_0000020",
        LATEST,
    ]
    assert (checkpoints / LATEST).read_text() == "iter_0000020\n"


@pytest.mark.slow
@pytest.mark.parametrize(("name", "nproc", "pp"), [("reshard_tp1_pp2", 2, 2), ("reshard_tp1_pp1", 1, 1)])
def test_tp2_pp2_checkpoint_loads_at_another_layout_with_the_same_loss(launcher, tp2_pp2, name, nproc, pp):
    saved = tp2_pp2.run_dir / "checkpoints" / "iter_0000003"
    loaded = launcher.launch(
        name, nproc, f"parallel.pipeline_model_parallel_size={pp}", mode="evaluate", checkpoint=saved
    )
    assert loaded.val_loss == pytest.approx(tp2_pp2.records[-1]["val_loss"], rel=1e-5)


def test_latest_falls_back_to_the_newest_complete_checkpoint(tmp_path):
    for name in ("iter_0000100", "iter_0000200"):
        sealed_checkpoint(tmp_path / name)
    (tmp_path / "iter_0000300.tmp").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "iter_0000200"  # no pointer; the .tmp one is unfinished
    (tmp_path / LATEST).write_text("iter_0000100\n")
    assert latest_checkpoint(tmp_path) == tmp_path / "iter_0000100"
    (tmp_path / LATEST).write_text("iter_0000400\n")  # dangling: that one was deleted by hand
    assert latest_checkpoint(tmp_path) == tmp_path / "iter_0000200"
    assert latest_checkpoint(tmp_path / "none") is None


def test_retention_keeps_the_newest_and_the_best_by_validation_loss(tmp_path):
    losses = {100: 3.0, 200: 2.0, 300: None, 400: 2.5, 500: 2.9, 600: None}
    for step, val_loss in losses.items():
        sealed_checkpoint(tmp_path / checkpoint_name(step), val_loss)
    deleted = prune(tmp_path, keep_last=2, keep_best=1)
    assert [path.name for path in deleted] == ["iter_0000100", "iter_0000300", "iter_0000400"]
    assert [path.name for path in checkpoint_dirs(tmp_path)] == [
        "iter_0000200",
        "iter_0000500",
        "iter_0000600",
    ]


def test_retention_never_deletes_a_damaged_checkpoint_nor_counts_it_as_the_newest(tmp_path):
    for step in (100, 200, 300):
        sealed_checkpoint(tmp_path / checkpoint_name(step))
    (tmp_path / "iter_0000300" / MANIFEST).unlink()  # the newest is damaged: the newest intact one stays
    assert prune(tmp_path, keep_last=1) == [tmp_path / "iter_0000100"]
    assert [path.name for path in checkpoint_dirs(tmp_path)] == ["iter_0000200", "iter_0000300"]


WRITER_QUEUE_PROBE = """
import json
import psutil
from megatron.core.dist_checkpointing.strategies import filesystem_async
from trainer.checkpoint.writer import Writer
Writer().ready()
managers = [p for p in psutil.Process().children() if "spawn_main" in " ".join(p.cmdline())]
print(json.dumps({
    "managers": len(managers),
    "torch_loaded": ["libtorch" in open(f"/proc/{p.pid}/maps").read() for p in managers],
    "queued": filesystem_async._get_write_results_queue().qsize(),
}))
"""


@pytest.mark.skipif(
    not Path("/proc/self/maps").exists(), reason="reads a process's mapped libraries from /proc"
)
def test_the_write_results_process_has_torch_loaded_before_the_first_save_and_an_empty_queue():
    # Unpickling the first save's WriteResults otherwise imports torch there while that save waits.
    result = subprocess.run(
        [sys.executable, "-c", WRITER_QUEUE_PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "managers": 1,
        "torch_loaded": [True],
        "queued": 0,
    }
