"""Checkpoints: resume continues exactly, layouts reshard, old ones are pruned, a half-written one is ignored."""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.training import sealed_checkpoint
from trainer.checkpoint import digest
from trainer.checkpoint.megatron import saved_state
from trainer.checkpoint.start import start_problems
from trainer.checkpoint.store import (
    LATEST,
    MANIFEST,
    checkpoint_dirs,
    checkpoint_name,
    latest_checkpoint,
    prune,
    verify,
    write_manifest,
)
from trainer.checkpoint.version import RECORD, read_record
from trainer.config import load_config


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


def test_every_byte_of_the_runs_checkpoints_was_hashed_by_its_writer_and_matches(single):
    for checkpoint in checkpoint_dirs(single.run_dir / "checkpoints"):
        files = json.loads((checkpoint / MANIFEST).read_text())["files"]
        assert not list(checkpoint.rglob("*" + digest.SIDE_SUFFIX))  # the writers' side files are gone
        assert {name for name in files} == {
            str(p.relative_to(checkpoint))
            for p in checkpoint.rglob("*")
            if p.is_file() and p.name not in (MANIFEST, RECORD)
        }
        # The model version record, written after the seal, names the manifest (so every byte) by its hash.
        sealed = hashlib.sha256((checkpoint / MANIFEST).read_bytes()).hexdigest()
        assert read_record(checkpoint).manifest_sha256 == sealed
        for name, record in files.items():
            assert record[digest.ALGORITHM] == digest.file_digest(checkpoint / name), name


def test_the_writers_stream_hashes_what_a_read_hashes(tmp_path):
    with digest.hashing_open(tmp_path / "shard.distcp", "wb") as stream:
        stream.write(b"a" * 1000)
        stream.write(memoryview(bytes(range(256)) * 4))
    side = json.loads((tmp_path / ("shard.distcp" + digest.SIDE_SUFFIX)).read_text())
    assert side == {"bytes": 2024, digest.ALGORITHM: digest.file_digest(tmp_path / "shard.distcp")}
    with digest.hashing_open(tmp_path / "patched", "wb") as stream:
        stream.write(b"header")
        stream.seek(0)  # a writer that patches what it wrote: the streamed digest would be wrong, so none
        stream.write(b"HEADER")
    assert not (tmp_path / ("patched" + digest.SIDE_SUFFIX)).exists()
    assert digest.record(tmp_path / "patched") == {
        "bytes": 6,
        digest.ALGORITHM: digest.file_digest(tmp_path / "patched"),
    }


def test_a_same_size_bit_flip_in_a_100_mb_shard_is_caught_on_load(tmp_path, single_process_group):
    checkpoint = tmp_path / "iter_0000010"
    checkpoint.mkdir()
    with digest.hashing_open(checkpoint / "__0_0.distcp", "wb") as stream:
        for _ in range(100):
            stream.write(bytes(range(256)) * 4096)  # 1 MiB
    write_manifest(checkpoint, 10)
    assert verify(checkpoint) is None
    with (checkpoint / "__0_0.distcp").open("r+b") as shard:
        shard.seek(73 * 2**20 + 5)
        byte = shard.read(1)[0]
        shard.seek(-1, 1)
        shard.write(bytes([byte ^ 0x10]))
    assert latest_checkpoint(tmp_path) == checkpoint  # sizes agree: finding the newest does not read 100 MB
    assert verify(checkpoint) == ("__0_0.distcp does not hold what the save wrote (XXH3-128 differs)")


def test_a_run_whose_every_checkpoint_is_damaged_is_refused_naming_each(tmp_path, tiny_config):
    cfg = load_config(tiny_config, [f"checkpoint.dir={tmp_path}"])
    newest, before = (sealed_checkpoint(tmp_path / checkpoint_name(step)) for step in (20, 10))
    (newest / MANIFEST).unlink()
    (before / "common.pt").write_bytes(b"wei")  # truncated
    (problem,) = start_problems(cfg, cfg.model.model_copy(update={"vocab_size": 512}))
    assert problem.startswith(f"{tmp_path} holds checkpoints and none is intact (")
    assert "iter_0000010: common.pt is 3 bytes, the save wrote 7" in problem
    assert "iter_0000020: no manifest.json" in problem
    assert "make train FRESH=1" in problem and "Nothing was deleted" in problem
    assert start_problems(cfg, cfg.model, fresh=True) == []  # FRESH=1 starts over
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000010", "iter_0000020"]


WRITER_PROBE = """
import json
import queue
import psutil
from megatron.core.dist_checkpointing.strategies import filesystem_async
from trainer.checkpoint.writer import Writer
Writer().ready()
children = [p for p in psutil.Process().children() if "spawn_main" in " ".join(p.cmdline())]
print(json.dumps({
    "children": len(children),
    "torch_loaded": ["libtorch" in open(f"/proc/{p.pid}/maps").read() for p in children],
    "results_in_process": isinstance(filesystem_async._results_queue, queue.Queue),
}))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not Path("/proc/self/maps").exists(), reason="reads a process's mapped libraries from /proc"
)
def test_the_writer_process_has_torch_loaded_before_the_first_save_and_no_manager_process():
    # The writer imports torch while the run starts, not while the first save waits; its results come back
    # through its pipe, so megatron's write-results Manager (a second spawned Python) is never started.
    result = subprocess.run(
        [sys.executable, "-c", WRITER_PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "children": 1,
        "torch_loaded": [True],
        "results_in_process": True,
    }
