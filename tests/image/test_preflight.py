"""The preflight's checks, each with the failure a misconfigured node would show, and a real run on CPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.contract.catalog import instance_type
from trainer.launch.preflight import (
    FAILED,
    OK,
    SKIPPED,
    bus_bandwidth_gbps,
    check_checkpoint_root,
    check_efa_devices,
    check_gpus,
)

P5 = instance_type("p5.48xlarge")


def test_gpu_count_must_match_the_catalog():
    assert check_gpus(P5, 8).status == OK
    failed = check_gpus(P5, 7)
    assert failed.status == FAILED and failed.detail == "expected 8 x H100 on p5.48xlarge, CUDA sees 7"
    assert check_gpus(None, 0).status == SKIPPED


def test_efa_device_count_must_match_the_catalog(tmp_path):
    for i in range(31):
        (tmp_path / f"uverbs{i}").touch()
    failed = check_efa_devices(P5, tmp_path)
    assert failed.status == FAILED and "32 EFA interfaces but 31" in failed.detail
    (tmp_path / "uverbs31").touch()
    assert check_efa_devices(P5, tmp_path).status == OK
    assert check_efa_devices(instance_type("g5.xlarge"), tmp_path).status == SKIPPED


def test_checkpoint_root_must_be_a_writable_mounted_file_system(tmp_path):
    assert check_checkpoint_root(tmp_path / "ckpt", None).status == OK
    assert not list((tmp_path / "ckpt").iterdir()), "the probe file is removed"
    not_mounted = check_checkpoint_root(tmp_path / "ckpt", tmp_path)
    assert not_mounted.status == FAILED and "is not a mount point" in not_mounted.detail
    (tmp_path / "file").write_text("x")
    unwritable = check_checkpoint_root(tmp_path / "file" / "ckpt", None)
    assert unwritable.status == FAILED and "is not writable" in unwritable.detail


def test_bus_bandwidth_follows_nccl_tests():
    # 1 GB in 10 ms across 16 ranks: algorithm bandwidth 100 GB/s, bus bandwidth x 2*15/16.
    assert bus_bandwidth_gbps(10**9, 0.01, 16) == pytest.approx(187.5)
    assert bus_bandwidth_gbps(10**9, 0.01, 1) == 0.0


def preflight(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    return subprocess.run(
        [*command, "-m", "trainer", "preflight", "--checkpoint-root", str(tmp_path)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )


def test_preflight_on_cpu_runs_what_applies_and_says_what_it_skipped(tmp_path):
    result = preflight(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ok  all-reduce" in result.stdout and "gloo, 2 ranks" in result.stdout
    assert "skipped  efa devices" in result.stdout
    assert "skipped  nccl network" in result.stdout
    assert result.stdout.rstrip().endswith("preflight: passed")


def test_preflight_fails_on_a_cpu_host_posing_as_p5(tmp_path):
    result = preflight(tmp_path, TRAINSTACK_INSTANCE_TYPE="p5.48xlarge")
    assert result.returncode != 0
    assert "expected 8 x H100 on p5.48xlarge, CUDA sees 0" in result.stdout
    assert result.stdout.rstrip().endswith("preflight: FAILED")
