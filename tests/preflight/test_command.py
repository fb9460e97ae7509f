"""The preflight's checks, each with the failure a broken node would show (recorded mountinfo, NVML return values,
pair bandwidths), and real runs on CPU: one node of two ranks, and two nodes (two torchrun agents) sharing tokens."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port
from trainer.contract.catalog import instance_type
from trainer.contract.retry import RETRY_EXIT_CODE as NODE_FAULT
from trainer.preflight.checks import (
    FAILED,
    OK,
    SKIPPED,
    bus_bandwidth_gbps,
    check_bandwidth,
    check_checkpoint_root,
    check_efa_devices,
    check_gpus,
)
from trainer.preflight.command import STATUS_FILE_ENV
from trainer.preflight.pairwise import judge, pair_rounds
from trainer.preflight.storage import lustre_problem, parse_mountinfo, unseen_tokens, write_token

P5 = instance_type("p5.48xlarge")
MOUNTINFO = json.loads((Path(__file__).parent / "fixtures" / "mountinfo.json").read_text())


def test_gpu_count_must_match_the_catalog():
    assert check_gpus(P5, 8).status == OK
    failed = check_gpus(P5, 7)
    assert failed.status == FAILED and failed.detail == "expected 8 x H100 on p5.48xlarge, CUDA sees 7"
    assert failed.node_fault, "a GPU missing is the node's fault: it leaves service and the job retries"
    assert check_gpus(None, 0).status == SKIPPED


def test_efa_device_count_must_match_the_catalog(tmp_path):
    for i in range(31):
        (tmp_path / f"uverbs{i}").touch()
    failed = check_efa_devices(P5, tmp_path)
    assert failed.status == FAILED and "32 EFA interfaces but 31" in failed.detail and failed.node_fault
    (tmp_path / "uverbs31").touch()
    assert check_efa_devices(P5, tmp_path).status == OK
    assert check_efa_devices(instance_type("g5.xlarge"), tmp_path).status == SKIPPED


def test_lustre_is_told_from_a_bind_mount_of_the_root_volume():
    recorded = MOUNTINFO["root_volume"]["line"] + "\n" + MOUNTINFO["bind_mount_of_root_volume"]["line"]
    bind = MOUNTINFO["bind_mount_of_root_volume"]["mount_point"]
    (mount,) = [m for m in parse_mountinfo(recorded) if m.mount_point == bind]
    assert (mount.fstype, mount.root, mount.source) == ("ext4", "/tmp/mi/src", "/dev/vda")
    problem = lustre_problem(bind, recorded)
    assert problem.startswith(f"{bind} is on ext4 (/dev/vda:/tmp/mi/src mounted at {bind}), not Lustre")
    lustre = MOUNTINFO["root_volume"]["line"] + "\n" + MOUNTINFO["lustre"]["line"]
    assert lustre_problem("/fsx", lustre) is None
    assert lustre_problem("/fsx/checkpoints/run", lustre) is None
    assert lustre_problem("/fsx", MOUNTINFO["root_volume"]["line"]).startswith(
        "/fsx is on ext4 (/dev/vda mounted at /)"
    )
    local_locks = MOUNTINFO["lustre"]["line"].replace(",flock,", ",localflock,")
    assert lustre_problem("/fsx", local_locks) == (
        "/fsx is Lustre mounted without flock (rw,localflock,lazystatfs): a run's lock on its directory would not "
        "hold across nodes; mount it with -o flock (infra/node_bootstrap.py)"
    )


def test_checkpoint_root_must_be_writable_and_on_lustre_in_the_cluster(tmp_path):
    assert check_checkpoint_root(tmp_path / "ckpt", None, "").status == OK
    assert not list((tmp_path / "ckpt").iterdir()), "the probe file is removed"
    on_root = check_checkpoint_root(tmp_path / "ckpt", Path("/fsx"), MOUNTINFO["root_volume"]["line"])
    assert on_root.status == FAILED and "not Lustre" in on_root.detail and on_root.node_fault
    lustre = check_checkpoint_root(tmp_path / "ckpt", Path("/fsx"), MOUNTINFO["lustre"]["line"])
    assert lustre.status == OK and "on Lustre (/fsx)" in lustre.detail
    (tmp_path / "file").write_text("x")
    unwritable = check_checkpoint_root(tmp_path / "file" / "ckpt", None, "")
    assert unwritable.status == FAILED and "is not writable" in unwritable.detail


def test_every_other_nodes_token_must_be_read_back(tmp_path):
    write_token(tmp_path, 0, "a0")
    write_token(tmp_path, 1, "b1")
    assert unseen_tokens(tmp_path, {0: "a0", 1: "b1"}, node=0) == []
    missing = unseen_tokens(tmp_path, {0: "a0", 1: "b1", 2: "c2"}, node=0)
    assert missing == ["node 2's node-2.token: No such file or directory"]
    write_token(tmp_path, 1, "stale")
    assert unseen_tokens(tmp_path, {0: "a0", 1: "b1"}, node=0) == [
        "node 1's node-1.token holds 'stale', not the token node 1 wrote"
    ]


def test_bandwidth_against_the_floor():
    floor = P5.bus_bandwidth_floor
    assert check_bandwidth(floor.floor_gbps + 1, floor.floor_gbps, floor.source).status == OK
    below = check_bandwidth(floor.floor_gbps - 1, floor.floor_gbps, floor.source)
    assert below.status == FAILED and "pairwise test follows" in below.detail
    assert check_bandwidth(1.0, None, "").status == SKIPPED


def test_pairwise_rounds_meet_new_partners_and_name_the_slow_node():
    rounds = pair_rounds(4, 3)
    pairs = [pair for round_pairs in rounds for pair in round_pairs]
    assert len(pairs) == len(set(pairs)) == 6, "three rounds of four nodes meet every partner once"
    for round_pairs in rounds:
        nodes = [n for pair in round_pairs for n in pair]
        assert len(nodes) == len(set(nodes)), "a round's pairs are disjoint, so they run at once"
    assert [len(r) for r in pair_rounds(3, 3)] == [1, 1, 1]
    slow_node_2 = {pair: (40.0 if 2 in pair else 300.0) for pair in pairs}
    assert judge(slow_node_2, 125.4) == ([2], [])
    # Two nodes alone cannot be told apart; two slow nodes explain all their pairs.
    assert judge({(0, 1): 40.0}, 125.4) == ([], [(0, 1)])
    both = {pair: (40.0 if {1, 2} & set(pair) else 300.0) for pair in pairs}
    assert judge(both, 125.4) == ([1, 2], [])


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
        cwd=ROOT,
    )


def test_preflight_on_cpu_runs_what_applies_and_says_what_it_skipped(tmp_path):
    result = preflight(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ok  node 0" in result.stdout and "gloo, 2 ranks on 1 nodes" in result.stdout
    assert "skipped  node 0" in result.stdout and "efa devices" in result.stdout
    assert "nccl network" in result.stdout
    assert result.stdout.rstrip().endswith("preflight: passed")


def test_preflight_fails_on_a_cpu_host_posing_as_p5_with_the_retry_code(tmp_path):
    status = tmp_path / "status"
    result = preflight(tmp_path, TRAINSTACK_INSTANCE_TYPE="p5.48xlarge", **{STATUS_FILE_ENV: str(status)})
    assert result.returncode != 0
    assert status.read_text() == str(NODE_FAULT), "torchrun exits 1; `trainer launch` returns this status"
    assert "expected 8 x H100 on p5.48xlarge, CUDA sees 0" in result.stdout
    assert result.stdout.rstrip().endswith(f"preflight: FAILED: node fault, exit {NODE_FAULT} (retry)")


def two_nodes(tmp_path: Path, *args: str) -> list[subprocess.CompletedProcess]:
    """Two torchrun agents on this machine, one rank each, as nodes 0 and 1 of one job."""
    port = free_port()
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node-rank={node}",
                "--nproc-per-node=1",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                "-m",
                "trainer",
                "preflight",
                "--checkpoint-root",
                str(tmp_path / "ckpt"),
                *args,
            ],
            env=os.environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for node in (0, 1)
    ]
    results = []
    for agent in agents:
        stdout, stderr = agent.communicate(timeout=240)
        results.append(subprocess.CompletedProcess(agent.args, agent.returncode, stdout, stderr))
    return results


@pytest.mark.slow
def test_two_nodes_share_tokens_and_an_unexplained_slow_pair_is_reported(tmp_path):
    """A floor no CPU reaches: the pairwise test runs, and with two nodes says it cannot pin the pair on one."""
    main, child = two_nodes(tmp_path, "--floor-gbps", "1000000", "--shared-dir", str(tmp_path / "shared"))
    assert main.returncode == 1, main.stdout + main.stderr
    assert child.returncode == 1
    out = main.stdout
    assert "gloo, 2 ranks on 2 nodes" in out
    assert "ok  node 0" in out and "ok  node 1" in out
    assert "read the tokens of all 1 other nodes" in out
    assert "below the floor 1000000.0 GB/s (--floor-gbps); pairwise test follows" in out
    assert "pairs [(0, 1)] cannot be pinned on one node" in out
    assert sorted(p.name for p in (tmp_path / "shared").iterdir()) == ["node-0.token", "node-1.token"]
    assert out.rstrip().endswith("preflight: FAILED")
