"""Health checks (docs/trainer.md#health-stragglers-and-hangs): a rank slowed through TRAINSTACK_FAULT is named
within a few straggler windows; a hung rank ends the run with every rank's stacks and flight recorder, the
collective named with the rank that never entered it, and the retry exit code.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import free_port
from tests.trainer.test_resilience import Training
from trainer.config import ConfigError, load_config
from trainer.contract import retry
from trainer.faults import Fault
from trainer.health import report
from trainer.health.collectives import CollectiveTracker
from trainer.health.straggler import NOT_AVAILABLE, StragglerDetector, instance_id
from trainer.health.watchdog import hang_summary

# The median and the windows.


def test_a_rank_above_k_times_the_median_for_n_windows_in_a_row_is_reported():
    detector = StragglerDetector(factor=1.5, windows=3)
    window = [1.0, 1.1, 0.9, 2.0]  # median 1.05: rank 3 is 1.9x
    assert detector.observe(window) == []
    assert detector.observe(window) == []
    (slow,) = detector.observe(window)
    assert (slow.rank, slow.windows, slow.median_s) == (3, 3, 1.05)
    assert slow.ratio == pytest.approx(2.0 / 1.05)
    assert [s.windows for s in detector.observe(window)] == [4]  # reported while it stays slow


def test_a_rank_back_under_the_line_starts_counting_again():
    detector = StragglerDetector(factor=1.5, windows=2)
    detector.observe([1.0, 1.0, 3.0])
    detector.observe([1.0, 1.0, 1.4])  # under 1.5 x 1.0: the count restarts
    assert detector.observe([1.0, 1.0, 3.0]) == []
    assert [s.rank for s in detector.observe([1.0, 1.0, 3.0])] == [2]


def test_exactly_k_times_the_median_is_not_slow_and_the_median_of_an_even_count_is_the_middle_mean():
    detector = StragglerDetector(factor=2.0, windows=1)
    assert detector.observe([1.0, 1.0, 3.0, 2.0]) == []  # median 1.5: 3.0 is exactly 2x
    assert [s.rank for s in detector.observe([1.0, 1.0, 3.1, 2.0])] == [2]
    assert detector.observe([0.0, 0.0, 0.0]) == []  # no time measured: nobody is slow


def test_health_settings_are_checked_against_the_process_group_timeout():
    with pytest.raises(ConfigError) as error:
        load_config(
            "tests/support/tiny.yaml",
            ["parallel.distributed_timeout_minutes=1", "health.hang_min_seconds=60"],
        )
    assert (
        "health.hang_min_seconds = 60 is not below parallel.distributed_timeout_minutes = 1 (60 s): a stuck "
        "collective would time out before the watchdog dumps the stacks" in str(error.value)
    )
    cfg = load_config(
        "tests/support/tiny.yaml", ["parallel.distributed_timeout_minutes=1", "health.watchdog=false"]
    )
    assert cfg.health.straggler_interval == 20 and cfg.health.straggler_factor == 1.5
    with pytest.raises(ConfigError, match=r"health.straggler_factor = 1: Input should be greater than 1"):
        load_config("tests/support/tiny.yaml", ["health.straggler_factor=1"])


def test_slow_fault_needs_its_seconds():
    assert Fault.parse("slow step=2 rank=1 seconds=0.5") == Fault("slow", 2, rank=1, seconds=0.5)
    with pytest.raises(ValueError, match="needs seconds=S"):
        Fault.parse("slow step=2 rank=1")
    with pytest.raises(ValueError, match="needs seconds=S: what every rank's step compute reads as"):
        Fault.parse("clock step=1")


def test_the_fault_clock_reads_every_rank_alike_and_adds_a_slow_ranks_seconds(monkeypatch):
    from trainer import faults

    monkeypatch.setenv(faults.FAULT_ENV, "clock step=3 seconds=1; slow step=4 rank=1 seconds=2")
    faults._requested.cache_clear()
    try:
        for rank, readings in (("0", [0.25, 1.0, 1.0]), ("1", [0.25, 1.0, 3.0])):
            monkeypatch.setenv("RANK", rank)
            assert [faults.step_compute(step, 0.25) for step in (2, 3, 4)] == readings
    finally:
        monkeypatch.delenv(faults.FAULT_ENV)
        faults._requested.cache_clear()


# The instance id: IMDSv2's token flow against a real HTTP server playing IMDS.


def test_instance_id_comes_from_imdsv2_with_a_session_token(imds):
    assert instance_id(endpoint=imds) == "i-0123456789abcdef0"


def test_instance_id_is_na_at_once_where_nothing_answers():
    port = free_port()  # nothing listens there
    started = time.monotonic()
    assert instance_id(endpoint=f"http://127.0.0.1:{port}") == NOT_AVAILABLE
    assert time.monotonic() - started < 2


# The retry exit code, through the supervisor.


def test_the_supervisor_exits_with_a_ranks_retry_request_only_when_torchrun_failed(tmp_path, monkeypatch):
    request = tmp_path / "exit-request"
    assert retry.supervised_status(1, request) == 1  # no request: torchrun's status
    monkeypatch.setenv(retry.EXIT_REQUEST_ENV, str(request))
    assert retry.request_retry() == retry.RETRY_EXIT_CODE == 75
    assert retry.supervised_status(1, request) == 75
    assert retry.supervised_status(0, request) == 0  # a restart that then succeeded


# The collective tracker on a real (one-process) gloo group.


@pytest.fixture
def gloo_group(monkeypatch):
    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


def test_tracker_records_each_collective_its_group_number_and_caller_and_uninstalls(gloo_group):
    original = torch.distributed.all_reduce
    tracker = CollectiveTracker()
    tracker.install()
    try:
        started = time.perf_counter()
        torch.distributed.all_reduce(torch.ones(2))
        torch.distributed.barrier()
        assert tracker.current is None
        last = tracker.last_completed
        assert (last.name, last.ranks, last.number) == ("torch.distributed.barrier", (0,), 2)
        assert (
            last.caller
            == f"{__name__}.test_tracker_records_each_collective_its_group_number_and_caller_and_uninstalls"
        )
        assert 0 < tracker.blocked_since(started) < time.perf_counter() - started
        assert tracker.blocked_since(time.perf_counter()) == 0
        group = torch.distributed.new_group([0])
        torch.distributed.all_reduce(torch.ones(1), torch.distributed.ReduceOp.SUM, group)  # group positional
        torch.distributed.broadcast(torch.ones(1), src=0, group=group)
        # Counted by members: groups with the same ranks count together, alike on every member.
        assert (tracker.last_completed.name, tracker.last_completed.number) == (
            "torch.distributed.broadcast",
            4,
        )
        # isend/irecv stay torch's own: P2POp accepts only those two functions.
        torch.distributed.P2POp(torch.distributed.isend, torch.ones(1), 0)
    finally:
        tracker.uninstall()
    assert torch.distributed.all_reduce is original


# The hang summary from the ranks' reports.


def _state(rank, current=None, last=None):
    return {
        "rank": rank,
        "host": f"node{rank // 2}",
        "instance_id": "n/a",
        "step": 2,
        "current": current,
        "last_completed": last,
    }


GRAD_NORM = {
    "name": "torch.distributed.all_reduce",
    "ranks": [0, 1, 2, 3],
    "number": 41,
    "caller": "megatron.core.optimizer.clip_grads.get_grad_norm_fp32",
    "seconds": 30.0,
}


def test_hang_summary_names_the_collective_and_the_ranks_that_never_entered_it():
    earlier = {**GRAD_NORM, "number": 40, "caller": "trainer.loop._max_over_ranks"}
    states = {0: _state(0, GRAD_NORM), 1: _state(1, last=earlier), 3: _state(3, GRAD_NORM)}  # 2: no report
    summary = hang_summary(states, world_size=4, idle=31.0, step=2)
    assert (summary["entered"], summary["never_entered"]) == ([0, 3], [1, 2])
    assert summary["message"] == (
        "no step for 31 s after step 2: ranks 0, 3 wait in torch.distributed.all_reduce #41 on ranks 0, 1, 2, 3 "
        "(called from megatron.core.optimizer.clip_grads.get_grad_norm_fp32); rank 1 on node0 (n/a) never "
        "entered it: not in a collective; last completed torch.distributed.all_reduce #40 on ranks 0, 1, 2, 3 "
        "(called from trainer.loop._max_over_ranks); rank 2 sent no report (dead, or stuck holding the Python "
        "interpreter)"
    )


def test_hang_summary_when_no_rank_is_in_a_collective():
    summary = hang_summary({0: _state(0), 1: _state(1)}, world_size=2, idle=10.0, step=5)
    assert summary["collective"] is None and summary["never_entered"] == [0, 1]
    assert "no rank is in a collective" in summary["message"]


def test_health_file_summary_line(tmp_path):
    entry = {"rank": 1, "host": "ip-10-0-1-7", "instance_id": "i-0abc", "ratio": 3.04, "windows": 3}
    report.write_health(
        tmp_path, "stragglers", {"step": 40, "interval": 10, "median_s": 0.3, "ranks": [entry]}
    )
    assert report.summary(report.read_health(tmp_path)) == (
        "stragglers at step 40: rank 1 on ip-10-0-1-7 (i-0abc) 3.0x the median step compute time for 3 windows"
    )
    report.remove(tmp_path)
    assert report.read_health(tmp_path) == {}


# End to end on the real trainer (torchrun, gloo).

DATA_PARALLEL_3 = ("schedule.global_batch_size=6", "checkpoint.save_interval=null")


@pytest.mark.slow
def test_a_slowed_rank_is_named_within_a_few_windows(tmp_path, tiny_config):
    run = Training(
        tmp_path,
        "straggler",
        tiny_config,
        *DATA_PARALLEL_3,
        "schedule.train_iters=8",
        "health.straggler_interval=2",
        "health.straggler_windows=2",
        # On the fault clock every rank's step compute reads 1 s and rank 1's 3 s, however loaded the machine.
        fault="clock step=1 seconds=1; slow step=1 rank=1 seconds=2",
        options=("--nproc", "3"),
    )
    status, output = run.wait()
    assert status == 0, output[-6000:]
    host = socket.gethostname()
    assert f"step 4: straggler: rank 1 on {host} (" in output  # second window of 2 steps: the earliest
    records = {r["step"]: r for r in run.records()}
    assert "stragglers" not in records[2]
    for step in (4, 6, 8):
        (entry,) = records[step]["stragglers"]
        assert (entry["rank"], entry["host"], entry["windows"]) == (1, host, step // 2)
        assert (entry["compute_s"], entry["median_s"], entry["ratio"]) == (3.0, 1.0, 3.0)
    health = json.loads((run.run_dir / "health.json").read_text())
    assert [r["rank"] for r in health["stragglers"]["ranks"]] == [1]
    assert f"health: stragglers at step 8: rank 1 on {host} (" in output  # the end-of-run line


@pytest.mark.slow
def test_a_hung_rank_ends_the_run_with_dumps_naming_the_collective_and_the_retry_code(tmp_path, tiny_config):
    run = Training(
        tmp_path,
        "hung",
        tiny_config,
        "schedule.train_iters=6",
        "checkpoint.save_interval=null",
        "health.hang_min_seconds=4",
        fault="hang step=3 rank=1 seconds=120",
        options=("--nproc", "2"),
    )
    status, output = run.wait()
    assert status == retry.RETRY_EXIT_CODE, output[-6000:]
    hang = run.run_dir / "hang"
    summary = json.loads((hang / "summary.json").read_text())
    assert (summary["entered"], summary["never_entered"], summary["step"]) == ([0], [1], 2)
    collective = summary["collective"]
    assert collective["name"] == "torch.distributed.all_reduce" and collective["ranks"] == [0, 1]
    assert f"train: hang: {summary['message']}; exiting 75 (retry)" in output
    assert f"rank 1 on {socket.gethostname()} (" in summary["message"]
    assert "never entered it: not in a collective" in summary["message"]
    waiting, hung = (hang / "rank0.txt").read_text(), (hang / "rank1.txt").read_text()
    assert "in torch.distributed.all_reduce #" in waiting and "Python stacks, every thread" in waiting
    assert "not in a collective" in hung and "inject_in_step" in hung  # its stack: asleep in the fault
    for rank in (0, 1):  # PyTorch's flight recorder records gloo's collectives too (torch 2.13)
        dump = pickle.loads((hang / "flight_recorder" / f"rank_{rank}").read_bytes())
        assert any(e["profiling_name"] == "gloo:all_reduce" for e in dump["entries"])
    assert json.loads((run.run_dir / "health.json").read_text())["hang"]["never_entered"] == [1]


def test_gpu_runs_get_the_nccl_flight_recorder_dumping_into_the_run_directory(tmp_path, monkeypatch):
    from trainer.health.monitor import prepare_flight_recorder

    names = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_ENABLE_MONITORING", "TORCH_NCCL_DUMP_ON_TIMEOUT")
    for name in (*names, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "20000")  # the user's setting wins
    cfg = load_config("tests/support/tiny.yaml", [f"logging.run_dir={tmp_path}"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    prepare_flight_recorder(cfg)
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT" not in os.environ  # CPU: gloo has no dump on timeout
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    prepare_flight_recorder(cfg)
    assert [os.environ[name] for name in names] == ["20000", "1", "1"]
    assert os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(tmp_path / "hang" / "nccl_trace_rank_")
    assert (tmp_path / "hang").is_dir()


def test_a_process_forked_beside_the_hang_watchdog_starts_without_an_error(tmp_path):
    # A background checkpoint save forks its writer while the watchdog thread runs; the child's after-fork hook
    # (CPython threading._after_fork) stops every other thread through Thread._stop.
    code = f"""
import os
from pathlib import Path
import torch.distributed as dist
dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
from trainer.health.collectives import CollectiveTracker
from trainer.health.watchdog import HangWatchdog
watchdog = HangWatchdog(
    CollectiveTracker(), lambda: None, Path("{tmp_path}"), min_seconds=60, step_multiple=3, timeout_seconds=60
)
watchdog.start()
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
watchdog.stop()
dist.destroy_process_group()
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "_after_fork" not in result.stderr and "TypeError" not in result.stderr, result.stderr[-2000:]
