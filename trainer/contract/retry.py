"""The exit code that asks for a retry on fresh hosts, defined here and nowhere else.

A rank that ends the run for a reason a new attempt can cure exits with RETRY_EXIT_CODE: a hung collective (the
watchdog, trainer/health/) or a node unfit to train (the preflight: a GPU, EFA device, the FSx mount, NVML health,
its bandwidth; the faulty node has taken itself out of service first). The main node's exit code is the job's
(AWS Batch User Guide, "Multi-node parallel jobs"). torchrun exits 1 whatever its workers' codes were, so the rank also writes the code into the
file that the supervising process (trainer/distributed/torchrun.py `supervise`) names in EXIT_REQUEST_ENV, and the
supervisor, seeing torchrun fail, exits with it: the container's exit code, which the Batch job definition's
retryStrategy.evaluateOnExit maps to RETRY (docs/trainer.md#health-stragglers-and-hangs).

This module imports no torch: the launcher reads it.
"""

from __future__ import annotations

import os
from pathlib import Path

# EX_TEMPFAIL, "temp failure; user is invited to retry" (sysexits.h, /usr/include/sysexits.h on glibc).
RETRY_EXIT_CODE = 75
EXIT_REQUEST_ENV = "TRAINSTACK_EXIT_REQUEST_FILE"
# Attempts a job gets in all (the first and its retries): the Batch retryStrategy's `attempts`, and on EKS the
# JobSet's failurePolicy.maxRestarts + 1.
RETRY_ATTEMPTS = 3


def request_retry() -> int:
    """Record, for the supervisor, that this rank exits asking for a retry; the code to exit with."""
    path = os.environ.get(EXIT_REQUEST_ENV)
    if path:
        Path(path).write_text(f"{RETRY_EXIT_CODE}\n")
    return RETRY_EXIT_CODE


def supervised_status(torchrun_status: int, request_file: Path) -> int:
    """What the supervisor exits with: a rank's retry request when torchrun failed, else torchrun's status."""
    requested = request_file.read_text().strip() if request_file.exists() else ""
    return int(requested) if torchrun_status != 0 and requested else torchrun_status
