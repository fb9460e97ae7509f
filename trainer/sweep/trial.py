"""One trial: a real `python -m trainer train` in a session of its own, its output in the trial's log, its
metrics.jsonl read as it grows. Each validation loss the trainer logs at an evaluation step goes to `report`, which
says whether to stop there (the pruner's decision); a stopped trial's process group is killed, since nothing it
would still write (its last checkpoint) is kept."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

METRICS = "metrics.jsonl"
LOG = "train.log"
POLL_S = 0.25
# What the trainer prints when a budget cap stops it early (trainer/loop.py, the `capped` branch): the step, then
# cap_reached's reason (trainer/cost/ledger.py), then "saved and stopped".
CAPPED = re.compile(r"step (\d+): (budget\.max_\w+ = .*?); saved and stopped")


class TrialFailed(Exception):
    """The trainer exited with an error (or reported no validation loss): the trial is recorded as failed."""

    def __init__(self, message: str, log: Path):
        self.log = log
        super().__init__(f"{message}; its log: {log}")


@dataclass
class Outcome:
    steps: int  # the last step the trial logged: the trial-steps it cost
    val_loss: float | None  # the last validation loss it logged
    pruned: bool
    # Why the trainer stopped itself before train_iters (its budget cap): the trial ran to no end of its own.
    stopped: str | None = None


def train_command(recipe: Path, overrides: Sequence[str], run_dir: Path) -> list[str]:
    """The trainer, as `make train` runs it, on a fresh run directory of the trial's own."""
    sets = [arg for override in (*overrides, f"logging.run_dir={run_dir}") for arg in ("--set", override)]
    return [sys.executable, "-m", "trainer", "train", "--config", str(recipe), "--fresh", *sets]


def run_trial(
    command: Sequence[str],
    run_dir: Path,
    report: Callable[[int, float], bool],
    *,
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
    train_iters: int | None = None,
) -> Outcome:
    """Run `command` until it ends or `report(step, val_loss)` returns True (then kill it: pruned). A run that
    exits 0 before `train_iters` was stopped by its budget cap: its outcome says so (`stopped`). A validation loss
    that is not finite fails the trial at once."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / LOG
    metrics = run_dir / METRICS
    # A leftover run's metrics (the trainer's --fresh clears them only once it has started) are not this trial's.
    metrics.unlink(missing_ok=True)
    seen = 0  # bytes of metrics.jsonl already read
    steps, val_loss = 0, None
    started = time.monotonic()
    with log.open("w") as output:
        process = subprocess.Popen(
            list(command),
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
            start_new_session=True,  # its own process group: a stop takes torchrun's ranks too
        )
        try:
            while True:
                ended = process.poll() is not None
                if metrics.exists():
                    with metrics.open() as handle:
                        handle.seek(seen)
                        text = handle.read()
                    complete = text[: text.rfind("\n") + 1]  # a line still being written waits
                    seen += len(complete.encode())
                    records = [json.loads(line) for line in complete.splitlines()]
                    # the steps trained so far, the cost of the trial even where it stops at an earlier report
                    steps = max([steps, *(int(record["step"]) for record in records)])
                    for record in records:
                        if record.get("val_loss") is None or record["step"] == 0:
                            continue
                        val_loss = float(record["val_loss"])
                        if not math.isfinite(val_loss):  # diverged: nothing more to learn from it
                            _kill(process)
                            raise TrialFailed(
                                f"validation loss is not finite at step {record['step']} ({val_loss})", log
                            )
                        # Every evaluation is reported (the pruner compares trials at the same steps); a stop
                        # only matters while the trainer still runs.
                        if report(int(record["step"]), val_loss) and not ended:
                            _kill(process)
                            # what it wrote between this read and the kill was trained too: it counts
                            return Outcome(max(steps, _last_step(metrics)), val_loss, pruned=True)
                if ended:
                    break
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    _kill(process)
                    raise TrialFailed(f"still running after {timeout_s:.0f} s", log)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=POLL_S)  # back at once when the trainer ends
        except BaseException:
            _kill(process)  # the driver interrupted: no trainer left behind
            raise
    if process.returncode != 0:
        raise TrialFailed(f"the trainer exited with {process.returncode}", log)
    if train_iters is not None and steps < train_iters:
        return Outcome(steps, val_loss, pruned=False, stopped=_stopped(log, steps, train_iters))
    if val_loss is None:
        raise TrialFailed("the trainer logged no validation loss", log)
    return Outcome(steps, val_loss, pruned=False)


def _stopped(log: Path, steps: int, train_iters: int) -> str:
    """Why a trainer that exited 0 stopped at `steps` of `train_iters`: the cap its log names."""
    found = CAPPED.findall(log.read_text(errors="replace"))
    reason = found[-1][1] if found else "the trainer stopped early"
    return f"stopped by its budget cap at step {steps} of {train_iters}: {reason}"


def _last_step(metrics: Path) -> int:
    """The newest step a complete line of metrics.jsonl records (0: none)."""
    text = metrics.read_text()
    lines = text[: text.rfind("\n") + 1].splitlines()
    return max((int(json.loads(line)["step"]) for line in lines), default=0)


def _kill(process: subprocess.Popen) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):  # ended between the poll and the kill
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()
