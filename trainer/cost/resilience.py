"""The checkpoint interval from the failure rate: Young's rule, interval = sqrt(2 x save cost x MTBF), with the job's
mean time between interruptions from a published per-GPU-hour rate, and the goodput a run can expect with it.

Goodput here is the share of wall time whose work is kept. With interruptions arriving as a Poisson process of mean
interval M (the whole job's), a save blocking training for C seconds after every tau seconds of work, and R seconds to
restart after an interruption (start-up, load), one segment of tau seconds of work takes in expectation
M e^(R/M) (e^((tau+C)/M) - 1) seconds of wall time, interruptions during saves and restarts included (J. T. Daly,
"A higher order estimate of the optimum checkpoint interval for restart dumps", Future Generation Computer Systems
22(3), 2006, section 3). Young's first-order interval (J. W. Young, "A first order approximation to the optimum
checkpoint interval", CACM 17(9), 1974) is within a fraction of a percent of that model's best while C << M, as
tests/cost/test_resilience.py shows by simulation. Torch-free."""

from __future__ import annotations

import math
from dataclasses import dataclass

# The Llama 3 Herd of Models (arXiv 2407.21783), section 3.3.4 and Table 5: in a 54-day snapshot of pre-training on
# 16,384 H100 GPUs, 466 job interruptions, 47 planned and 419 unexpected. The unexpected ones, per GPU-hour:
LLAMA3_UNEXPECTED_INTERRUPTIONS = 419
LLAMA3_GPUS = 16_384
LLAMA3_HOURS = 54 * 24
INTERRUPTIONS_PER_GPU_HOUR = LLAMA3_UNEXPECTED_INTERRUPTIONS / (LLAMA3_GPUS * LLAMA3_HOURS)
RATE_SOURCE = "Llama 3 (arXiv 2407.21783, Table 5): 419 unexpected interruptions in 54 days on 16,384 GPUs"


def mtbf_seconds(gpus: int, per_gpu_hour: float = INTERRUPTIONS_PER_GPU_HOUR) -> float:
    """The job's mean time between interruptions: any one of its GPUs (or what they depend on) stops it."""
    return 3600.0 / (per_gpu_hour * gpus)


def young_interval_seconds(save_s: float, mtbf_s: float) -> float:
    """Seconds of work between saves that Young's rule recommends."""
    return math.sqrt(2.0 * save_s * mtbf_s)


def expected_goodput(interval_s: float, save_s: float, restart_s: float, mtbf_s: float) -> float:
    """The share of wall time whose work is kept, saving every `interval_s` seconds of work (Daly 2006)."""
    wall = mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + save_s) / mtbf_s)
    return interval_s / wall


def expected_lost_seconds(gpu_hours: float, interval_s: float, restart_s: float) -> float:
    """Wall time interruptions cost over `gpu_hours` to first order: each loses half an interval of work on
    average, and its restart."""
    return INTERRUPTIONS_PER_GPU_HOUR * gpu_hours * (interval_s / 2 + restart_s)


@dataclass(frozen=True)
class Recommendation:
    gpus: int
    save_s: float  # measured blocking time of one save
    restart_s: float  # measured time from an interruption to training again
    step_s: float
    mtbf_s: float
    interval_s: float  # Young's
    steps: int  # the interval in whole steps: checkpoint.save_interval
    goodput: float  # expected, at `steps`
    per_gpu_hour: float = INTERRUPTIONS_PER_GPU_HOUR  # the interruption rate it assumed

    def lines(self) -> list[str]:
        rate = (
            RATE_SOURCE
            if self.per_gpu_hour == INTERRUPTIONS_PER_GPU_HOUR
            else "given: --interruptions-per-gpu-hour"
        )
        return [
            f"job MTBF {self.mtbf_s / 3600:.1f} h on {self.gpus:,} GPUs at {self.per_gpu_hour:.3g} "
            f"interruptions per GPU-hour ({rate})",
            f"save every {self.steps:,} steps ({self.steps * self.step_s / 60:.1f} min of work): Young's "
            f"sqrt(2 x save {self.save_s:.1f} s x MTBF) = {self.interval_s / 60:.1f} min at {self.step_s:.2f} s a "
            f"step; restart {self.restart_s:.0f} s",
            f"expected goodput {self.goodput:.1%} (interruptions, saves and restarts; Daly 2006)",
        ]


def recommend(
    gpus: int,
    save_s: float,
    restart_s: float,
    step_s: float,
    per_gpu_hour: float = INTERRUPTIONS_PER_GPU_HOUR,
) -> Recommendation:
    """checkpoint.save_interval for a job of `gpus` GPUs whose saves block `save_s` and restarts take
    `restart_s`, at `step_s` seconds a step, at `per_gpu_hour` interruptions per GPU-hour."""
    mtbf = mtbf_seconds(gpus, per_gpu_hour)
    interval = young_interval_seconds(save_s, mtbf)
    steps = max(1, round(interval / step_s))
    goodput = expected_goodput(steps * step_s, save_s, restart_s, mtbf)
    return Recommendation(gpus, save_s, restart_s, step_s, mtbf, interval, steps, goodput, per_gpu_hour)
