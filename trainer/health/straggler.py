"""Straggler detection: which rank computes slower than the others, window after window, and on which node.

Every `health.straggler_interval` steps each rank contributes its mean step compute time over the window (the
step's wall time less the time it sat blocked in collectives: trainer/health/collectives.py) to one all-gather
of a float per rank. A rank above `straggler_factor` x the median of all ranks for `straggler_windows` windows in
a row is a straggler. The decision needs only the gathered numbers, so every rank reaches the same one.
"""

from __future__ import annotations

import socket
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from trainer.aws.imds import metadata

NOT_AVAILABLE = "n/a"


@dataclass(frozen=True)
class SlowRank:
    rank: int
    compute_s: float  # its mean step compute time in the window
    median_s: float  # the median over all ranks
    windows: int  # windows in a row it has been slow

    @property
    def ratio(self) -> float:
        return self.compute_s / self.median_s


@dataclass
class StragglerDetector:
    """k x the median for n windows in a row; `observe` takes one window's times, indexed by rank."""

    factor: float
    windows: int
    slow_in_a_row: dict[int, int] = field(default_factory=dict)

    def observe(self, compute_times: Sequence[float]) -> list[SlowRank]:
        """The ranks that have now been slow for `windows` windows in a row (a rank back under the line starts
        counting again)."""
        median = statistics.median(compute_times)
        for rank, seconds in enumerate(compute_times):
            if median > 0 and seconds > self.factor * median:
                self.slow_in_a_row[rank] = self.slow_in_a_row.get(rank, 0) + 1
            else:
                self.slow_in_a_row.pop(rank, None)
        return [
            SlowRank(rank, compute_times[rank], median, count)
            for rank, count in sorted(self.slow_in_a_row.items())
            if count >= self.windows
        ]


def instance_id(timeout_s: float = 0.5, endpoint: str | None = None) -> str:
    """This host's EC2 instance id through IMDSv2, or 'n/a' off EC2 or where IMDS does not answer within the
    timeout (a container behind a bridge with the launch template's PUT hop limit of 1 gets no token)."""
    try:
        (found,) = metadata("instance-id", endpoint=endpoint, timeout_s=timeout_s)
    except OSError:  # URLError, timeouts and refused connections are all OSErrors
        return NOT_AVAILABLE
    return found or NOT_AVAILABLE


@dataclass(frozen=True)
class Node:
    """Where a rank runs."""

    host: str
    instance_id: str

    @classmethod
    def this_one(cls) -> Node:
        return cls(socket.gethostname(), instance_id())
