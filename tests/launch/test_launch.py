"""The entrypoint maps AWS Batch node variables to a torchrun rendezvous for every node role."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from trainer.contract.image import efa_environment
from trainer.contract.retry import RETRY_EXIT_CODE as NODE_FAULT
from trainer.distributed.torchrun import LaunchError, Rendezvous
from trainer.launch.batch import rendezvous_from_env


def batch_env(index: int, nodes: int, main: int = 0, address: str | None = "10.0.1.17") -> dict[str, str]:
    env = {
        "AWS_BATCH_JOB_NODE_INDEX": str(index),
        "AWS_BATCH_JOB_NUM_NODES": str(nodes),
        "AWS_BATCH_JOB_MAIN_NODE_INDEX": str(main),
    }
    if index != main and address:
        env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = address
    return env


def test_main_node_is_rank_zero_and_hosts_the_store_on_its_own_address():
    assert rendezvous_from_env(batch_env(0, 4), own_address=lambda: "10.0.1.17") == Rendezvous(
        4, 0, "10.0.1.17"
    )


def test_child_node_joins_the_main_nodes_address():
    assert rendezvous_from_env(batch_env(3, 4)) == Rendezvous(4, 3, "10.0.1.17")


def test_main_node_index_need_not_be_zero():
    assert rendezvous_from_env(batch_env(2, 4, main=2), own_address=lambda: "10.0.1.9").node_rank == 0
    ranks = sorted(rendezvous_from_env(batch_env(i, 4, main=2)).node_rank for i in (0, 1, 3))
    assert ranks == [1, 2, 3]


def test_single_node_multinode_job_and_local_run_are_standalone():
    assert rendezvous_from_env(batch_env(0, 1)) == Rendezvous(1, 0, None)
    assert rendezvous_from_env({}) == Rendezvous(1, 0, None)
    assert rendezvous_from_env({}).torchrun_args(8, 29500, 0) == [
        "--standalone",
        "--nproc-per-node=8",
        "--max-restarts=0",
    ]


def test_static_rendezvous_arguments():
    assert Rendezvous(4, 3, "10.0.1.17").torchrun_args(8, 29500, 2) == [
        "--nnodes=4",
        "--node-rank=3",
        "--master-addr=10.0.1.17",
        "--master-port=29500",
        "--nproc-per-node=8",
        "--max-restarts=2",
    ]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            batch_env(1, 4, address=None),
            "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS is not set on child node 1",
        ),
        (
            {**batch_env(1, 4), "AWS_BATCH_JOB_NUM_NODES": "four"},
            "AWS_BATCH_JOB_NUM_NODES='four' is not an integer",
        ),
        (batch_env(5, 4), r"AWS_BATCH_JOB_NODE_INDEX=5.*must lie in 0\.\.3"),
        ({"AWS_BATCH_JOB_NODE_INDEX": "0"}, "AWS_BATCH_JOB_NUM_NODES is not set"),
    ],
)
def test_broken_node_variables_are_named(env, message):
    with pytest.raises(LaunchError, match=message):
        rendezvous_from_env(env)


def run_entrypoint(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    clean = {
        k: v for k, v in os.environ.items() if k not in efa_environment() and not k.startswith("AWS_BATCH")
    }
    return subprocess.run(
        [str(ROOT / "image" / "entrypoint.sh"), *args],
        env={**clean, "PATH": path, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_entrypoint_on_a_child_node_exports_efa_env_and_runs_preflight_then_train():
    result = run_entrypoint(
        "--dry-run",
        "--nproc-per-node",
        "8",
        "train",
        "--config",
        "c.yaml",
        env={**batch_env(2, 4), "NCCL_DEBUG": "INFO"},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "# NCCL_NET=AWS Libfabric" in lines
    assert "# CUDA_DEVICE_MAX_CONNECTIONS=1" in lines
    assert "# NCCL_DEBUG=INFO" in lines, "a value set by the job or the user wins over efa.env"
    preflight, train = lines[-2:]
    assert preflight.endswith("--master-port=29501 --nproc-per-node=8 --max-restarts=0 -m trainer preflight")
    assert "--nnodes=4 --node-rank=2 --master-addr=10.0.1.17" in preflight
    assert train.endswith(
        "--nnodes=4 --node-rank=2 --master-addr=10.0.1.17 --master-port=29500 --nproc-per-node=8 "
        "--max-restarts=0 -m trainer train --config c.yaml"
    )


def test_entrypoint_without_gpus_asks_for_a_process_count():
    result = run_entrypoint("train", "--config", "c.yaml", env={})
    assert result.returncode == 2
    assert "no GPUs visible; pass --nproc-per-node N" in result.stderr


def test_entrypoint_with_broken_batch_variables_starts_nothing():
    result = run_entrypoint("--dry-run", "--nproc-per-node", "8", "train", env=batch_env(1, 4, address=None))
    assert result.returncode == 2
    assert "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS is not set" in result.stderr
    assert "torch.distributed.run" not in result.stdout


@pytest.mark.slow
def test_launch_really_runs_torchrun_locally(tmp_path):
    """Local (no Batch variables): launch runs the preflight and then the verb under torchrun --standalone."""
    result = run_entrypoint(
        "--nproc-per-node",
        "2",
        "preflight",
        "--checkpoint-root",
        str(tmp_path / "ckpt"),
        # The launcher's own preflight checks the contract's checkpoint root (image/container.env: /fsx in the
        # image); a run outside the image names its own.
        env={"NCCL_NET": "Socket", "TRAINSTACK_CHECKPOINT_ROOT": str(tmp_path / "ckpt")},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("preflight: passed") == 2  # the launcher's own preflight, then the verb
    assert "gloo, 2 ranks" in result.stdout


def test_entrypoint_replaces_the_base_images_emptied_plugin_default():
    """The Dockerfile empties NGC's NCCL_NET_PLUGIN default; efa.env's value must then apply."""
    result = run_entrypoint(
        "--dry-run", "--nproc-per-node", "8", "train", env={**batch_env(0, 2), "NCCL_NET_PLUGIN": ""}
    )
    assert result.returncode == 0, result.stderr
    assert f"# NCCL_NET_PLUGIN={efa_environment()['NCCL_NET_PLUGIN']}" in result.stdout.splitlines()


def test_launch_returns_the_preflights_retry_code_that_torchrun_drops(tmp_path):
    """torchrun exits 1 for any failed rank; the job's retry strategy needs the preflight's NODE_FAULT."""
    result = run_entrypoint(
        "--nproc-per-node",
        "2",
        "train",
        "--config",
        "c.yaml",
        env={"TRAINSTACK_INSTANCE_TYPE": "p5.48xlarge", "TRAINSTACK_CHECKPOINT_ROOT": str(tmp_path)},
    )
    assert result.returncode == NODE_FAULT, result.stderr[-2000:]
    assert f"launch: preflight failed (exit {NODE_FAULT}); not starting train" in result.stderr


def test_direct_runs_the_verb_as_the_nodes_one_process_without_rendezvous_or_preflight():
    """A sweep's worker starts trainers of its own: not a torchrun rank, and no Batch or JobSet variable needed."""
    argv = (
        "--direct",
        "sweep-worker",
        "--sweep",
        "s.yaml",
        "--name",
        "n",
        "--dir",
        "/fsx/x",
        "--trials",
        "4",
    )
    result = run_entrypoint("--dry-run", *argv, env=batch_env(1, 4, address=None))
    assert result.returncode == 0, result.stderr
    last = result.stdout.splitlines()[-1]
    assert last.endswith("-m trainer sweep-worker --sweep s.yaml --name n --dir /fsx/x --trials 4")
    assert "torch.distributed.run" not in result.stdout and "preflight" not in result.stdout
    # For real: the verb itself runs, as one process (its own refusal of a missing sweep file comes back).
    result = run_entrypoint(*argv[:-4], "--dir", "/nonexistent", "--trials", "1", env={})
    assert result.returncode == 2 and "s.yaml" in result.stderr
    assert "torch.distributed.run" not in result.stderr
