"""Prometheus alert rules from the metric registry: the same alarms the stack's CloudWatch has, for teams on
Prometheus (self-hosted or Amazon Managed Service for Prometheus). Checked by `promtool check rules` and unit-tested
by `promtool test rules` (tests/monitoring/test_promtool.py).

Rule file format: Prometheus docs, "Alerting rules" and "Defining recording rules" (groups of `alert`, `expr`,
`for`, `labels`, `annotations`).
"""

from __future__ import annotations

from typing import Any

from trainer.contract import metrics as r

GROUP = "trainstack-training"
# How long a run's last series are remembered after its process exits: the stall alert still sees a dead run.
LOOKBACK = "1h"


def alert_rules(
    *,
    stall_minutes: int = 15,
    min_mfu: float | None = None,
    min_tokens_per_second: float | None = None,
    throughput_minutes: int = 30,
) -> dict[str, Any]:
    run = "run, job_id"
    last_step = f"max by ({run}) (max_over_time({r.LAST_STEP_TIME.full_name}[{LOOKBACK}]))"
    completed = f"max by ({run}) (max_over_time({r.RUN_COMPLETED.full_name}[{LOOKBACK}])) == 1"
    rules: list[dict[str, Any]] = [
        {
            "alert": "TrainingStalled",
            # No step for the limit, unless the run finished; a process that died stalls too (its last value stays).
            "expr": f"time() - {last_step} > {stall_minutes * 60} unless on ({run}) ({completed})",
            "labels": {"severity": "page"},
            "annotations": {
                "summary": "Run {{ $labels.run }} (job {{ $labels.job_id }}) has made no step for "
                f"{stall_minutes} minutes",
                "description": "The last step completed {{ $value | humanizeDuration }} ago.",
            },
        },
        {
            "alert": "GpuRowRemapPending",
            "expr": f"{r.GPU_ROW_REMAP_PENDING.full_name} == 1",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "GPU {{ $labels.gpu }} on {{ $labels.node }} needs a reset (row remap pending)"
            },
        },
    ]
    for metric, floor, what in (
        (r.MFU, min_mfu, "MFU"),
        (r.TOKENS_PER_SECOND, min_tokens_per_second, "tokens/s"),
    ):
        if floor is not None:
            rules.append(
                {
                    "alert": f"Low{metric.cloudwatch}",
                    "expr": f"{metric.full_name} < {floor}",
                    "for": f"{throughput_minutes}m",
                    "labels": {"severity": "page"},
                    "annotations": {"summary": f"Run {{{{ $labels.run }}}}: {what} below {floor:g}"},
                }
            )
    return {"groups": [{"name": GROUP, "rules": rules}]}
