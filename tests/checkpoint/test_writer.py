"""The background writer (trainer/checkpoint/writer.py): one persistent process per rank, fed through a staging
buffer, writing megatron-core's own checkpoint files; saved here through dist_checkpointing itself in a gloo
group of one process."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
import torch
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing import ShardedTensor
from megatron.core.dist_checkpointing.strategies.torch import (
    TorchDistLoadShardedStrategy,
    TorchDistSaveShardedStrategy,
)

from trainer.checkpoint import digest
from trainer.checkpoint.store import CheckpointSaveError, checkpoint_name, latest_checkpoint, stage, verify
from trainer.checkpoint.writer import Write, Writer, install_results_queue
from trainer.distributed import megatron_compat


def _sharded(tensors: dict[str, torch.Tensor]) -> dict[str, ShardedTensor]:
    return {
        name: ShardedTensor.from_rank_offsets(name, tensor, replica_id=0) for name, tensor in tensors.items()
    }


def _save(writer: Writer, directory: Path, step: int, tensors: dict[str, torch.Tensor]) -> Write:
    """What trainer/checkpoint/megatron.py save does around dist_checkpointing, in the background."""
    digest.install()
    install_results_queue()
    staging = stage(directory, step)
    request = dist_checkpointing.save(
        _sharded(tensors),
        str(staging),
        sharded_strategy=TorchDistSaveShardedStrategy("torch_dist", 1),
        async_sharded_save=True,
    )
    write = Write(staging, step)
    writer.schedule(write, request)
    return write


def _load(checkpoint: Path, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    empty = {name: torch.empty_like(tensor) for name, tensor in like.items()}
    loaded = dist_checkpointing.load(
        _sharded(empty), str(checkpoint), sharded_strategy=TorchDistLoadShardedStrategy()
    )
    return dict(loaded)


@pytest.fixture(scope="module")
def writer() -> Writer:
    megatron_compat.apply()  # megatron's collectives on the CPU, as the trainer runs them
    writer = Writer()
    writer.ready()
    return writer


def test_a_background_save_holds_the_state_of_its_step_while_training_changes_it(
    tmp_path, single_process_group, writer
):
    weights = {"layer.weight": torch.randn(256, 512), "layer.bias": torch.randn(512).to(torch.bfloat16)}
    at_save = {name: tensor.clone() for name, tensor in weights.items()}
    write = _save(writer, tmp_path, 10, weights)
    for tensor in weights.values():  # the next steps update the parameters in place while the writer writes
        tensor.add_(1.0)
    published = write.finish()
    assert published == tmp_path / checkpoint_name(10) == latest_checkpoint(tmp_path)
    assert verify(published) is None  # every byte's digest, streamed by the writer process as it wrote
    loaded = _load(published, at_save)
    for name, tensor in at_save.items():
        assert torch.equal(loaded[name], tensor), name

    # The next save reuses the staging buffer and holds the new values.
    buffer = writer.caller._buffer
    published = _save(writer, tmp_path, 20, weights).finish()
    assert writer.caller._buffer is buffer
    for name, tensor in _load(published, weights).items():
        assert torch.equal(tensor, weights[name]), name


def test_the_writer_starts_at_its_ranks_first_check_after_the_save(tmp_path, single_process_group, writer):
    # Not while the other ranks still copy and plan their own saves (docs/bench.md): one step later.
    weights = {"w": torch.randn(256, 256)}
    write = _save(writer, tmp_path, 10, weights)
    time.sleep(1.0)  # a writer started at once writes 256 KB in milliseconds
    assert not list(write.staging.glob("*.distcp"))
    published = write.finish()  # the check that releases it, then waits
    assert [path.name for path in published.glob("*.distcp")] == ["__0_0.distcp"]


def test_a_grown_plan_gets_a_larger_staging_buffer_and_the_writer_maps_it(
    tmp_path, single_process_group, writer
):
    small = {"w": torch.randn(64, 64)}
    _save(writer, tmp_path, 10, small).finish()
    size = len(writer.caller._buffer)
    large = {"w": torch.randn(64, 64), "grown": torch.randn(1024, 1024)}
    published = _save(writer, tmp_path, 20, large).finish()
    assert len(writer.caller._buffer) > size
    for name, tensor in _load(published, large).items():
        assert torch.equal(tensor, large[name]), name


def test_the_writer_process_is_niced_and_leaves_stop_signals_to_its_rank(
    tmp_path, single_process_group, writer
):
    process = psutil.Process(writer.caller._process.pid)
    assert process.nice() == psutil.Process().nice() + 10  # WRITER_NICENESS
    # Ctrl-C in a terminal and a SIGTERM to the process group reach the writer too: the rank decides, and the
    # writer still writes its save.
    for stop in (signal.SIGINT, signal.SIGTERM):
        os.kill(process.pid, stop)
    time.sleep(0.5)
    assert process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    weights = {"w": torch.randn(128, 128)}
    published = _save(writer, tmp_path, 10, weights).finish()
    assert torch.equal(_load(published, weights)["w"], weights["w"])


def test_a_killed_writer_fails_the_save_on_every_rank_and_publishes_nothing(tmp_path, single_process_group):
    megatron_compat.apply()
    writer = Writer()
    writer.ready()
    weights = {"w": torch.randn(128, 128)}
    kept = _save(writer, tmp_path, 10, weights).finish()
    write = _save(writer, tmp_path, 20, weights)
    os.kill(writer.caller._process.pid, signal.SIGKILL)
    with pytest.raises(CheckpointSaveError, match="the checkpoint writer process was killed") as error:
        write.finish()
    assert "iter_0000010 is intact and `latest` still names it" in str(error.value)
    assert latest_checkpoint(tmp_path) == kept
    assert not (tmp_path / "iter_0000020.tmp").exists()  # the staging directory is cleared
