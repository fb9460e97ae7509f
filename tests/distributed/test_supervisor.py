"""The supervisor (trainer/distributed/torchrun.py `supervise`) over a real torchrun: when torchrun is killed from
outside (the out-of-memory killer, a `kill -9` of its pid), the supervisor says so in one line and exits 137."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from tests.conftest import ROOT

# The supervisor, running `torchrun --standalone --nproc-per-node 1 RANK_SCRIPT` as `train` runs its ranks.
SUPERVISOR = """
import sys
from trainer.distributed.torchrun import supervise, torchrun
sys.exit(supervise([*torchrun(), "--standalone", "--nproc-per-node", "1", sys.argv[1]], 5))
"""
RANK = "import time\nprint('rank up', flush=True)\ntime.sleep(600)\n"


def test_a_torchrun_killed_from_outside_is_said_in_a_line_and_the_supervisor_exits_137(tmp_path):
    rank = tmp_path / "rank.py"
    rank.write_text(RANK)
    log = tmp_path / "supervisor.log"
    with log.open("w") as output:
        supervisor = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR, str(rank)],
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a failure takes down every process it started
        )
    try:
        deadline = time.monotonic() + 120
        while "rank up" not in log.read_text():  # torchrun started, and it started its rank
            assert supervisor.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        (torchrun,) = psutil.Process(supervisor.pid).children()
        os.kill(torchrun.pid, signal.SIGKILL)
        status = supervisor.wait(timeout=60)
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait()
    output = log.read_text()
    assert status == 137, output
    assert (
        f"launch: torchrun (pid {torchrun.pid}) was killed by SIGKILL, by the kernel's out-of-memory killer "
        "(then dmesg shows it) or a `kill -9` of its pid; its ranks ended without saving what was in flight"
    ) in output, output
    assert "Exiting 137; to stop a run with a save, send SIGTERM to this supervising process" in output
    assert "Traceback" not in output, output
