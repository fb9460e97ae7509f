"""Prometheus alert rules from the metric registry, and the Alertmanager inhibitions that go with them. Checked by
`promtool check rules` and unit-tested by `promtool test rules` (tests/monitoring/test_promtool.py).

Rule file format: Prometheus docs, "Alerting rules" and "Defining recording rules" (groups of `record` / `alert`,
`expr`, `for`, `labels`, `annotations`). The alerts follow Prometheus's "Alerting" practices and the SRE book's
"Monitoring Distributed Systems" (page on symptoms: a run that makes no progress; keep causes as context):

- Each run's state is recorded per (run, job_id) and kept after its processes are gone: a recording rule that
  falls back on its own previous value (`x or previous`, as a Prometheus maintainer suggests in
  prometheus/prometheus#6530), for `remember_hours` after the run was last scraped. A range function such as
  `max_over_time(...[1h])` forgets a dead run after its range, and the page would resolve itself.
- An attempt is told from the one before by its start time (every process exports it): a resumed run is watched
  from its first second, and a clean end (every process exports its completion time, and is scraped before its
  endpoint closes) silences only the attempt it ended.
- A target that stops answering has its own alert with a short window; a run that started but never stepped has
  its own, so a hang in start-up pages before the stall window.
"""

from __future__ import annotations

from typing import Any

from trainer.contract import metrics as registry

GROUP = "trainstack-training"
STATE_GROUP = "trainstack-training-state"
SCRAPE_JOB = "trainstack"  # the scrape job name in the generated prometheus.yml
RUN = "run, job_id"
RUNBOOK = "docs/monitoring.md#runbook"
# The raw series are read over this window: a sample scraped once (a clean end's completion, served until one scrape
# read it) is still seen by a rule evaluated up to 10 minutes later, whatever the evaluation interval. Range
# functions skip staleness markers ("Staleness", Prometheus querying basics), so the value outlives its process.
STATE_WINDOW = "10m"

# Recorded state, per run and per scrape target.
RUN_SEEN = "trainstack:run_seen_timestamp_seconds"
RUN_START = "trainstack:run_start_timestamp_seconds"
RUN_LAST_STEP = "trainstack:run_last_step_timestamp_seconds"
RUN_COMPLETED = "trainstack:run_completed_timestamp_seconds"
TARGET_COMPLETED = "trainstack:target_completed_timestamp_seconds"
TARGET_RUN = "trainstack:target_run_info"


def state_rules(remember_hours: float) -> list[dict[str, str]]:
    """Recording rules that keep each run's start, last step and clean end after its processes are gone."""
    keep = f"{remember_hours * 3600:g}"
    start, completed = registry.PROCESS_START.full_name, registry.PROCESS_COMPLETED.full_name
    up = f'up{{job="{SCRAPE_JOB}"}}'

    def latest(source: str) -> str:
        return f"last_over_time({source}[{STATE_WINDOW}])"

    def per_run(record: str, source: str) -> dict[str, str]:
        return {
            "record": record,
            "expr": f"max by ({RUN}) ({latest(source)}) or ({record} and on ({RUN}) {RUN_SEEN})",
        }

    return [
        # When any process of the run was last scraped; remembered for `remember_hours` after that.
        {
            "record": RUN_SEEN,
            "expr": f"max by ({RUN}) (timestamp({start})) or ({RUN_SEEN} > time() - {keep})",
        },
        per_run(RUN_START, start),  # the newest attempt's start: the latest process start of the run
        per_run(RUN_LAST_STEP, registry.LAST_STEP_TIME.full_name),
        per_run(RUN_COMPLETED, completed),
        # Per scrape target: the run its last process belonged to, and that process's clean end, kept while the
        # target is scraped (a new process on the target replaces both).
        {
            "record": TARGET_RUN,
            "expr": f"max by (instance, job, {RUN}) (0 * {start} + 1) or ({TARGET_RUN} and on (instance, job) "
            f"{up} unless on (instance, job) {start})",
        },
        {
            "record": TARGET_COMPLETED,
            # The target's newest process ended cleanly: its completion is not older than the newest start.
            "expr": f"(max by (instance, job) ({latest(completed)}) >= on (instance, job) max by (instance, job) "
            f"({latest(start)})) or ({TARGET_COMPLETED} and on (instance, job) {up} unless on (instance, job) "
            f"{start})",
        },
    ]


def _duration(minutes: float) -> str:
    """A rule's `for:` in whole seconds (Prometheus duration syntax), so windows under a minute can be tested."""
    return f"{round(minutes * 60)}s"


def _alert(name: str, expr: str, severity: str, summary: str, runbook: str, **extra: Any) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        **extra,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "runbook": f"{runbook} ({RUNBOOK})"},
    }


def alert_rules(
    *,
    stall_minutes: float = 15,
    start_minutes: float = 10,
    target_down_minutes: float = 2,
    remember_hours: float = 24,
    loss_spike_ratio: float = 1.5,
    min_mfu: float | None = None,
    min_tokens_per_second: float | None = None,
    throughput_minutes: int = 30,
) -> dict[str, Any]:
    this_attempt_completed = f"({RUN_COMPLETED} >= on ({RUN}) {RUN_START})"
    stepped_this_attempt = f"({RUN_LAST_STEP} >= on ({RUN}) {RUN_START})"
    up = f'up{{job="{SCRAPE_JOB}"}}'
    loss = registry.TRAINING_LOSS.full_name
    run_label = "Run {{ $labels.run }} (job {{ $labels.job_id }})"
    rules: list[dict[str, Any]] = [
        _alert(
            "TrainingStalled",
            f"(time() - {RUN_LAST_STEP} > {stall_minutes * 60:g}) and on ({RUN}) {stepped_this_attempt} "
            f"unless on ({RUN}) {this_attempt_completed}",
            "page",
            f"{run_label} has made no step for {{{{ $value | humanizeDuration }}}} (limit {stall_minutes:g} min)",
            "The run stepped, then stopped, and did not end cleanly. If TrainingTargetDown fires too, the "
            "processes are gone: read the job's log for the error, then resume with the same command (Batch "
            "retries do this themselves). If the processes are up, the run hangs: look for a rank stuck in a "
            "collective (py-spy dump on each rank, NCCL_DEBUG=INFO) or a full disk, then stop it with SIGTERM and "
            "resume.",
        ),
        _alert(
            "TrainingNeverStarted",
            f"(time() - {RUN_START} > {start_minutes * 60:g}) unless on ({RUN}) {stepped_this_attempt} "
            f"unless on ({RUN}) {this_attempt_completed}",
            "page",
            f"{run_label} started {{{{ $value | humanizeDuration }}}} ago and has not completed a step",
            "This attempt has not reached step 1: it hangs or died while starting (rendezvous, NCCL set-up, "
            "checkpoint load, data index build). Read the first lines of each rank's log for the last phase "
            "reached; a checkpoint load that is just slow needs a longer --start-minutes.",
        ),
        _alert(
            "TrainingTargetDown",
            # Down targets carry the run their last process belonged to (none if it never answered), unless that
            # process ended cleanly.
            f"(({up} == 0) * on (instance, job) group_left ({RUN}) {TARGET_RUN} or on (instance, job) "
            f"({up} == 0)) unless on (instance, job) {TARGET_COMPLETED}",
            "page",
            "Training process at {{ $labels.instance }} (run {{ $labels.run }}) does not answer scrapes",
            "The process behind this endpoint exited without a clean end, or hangs so hard it cannot answer. "
            "Check whether the job is still running (Batch console, `ps` on the node); a rank killed by the "
            "kernel's OOM killer shows in `dmesg`. The run pages TrainingStalled too, which this alert inhibits.",
            **{"for": _duration(target_down_minutes)},
        ),
        _alert(
            "TrainingLossNotFinite",
            f"{loss} != {loss} or abs({loss}) == Inf",
            "warning",
            f"{run_label}: the last logged loss is {{{{ $value }}}}",
            "The step was skipped (no update); the run stops after optimizer.max_consecutive_skips in a row. "
            "Check the learning rate and warm-up, the data around the step's consumed samples, and bf16 "
            "overflow; resume from the newest checkpoint before the trouble if it persists.",
        ),
        _alert(
            "TrainingStepsSkipped",
            f"increase({registry.SKIPPED_STEPS.full_name}[15m]) > 0",
            "warning",
            f"{run_label} skipped {{{{ $value }}}} step(s) in 15 minutes (non-finite loss or gradient norm)",
            "Skipped steps make no update. A few are harmless; many in a row stop the run. See the step lines "
            "in the log for the loss and gradient norm.",
        ),
        _alert(
            "TrainingLossSpike",
            f"{loss} > {loss_spike_ratio:g} * quantile_over_time(0.5, {loss}[30m])",
            "warning",
            f"{run_label}: loss {{{{ $value }}}} is over {loss_spike_ratio:g}x its median of the last 30 minutes",
            "A loss spike: watch whether it recovers within a few hundred steps. If it does not, resume from a "
            "checkpoint before it with a lower learning rate, or skip the data around it.",
            **{"for": "2m"},
        ),
        _alert(
            "GpuRowRemapPending",
            f"{registry.GPU_ROW_REMAP_PENDING.full_name} == 1",
            "warning",
            "GPU {{ $labels.gpu }} on {{ $labels.node }} needs a reset (row remap pending)",
            "NVIDIA's row remapping waits for a GPU reset; drain the node after the run's next checkpoint and "
            "reset the GPU (nvidia-smi -r) or replace the instance.",
        ),
    ]
    for metric, floor, what in (
        (registry.MFU, min_mfu, "MFU"),
        (registry.TOKENS_PER_SECOND, min_tokens_per_second, "tokens/s"),
    ):
        if floor is not None:
            rules.append(
                _alert(
                    f"Low{metric.cloudwatch}",
                    f"{metric.full_name} < {floor}",
                    "page",
                    f"Run {{{{ $labels.run }}}}: {what} below {floor:g}",
                    "Compare step time per rank for a straggler, data wait time for a slow file system, and "
                    "EFA retransmits for a bad link.",
                    **{"for": _duration(throughput_minutes)},
                )
            )
    return {
        "groups": [
            {"name": STATE_GROUP, "rules": state_rules(remember_hours)},
            {"name": GROUP, "rules": rules},
        ]
    }


def inhibit_rules() -> list[dict[str, Any]]:
    """Alertmanager `inhibit_rules` (Alertmanager configuration docs): one page per incident. A dead process
    explains its run's stall; a run that makes no progress explains its throughput and loss alerts."""
    return [
        {
            "source_matchers": ['alertname="TrainingTargetDown"'],
            "target_matchers": ['alertname=~"TrainingStalled|TrainingNeverStarted"'],
            "equal": ["run", "job_id"],
        },
        {
            "source_matchers": ['alertname=~"TrainingStalled|TrainingNeverStarted"'],
            "target_matchers": ['alertname=~"LowMFU|LowTokensPerSecond|TrainingLossSpike"'],
            "equal": ["run", "job_id"],
        },
    ]
