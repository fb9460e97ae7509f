"""quick_exit ends a process as sys.exit does (atexit handlers, flushed streams, the exit status), with every
object frozen first so that the interpreter's last collection has nothing to walk."""

import subprocess
import sys

PROGRAM = """
import atexit, gc, sys
from trainer.distributed.quick_exit import quick_exit

junk = [[i] for i in range(100_000)]
atexit.register(lambda: print(f"atexit ran; frozen {gc.get_freeze_count() >= 100_000}", flush=True))
sys.stdout.write("buffered, not flushed")
quick_exit(3)
"""


def test_quick_exit_runs_atexit_handlers_flushes_and_keeps_the_exit_status():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert done.stdout == "buffered, not flushedatexit ran; frozen True\n"
    assert done.stderr == ""
