"""Faults the trainer meets and what it does (docs/trainer.md#faults-and-resilience): killed ranks restart and
resume exactly, torn or garbage checkpoints are never loaded, SIGTERM saves and exits 0, non-finite steps are
skipped, a stuck rank times out naming the collective, a full disk fails the save cleanly.

The end-to-end runs start the real trainer (`python -m trainer train`, as `make train` does, or the image's
entrypoint) and inject faults through TRAINSTACK_FAULT (trainer/faults.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.training import TIMEOUT_S, sealed_checkpoint
from trainer.checkpoint.formats import resolve
from trainer.checkpoint.megatron import saved_state
from trainer.checkpoint.store import LATEST, CheckpointError, damage, latest_checkpoint
from trainer.faults import Fault, SkipCounter, TrainingStopped

# A short run that saves twice on the way: 12 steps, a checkpoint every 4.
SHORT = ("schedule.train_iters=12", "checkpoint.save_interval=4")


class Training:
    """One `python -m trainer train` (or entrypoint) run in its own session, its output in a log file."""

    def __init__(
        self,
        base: Path,
        name: str,
        config: Path,
        *settings: str,
        fault: str = "",
        options: tuple[str, ...] = (),
        command: tuple[str, ...] = (sys.executable, "-m", "trainer"),
        env: dict[str, str] | None = None,
    ):
        self.run_dir = base / name
        self.log = base / f"{name}.log"
        overrides = [arg for s in (f"logging.run_dir={self.run_dir}", *settings) for arg in ("--set", s)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAINSTACK_FAULT": fault, **(env or {})}
        with self.log.open("w") as output:
            self.process = subprocess.Popen(
                [*command, "train", "--config", str(config), *overrides, *options],
                cwd=ROOT,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a timeout takes down every process it started
            )

    def wait(self) -> tuple[int, str]:
        try:
            self.process.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        return self.process.returncode, self.log.read_text()

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    def records(self) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def losses(self) -> dict[int, float]:
        """Each step's loss; a step run again after a restart keeps its last record."""
        return {r["step"]: r["loss"] for r in self.records() if r["loss"] is not None}


def _completed(run: Training) -> str:
    status, output = run.wait()
    assert status == 0, f"exit {status}:\n{output[-6000:]}"
    return output


def _failed(run: Training) -> str:
    status, output = run.wait()
    assert status not in (0, -signal.SIGKILL), f"exit {status}:\n{output[-6000:]}"
    return output


# Checkpoint integrity: the manifest a save writes last.


def test_truncated_and_garbage_checkpoints_are_skipped_with_a_warning_naming_them(tmp_path):
    good = sealed_checkpoint(tmp_path / "iter_0000001")
    truncated = sealed_checkpoint(tmp_path / "iter_0000002")
    (truncated / "common.pt").write_bytes(b"wei")  # a copy cut short
    scrambled = sealed_checkpoint(tmp_path / "iter_0000003")
    (scrambled / "common.pt").write_bytes(b"garbage")  # same size, other bytes
    unsealed = tmp_path / "iter_0000004"
    unsealed.mkdir()
    (unsealed / "common.pt").write_bytes(os.urandom(64))  # never finished, or not ours
    (tmp_path / LATEST).write_text("iter_0000004\n")
    warnings: list[str] = []
    assert latest_checkpoint(tmp_path, warn=warnings.append) == good
    assert warnings == [
        f"skipping checkpoint {unsealed}: no manifest.json (a save or a copy that did not finish, or not a "
        "trainer checkpoint)",
        f"skipping checkpoint {scrambled}: common.pt does not hold what the save wrote (XXH3-128 differs)",
        f"skipping checkpoint {truncated}: common.pt is 3 bytes, the save wrote 7",
    ]


def test_a_damaged_checkpoint_given_by_path_is_refused_not_loaded(tmp_path):
    checkpoint = sealed_checkpoint(tmp_path / "iter_0000005")
    (checkpoint / "metadata.json").write_text("{}")  # not in its manifest: written after the save
    assert damage(checkpoint) is None  # extra files are not damage; missing or changed ones are
    (checkpoint / "common.pt").unlink()
    with pytest.raises(CheckpointError, match=r"iter_0000005' is damaged, not loaded: common.pt is missing"):
        resolve(checkpoint)


# Non-finite steps: counted, and too many in a row stop the run.


def test_skip_counter_resets_on_a_good_step_and_stops_at_the_limit_in_a_row(tmp_path):
    skips = SkipCounter(limit=3, total=4)  # 4 skipped before a resume
    newest = lambda: tmp_path / "iter_0000004"  # noqa: E731
    for step, skipped in [(5, True), (6, True), (7, False), (8, True), (9, True)]:
        skips.record(step, skipped, newest)
    assert (skips.in_a_row, skips.total) == (2, 8)
    with pytest.raises(TrainingStopped) as stopped:
        skips.record(10, True, newest)
    assert str(stopped.value).startswith(
        "steps 8 to 10: 3 steps in a row had a non-finite loss or gradient norm "
        f"(optimizer.max_consecutive_skips = 3); stopped without saving, so the newest checkpoint, {newest()},"
    )


def test_finite_means_both_loss_and_gradient_norm():
    assert SkipCounter.finite(2.5, 0.7)
    assert not SkipCounter.finite(float("nan"), 0.7)
    assert not SkipCounter.finite(2.5, float("inf"))


def test_fault_specs_name_what_is_wrong():
    assert Fault.parse("kill step=13 rank=1 restart=0") == Fault("kill", 13, rank=1, restart=0)
    with pytest.raises(ValueError, match="unknown fault 'explode'; known: kill, hang, nan-grad"):
        Fault.parse("explode step=1")
    with pytest.raises(ValueError, match="needs step=N"):
        Fault.parse("kill rank=1")


def test_a_kill_in_save_kills_the_rank_before_its_writer_and_the_writing_process_last(monkeypatch, tmp_path):
    """Killed the other way round, a loaded machine could leave the rank running long enough to see its writer's
    death as a failed save and exit 1 itself (the torn-save test below failed so once under load)."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    from trainer import faults

    monkeypatch.setenv(faults.FAULT_ENV, "kill-in-save step=8 rank=0")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    faults._requested.cache_clear()
    monkeypatch.setattr(filesystem_async, "_write_item", lambda *args, **kwargs: "written")
    killed: list[tuple[int, int]] = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, number: killed.append((pid, number)))
    rank = (
        1 << 22
    ) | 7  # above the default pid_max, no process here; in a set of two it comes last (hash & 7)
    try:
        with faults.inject_in_save(8, rank_pid=rank), (tmp_path / "item").open("wb") as stream:
            assert filesystem_async._write_item("transforms", stream, b"data") == "written"
    finally:
        faults._requested.cache_clear()
    assert killed == [(rank, signal.SIGKILL), (os.getpid(), signal.SIGKILL)]


# End to end on the real trainer.


@pytest.mark.slow
def test_torn_save_and_killed_rank_restart_resume_and_end_with_the_uninterrupted_losses(
    tmp_path, tiny_config
):
    layout = ("parallel.pipeline_model_parallel_size=2", *SHORT)  # 2 ranks, each holding half the layers
    straight = Training(tmp_path, "straight", tiny_config, *layout)
    _completed(straight)

    # Rank 1 dies writing step 8's checkpoint (in the background: saves on the interval are asynchronous), and
    # with no restarts allowed the run ends there.
    torn = Training(tmp_path, "faulty", tiny_config, *layout, fault="kill-in-save step=8 rank=1")
    output = _failed(torn)
    # The fault struck: torchrun's summary names rank 1 killed by SIGKILL.
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)\n\s*exitcode\s*: -9 ", output), output[-3000:]
    checkpoints = torn.checkpoints
    assert (checkpoints / LATEST).read_text() == "iter_0000004\n"
    assert damage(checkpoints / "iter_0000004") is None
    # Nothing else was published. What the dead rank was writing may stay as iter_0000008.tmp or be gone: rank 0,
    # stopping on the SIGTERM torchrun sends the survivors, may stage a stop save, and store.stage sweeps unfinished
    # saves first (when is up to the machine's load, so the test does not ask).
    assert [path.name for path in checkpoints.glob("iter_*") if path.suffix != ".tmp"] == ["iter_0000004"]
    # A directory of garbage named like a checkpoint, and named by `latest` (a copy from elsewhere, cut short).
    garbage = checkpoints / "iter_0000006"
    garbage.mkdir()
    (garbage / "common.pt").write_bytes(os.urandom(256))
    (checkpoints / LATEST).write_text("iter_0000006\n")

    # Started again (from iter_0000004), rank 0 dies in step 10; torchrun restarts both, from iter_0000008. Its
    # step 8 save is synchronous here: a background one is published only once written, which may come after step
    # 10 (then the restart resumes from iter_0000004, as the torn save above shows).
    faulty = Training(
        tmp_path,
        "faulty",
        tiny_config,
        *layout,
        "checkpoint.async_save=false",
        fault="kill step=10 rank=0 restart=0",
        options=("--max-restarts", "1"),
    )
    output = _completed(faulty)
    assert f"warning: skipping checkpoint {garbage}: no manifest.json" in output
    assert f"resumed from {checkpoints / 'iter_0000004'} (step 4" in output
    assert f"resumed from {checkpoints / 'iter_0000008'} (step 8" in output
    assert faulty.losses() == straight.losses()
    assert (checkpoints / LATEST).read_text() == "iter_0000012\n"


@pytest.mark.slow
def test_a_killed_ranks_writer_and_its_helpers_do_not_outlive_it_under_restarts(tmp_path, tiny_config):
    import psutil

    from trainer.distributed.torchrun import ORPHAN_CHECK_SECONDS

    # Rank 0 dies in step 5 with background saves behind it (its niced writer process and the processes it forked,
    # multiprocessing's resource tracker); torchrun restarts it and the run goes on.
    run = Training(
        tmp_path,
        "orphans",
        tiny_config,
        "schedule.train_iters=100000",  # still training when looked at, however fast this machine is
        "checkpoint.save_interval=2",
        fault="kill step=5 rank=0 restart=0",
        options=("--max-restarts", "1"),
    )
    supervisor = psutil.Process(run.process.pid)
    deadline = time.monotonic() + TIMEOUT_S
    while not any(r["step"] >= 8 for r in run.records()) and time.monotonic() < deadline:
        time.sleep(0.2)  # steps past the kill: the restarted attempt is training
    time.sleep(3 * ORPHAN_CHECK_SECONDS)
    children, zombies = _live_and_dead_children(supervisor)
    # A helper that ends on its own is re-parented to the supervisor (the subreaper) and is a zombie until its next
    # check reaps it: dead, holding no memory, and gone two checks later.
    time.sleep(2 * ORPHAN_CHECK_SECONDS)
    _, still_dead = _live_and_dead_children(supervisor)
    assert run.process.poll() is None, "the run ended before its children were looked at"
    run.process.send_signal(signal.SIGTERM)  # a save at the next step, then exit 0
    _completed(run)
    assert len(children) == 1 and "trainer.distributed.torchrun" in children[0], children
    assert not zombies & still_dead, f"zombies not reaped by the supervisor: {sorted(zombies & still_dead)}"


def _live_and_dead_children(supervisor) -> tuple[list[str], set[int]]:
    """The supervisor's live children (their command lines) and its zombie children (their pids)."""
    import psutil

    live, dead = [], set()
    for child in supervisor.children():
        try:
            live.append(" ".join(child.cmdline()[:4]))
        except psutil.ZombieProcess:
            dead.add(child.pid)
        except psutil.NoSuchProcess:
            pass  # reaped between the listing and the look
    return live, dead


@pytest.mark.slow
def test_fresh_starts_over_once_and_a_restarted_rank_resumes_instead(tmp_path, tiny_config):
    straight = Training(tmp_path, "straight", tiny_config, *SHORT)
    _completed(straight)
    # The run directory already holds a finished run: --fresh drops it, then rank 0 dies in step 10 and torchrun
    # restarts the ranks with the same command line, --fresh included.
    (tmp_path / "straight.log").rename(tmp_path / "straight-first.log")
    again = Training(
        tmp_path,
        "straight",
        tiny_config,
        *SHORT,
        "checkpoint.async_save=false",  # step 8's checkpoint published before the kill, whatever the timing
        fault="kill step=10 rank=0 restart=0",
        options=("--fresh", "--max-restarts", "1"),
    )
    output = _completed(again)
    assert output.count("resumed from") == 1, output[
        -4000:
    ]  # the first attempt started over, the restart not
    assert f"resumed from {again.checkpoints / 'iter_0000008'} (step 8" in output
    assert (again.checkpoints / LATEST).read_text() == "iter_0000012\n"


@pytest.mark.parametrize(
    ("environment", "first"),
    [
        ({}, True),
        ({"TORCHELASTIC_RESTART_COUNT": "0", "AWS_BATCH_JOB_ATTEMPT": "1"}, True),
        ({"TORCHELASTIC_RESTART_COUNT": "1"}, False),
        ({"AWS_BATCH_JOB_ATTEMPT": "2"}, False),
    ],
)
def test_only_the_first_attempt_counts_as_first(monkeypatch, environment, first):
    from trainer.distributed.local import first_attempt

    for name in ("TORCHELASTIC_RESTART_COUNT", "AWS_BATCH_JOB_ATTEMPT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert first_attempt() is first


GRACE = ("--stop-grace-seconds", "120")
ENTRYPOINT = (str(ROOT / "image" / "entrypoint.sh"), "--skip-preflight", "--nproc-per-node", "1", *GRACE)
MAKE_TRAIN = (sys.executable, "-m", "trainer")


@pytest.mark.slow
@pytest.mark.parametrize("command", [MAKE_TRAIN, ENTRYPOINT], ids=["make-train", "image"])
def test_sigterm_saves_at_the_next_step_boundary_and_exits_0(tmp_path, tiny_config, command):
    # The image's entrypoint execs the launcher, as in a Batch container where it is PID 1.
    environment = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    run = Training(
        tmp_path,
        "stopped",
        tiny_config,
        "schedule.train_iters=1000",
        "checkpoint.save_interval=500",
        options=GRACE if command == MAKE_TRAIN else (),  # the launcher takes it before the verb
        command=command,
        env=environment,
    )
    deadline = time.monotonic() + TIMEOUT_S
    while not [r for r in run.records() if r["step"] >= 2] and time.monotonic() < deadline:
        time.sleep(0.2)
    run.process.send_signal(signal.SIGTERM)  # what Batch sends on cancel or Spot reclaim, to PID 1
    output = _completed(run)  # 0: every rank saved and stopped within the grace period
    last = run.records()[-1]["step"]
    assert 2 <= last < 1000
    assert f"step {last}: stopped on SIGTERM" in output
    assert (run.checkpoints / LATEST).read_text() == f"iter_{last:07d}\n"
    assert damage(run.checkpoints / f"iter_{last:07d}") is None


@pytest.mark.slow
def test_a_stop_on_an_interval_saves_step_leaves_a_checkpoint_that_loads_at_any_layout(tmp_path, tiny_config):
    # SIGTERM in step 4, whose interval save goes out in the background as dp_reshardable: the stop at the next
    # step boundary saves step 4 again, synchronously and fully_reshardable, as docs/trainer.md promises.
    run = Training(tmp_path, "stop", tiny_config, *SHORT, fault="sigterm step=4")  # saves every 4 steps
    output = _completed(run)
    assert "step 4: stopped on SIGTERM" in output
    assert (run.checkpoints / LATEST).read_text() == "iter_0000004\n"
    assert saved_state(run.checkpoints / "iter_0000004")["optimizer_format"] == "fully_reshardable"


@pytest.mark.slow
def test_a_signal_to_torchrun_itself_is_told_in_one_line_without_tracebacks(tmp_path, tiny_config):
    import psutil

    run = Training(
        tmp_path, "signalled", tiny_config, "schedule.train_iters=1000", "checkpoint.save_interval=2"
    )
    deadline = time.monotonic() + TIMEOUT_S
    while not [r for r in run.records() if r["step"] >= 5] and time.monotonic() < deadline:
        time.sleep(0.2)
    (torchrun,) = psutil.Process(run.process.pid).children()
    torchrun.send_signal(signal.SIGTERM)  # not the supervisor: torchrun stops the ranks without a save
    status, output = run.wait()
    assert status == 128 + signal.SIGTERM, output[-4000:]
    assert "torchrun: stopped by SIGTERM sent to torchrun itself" in output
    assert "Traceback" not in output and "free space" not in output, output[-4000:]
    assert damage(run.checkpoints / (run.checkpoints / LATEST).read_text().strip()) is None


@pytest.mark.slow
def test_non_finite_steps_are_skipped_and_counted_and_too_many_in_a_row_stop_the_run(tmp_path, tiny_config):
    faults = "nan-grad step=2; nan-grad step=6; nan-grad step=7"
    run = Training(tmp_path, "nan", tiny_config, *SHORT, "optimizer.max_consecutive_skips=2", fault=faults)
    output = _failed(run)
    records = {r["step"]: r for r in run.records()}
    assert records[2]["grad_norm"] is None and records[2]["skipped_steps"] == 1  # NaN is written as null
    # The skipped step moved nothing, the LR schedule included: step 3 runs at the LR step 2 would have had.
    assert records[3]["lr"] == records[2]["lr"] and records[3]["skipped_steps"] == 1
    assert records[6]["skipped_steps"] == 2 and 7 not in records
    assert (
        "steps 6 to 7: 2 steps in a row had a non-finite loss or gradient norm "
        "(optimizer.max_consecutive_skips = 2); stopped without saving, so the newest checkpoint, "
        f"{run.checkpoints / 'iter_0000004'}, holds the last good weights" in output
    )
    assert (run.checkpoints / LATEST).read_text() == "iter_0000004\n"


@pytest.mark.slow
def test_a_stuck_rank_ends_in_a_timeout_that_names_the_collective(tmp_path, tiny_config):
    run = Training(
        tmp_path,
        "stuck",
        tiny_config,
        "parallel.pipeline_model_parallel_size=2",
        "parallel.distributed_timeout_minutes=0.05",
        "health.watchdog=false",  # the process group's timeout alone (with it: test_health.py)
        *SHORT,
        fault="hang step=3 rank=1 seconds=8",
    )
    output = _failed(run)
    assert (
        "train: rank 0: torch.distributed.all_reduce (called from trainer.engines.megatron.train_step), in step 3 "
        "timed out after 3 s (parallel.distributed_timeout_minutes = 0.05): another rank stopped taking part"
        in output
    )


@pytest.mark.slow
def test_disk_full_while_saving_fails_clearly_and_keeps_the_previous_checkpoint(tmp_path, tiny_config):
    run = Training(tmp_path, "full", tiny_config, *SHORT, fault="enospc step=8")
    output = _failed(run)
    assert f"train: saving step 8 to {run.checkpoints / 'iter_0000008.tmp'} failed on rank 0: " in output
    assert "[Errno 28] No space left on device" in output
    assert "Nothing was published: iter_0000004 is intact and `latest` still names it" in output
    assert (run.checkpoints / LATEST).read_text() == "iter_0000004\n"
    assert damage(run.checkpoints / "iter_0000004") is None
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["iter_0000004", LATEST]  # staging cleared
