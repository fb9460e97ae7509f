"""Every metric the trainer exports, defined once: its Prometheus name, kind, unit, help and labels, and the
CloudWatch name and unit its embedded-metric-format line carries (None: Prometheus only).

Torch-free: the exporters, the alert rules, the Grafana dashboard (trainer/monitoring/dashboards.py) and the
stack's CloudWatch alarms and dashboard (infra/monitoring.py) all read these names from here.

Names follow Prometheus's naming conventions (https://prometheus.io/docs/practices/naming/): one application
prefix, base units (seconds, bytes, ratios 0-1) as a suffix, `_total` on counters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PREFIX = "trainstack"
# Where a run's metrics live in CloudWatch; the stack's alarms and dashboard read the same namespace.
CLOUDWATCH_NAMESPACE = "trainstack"
# `job_id`, the Batch job: not `job`, which Prometheus sets on every series to the scrape job's name (a target
# label; an exposed `job` would become `exported_job`).
RUN_LABELS = ("run", "job_id")
RANK_LABELS = (*RUN_LABELS, "node", "rank", "stage")
NODE_LABELS = (*RUN_LABELS, "node")
GPU_LABELS = (*NODE_LABELS, "gpu")
EFA_LABELS = (*NODE_LABELS, "device", "port")

# CloudWatch's units (MetricDatum.Unit, CloudWatch API reference), the ones used here.
CloudWatchUnit = Literal["Seconds", "Bytes", "Percent", "Count", "Count/Second", "None"]


@dataclass(frozen=True)
class Metric:
    name: str  # without PREFIX
    kind: Literal["gauge", "counter"]
    help: str
    labels: tuple[str, ...]
    unit: str = ""  # Prometheus unit suffix, already part of the name
    cloudwatch: str | None = None  # the CloudWatch metric name; None: not pushed
    cloudwatch_unit: CloudWatchUnit = "None"
    prometheus: bool = True  # False: pushed to CloudWatch only

    def __post_init__(self) -> None:
        if self.kind == "counter" and not self.name.endswith("_total"):
            raise ValueError(f"counter {self.name} must end in _total")
        if self.unit and not self.name.removesuffix("_total").endswith(self.unit):
            raise ValueError(f"{self.name} must end in its unit {self.unit}")

    @property
    def full_name(self) -> str:
        return f"{PREFIX}_{self.name}"


# --- the run, from the values the training loop already has (rank 0 logs them) ------------------------------------
TRAINING_LOSS = Metric(
    "training_loss",
    "gauge",
    "Mean loss per token of the last logged step",
    RUN_LABELS,
    cloudwatch="TrainingLoss",
)
VALIDATION_LOSS = Metric(
    "validation_loss",
    "gauge",
    "Mean loss per token on the validation samples",
    RUN_LABELS,
    cloudwatch="ValidationLoss",
)
TOKENS_PER_SECOND = Metric(
    "tokens_per_second",
    "gauge",
    "Training throughput: tokens of the global batch per second",
    RUN_LABELS,
    cloudwatch="TokensPerSecond",
    cloudwatch_unit="Count/Second",
)
MODEL_FLOPS = Metric(
    "model_flops_per_second_per_device",
    "gauge",
    "Model FLOP/s per device (Megatron's formula, trainer/model/flops.py)",
    RUN_LABELS,
    cloudwatch="ModelFlopsPerSecondPerDevice",
    cloudwatch_unit="Count/Second",
)
MFU = Metric(
    "mfu_ratio",
    "gauge",
    "Model FLOPs utilisation: model FLOP/s over the device's dense bf16 peak (0-1)",
    RUN_LABELS,
    unit="ratio",
    cloudwatch="MFU",
)
GRADIENT_NORM = Metric(
    "gradient_norm",
    "gauge",
    "Gradient norm before clipping of the last logged step",
    RUN_LABELS,
    cloudwatch="GradientNorm",
)
STEP = Metric("step", "gauge", "The last completed optimizer step", RUN_LABELS)
LAST_STEP_TIME = Metric(
    "last_step_timestamp_seconds",
    "gauge",
    "Unix time when the last step completed",
    RUN_LABELS,
    unit="seconds",
)
# What the stall alarm watches: steps completed since the last line (CloudWatch: Sum per period).
STEPS = Metric(
    "steps_total",
    "counter",
    "Optimizer steps completed by this process",
    RUN_LABELS,
    cloudwatch="Steps",
    cloudwatch_unit="Count",
)
SKIPPED_STEPS = Metric(
    "skipped_steps_total",
    "counter",
    "Steps skipped for a non-finite loss or gradient norm (no update)",
    RUN_LABELS,
    cloudwatch="SkippedSteps",
    cloudwatch_unit="Count",
)
# When each process started and, at a clean end (train_iters reached, or stopped on SIGTERM), when it finished:
# the alert rules tell an attempt that ended cleanly from one that died, and a resumed attempt from the one before.
PROCESS_START = Metric(
    "process_start_timestamp_seconds",
    "gauge",
    "Unix time this training process started",
    RANK_LABELS,
    unit="seconds",
)
PROCESS_COMPLETED = Metric(
    "process_completed_timestamp_seconds",
    "gauge",
    "Unix time this process finished cleanly (train_iters reached, or stopped on SIGTERM with a checkpoint)",
    RANK_LABELS,
    unit="seconds",
)
# Evaluation during training (`evaluation.suite`): one series per task of the suite, from rank 0.
TASK_LABELS = (*RUN_LABELS, "task")
EVALUATION_PERPLEXITY = Metric(
    "evaluation_perplexity",
    "gauge",
    "Perplexity on a held-out dataset of the evaluation suite (task: its name)",
    TASK_LABELS,
    cloudwatch="EvaluationPerplexity",
)
EVALUATION_EXACT_MATCH = Metric(
    "evaluation_exact_match_ratio",
    "gauge",
    "Exact-match rate on a generation task of the evaluation suite (0-1; task: its name)",
    TASK_LABELS,
    unit="ratio",
    cloudwatch="EvaluationExactMatch",
)
# CloudWatch only (Prometheus computes it from the last step's timestamp): rank 0 writes it every
# cloudwatch_interval_seconds from a background thread, so a hung run keeps reporting how long it has hung.
SECONDS_SINCE_LAST_STEP = Metric(
    "last_step_age_seconds",
    "gauge",
    "Seconds since this attempt's last step (since its start before the first step)",
    RUN_LABELS,
    unit="seconds",
    cloudwatch="SecondsSinceLastStep",
    cloudwatch_unit="Seconds",
    prometheus=False,
)
# Prometheus: the restart count so far (a counter that starts at it, so increase() counts restarts across
# processes); CloudWatch: 1 from each restarted process, so a Sum over any period counts the restarts in it.
RESTARTS = Metric(
    "restarts_total",
    "counter",
    "Restarts before this process: torchrun's restart count plus Batch attempts after the first",
    RUN_LABELS,
    cloudwatch="Restarts",
    cloudwatch_unit="Count",
)
CHECKPOINT_SAVE = Metric(
    "checkpoint_save_seconds",
    "gauge",
    "Wall time of the last checkpoint save",
    RANK_LABELS,
    unit="seconds",
    cloudwatch="CheckpointSaveSeconds",
    cloudwatch_unit="Seconds",
)
CHECKPOINT_LOAD = Metric(
    "checkpoint_load_seconds",
    "gauge",
    "Wall time of the checkpoint load at start",
    RANK_LABELS,
    unit="seconds",
    cloudwatch="CheckpointLoadSeconds",
    cloudwatch_unit="Seconds",
)

# --- the run's cost, from its ledger (trainer/cost/ledger.py; rank 0, over every attempt) -------------------------
COST = Metric(
    "cost_dollars",
    "gauge",
    "US dollars paid so far for the run's nodes, every attempt (node-hours x price per node-hour)",
    RUN_LABELS,
    unit="dollars",
    cloudwatch="CostDollars",
)
COST_PER_MILLION_TOKENS = Metric(
    "cost_per_million_tokens_dollars",
    "gauge",
    "US dollars paid so far per million tokens the kept steps trained",
    RUN_LABELS,
    unit="dollars",
    cloudwatch="CostPerMillionTokens",
)
PAID_NODE_TIME = Metric(
    "paid_node_seconds",
    "gauge",
    "Node-seconds paid so far, every attempt and purchase option",
    RUN_LABELS,
    unit="seconds",
    cloudwatch="PaidNodeSeconds",
    cloudwatch_unit="Seconds",
)
GOODPUT = Metric(
    "goodput_ratio",
    "gauge",
    "Share of paid time spent in productive steps (0-1); the rest is queue, start-up, stalls, restarts, evaluation",
    RUN_LABELS,
    unit="ratio",
    cloudwatch="Goodput",
)

# --- each rank's step, timed on that rank --------------------------------------------------------------------------
STEP_TIME = Metric(
    "step_duration_seconds",
    "gauge",
    "Wall time of this rank's last optimizer step",
    RANK_LABELS,
    unit="seconds",
    cloudwatch="StepSeconds",
    cloudwatch_unit="Seconds",
)
FORWARD_BACKWARD_TIME = Metric(
    "forward_backward_duration_seconds",
    "gauge",
    "Forward and backward passes of the last step (all micro-batches, pipeline included)",
    RANK_LABELS,
    unit="seconds",
    cloudwatch="ForwardBackwardSeconds",
    cloudwatch_unit="Seconds",
)
OPTIMIZER_TIME = Metric(
    "optimizer_duration_seconds",
    "gauge",
    "Gradient norm, clipping and the optimizer update of the last step",
    RANK_LABELS,
    unit="seconds",
    cloudwatch="OptimizerSeconds",
    cloudwatch_unit="Seconds",
)
DATA_WAIT_TIME = Metric(
    "data_wait_duration_seconds",
    "gauge",
    "Time the last step waited for its micro-batches from the data loader",
    RANK_LABELS,
    unit="seconds",
    cloudwatch="DataWaitSeconds",
    cloudwatch_unit="Seconds",
)
PIPELINE_IDLE_TIME = Metric(
    "pipeline_idle_duration_seconds",
    "gauge",
    "Time the last step's pipeline stage spent waiting on its neighbours",
    RANK_LABELS,
    unit="seconds",
)

# --- each node: NVML where GPUs exist, EFA sysfs counters where EFA exists, host memory --------------------------
GPU_UTILIZATION = Metric(
    "gpu_utilization_ratio",
    "gauge",
    "Fraction of the last sample period a kernel ran on the GPU (NVML utilization.gpu / 100)",
    GPU_LABELS,
    unit="ratio",
    cloudwatch="GpuUtilization",
)
GPU_MEMORY_USED = Metric(
    "gpu_memory_used_bytes",
    "gauge",
    "GPU memory in use (NVML)",
    GPU_LABELS,
    unit="bytes",
    cloudwatch="GpuMemoryUsedBytes",
    cloudwatch_unit="Bytes",
)
GPU_MEMORY_TOTAL = Metric(
    "gpu_memory_total_bytes", "gauge", "GPU memory installed (NVML)", GPU_LABELS, unit="bytes"
)
GPU_POWER = Metric(
    "gpu_power_watts",
    "gauge",
    "GPU board power draw (NVML)",
    GPU_LABELS,
    unit="watts",
    cloudwatch="GpuPowerWatts",
)
GPU_TEMPERATURE = Metric(
    "gpu_temperature_celsius",
    "gauge",
    "GPU die temperature (NVML)",
    GPU_LABELS,
    unit="celsius",
    cloudwatch="GpuTemperatureCelsius",
)
GPU_ECC_ERRORS = Metric(
    "gpu_ecc_errors_total",
    "counter",
    "ECC errors since the driver loaded (NVML volatile counter), by type",
    (*GPU_LABELS, "type"),
    cloudwatch="GpuUncorrectedEccErrors",
    cloudwatch_unit="Count",
)
GPU_REMAPPED_ROWS = Metric(
    "gpu_remapped_rows", "gauge", "Memory rows remapped (NVML), by cause", (*GPU_LABELS, "type")
)
GPU_ROW_REMAP_PENDING = Metric(
    "gpu_row_remap_pending",
    "gauge",
    "1 when a row remap waits for a GPU reset (NVML)",
    GPU_LABELS,
    cloudwatch="GpuRowRemapPending",
    cloudwatch_unit="Count",
)
GPU_ROW_REMAP_FAILED = Metric("gpu_row_remap_failed", "gauge", "1 when a row remap failed (NVML)", GPU_LABELS)
GPU_THROTTLED = Metric(
    "gpu_clocks_throttled",
    "gauge",
    "1 while NVML reports this clock event reason (throttle) as active",
    (*GPU_LABELS, "reason"),
)
EFA_TRANSMITTED = Metric(
    "efa_transmitted_bytes_total",
    "counter",
    "Bytes sent by the EFA port (tx_bytes)",
    EFA_LABELS,
    unit="bytes",
    cloudwatch="EfaTransmittedBytes",
    cloudwatch_unit="Bytes",
)
EFA_RECEIVED = Metric(
    "efa_received_bytes_total",
    "counter",
    "Bytes received by the EFA port (rx_bytes)",
    EFA_LABELS,
    unit="bytes",
    cloudwatch="EfaReceivedBytes",
    cloudwatch_unit="Bytes",
)
EFA_RDMA_READ = Metric(
    "efa_rdma_read_bytes_total", "counter", "Bytes read by RDMA (rdma_read_bytes)", EFA_LABELS, unit="bytes"
)
EFA_RDMA_WRITE = Metric(
    "efa_rdma_write_bytes_total",
    "counter",
    "Bytes written by RDMA (rdma_write_bytes)",
    EFA_LABELS,
    unit="bytes",
)
EFA_RETRANSMITTED_PACKETS = Metric(
    "efa_retransmitted_packets_total",
    "counter",
    "Packets the EFA port sent again (retrans_pkts)",
    EFA_LABELS,
    cloudwatch="EfaRetransmittedPackets",
    cloudwatch_unit="Count",
)
EFA_RETRANSMITTED_BYTES = Metric(
    "efa_retransmitted_bytes_total",
    "counter",
    "Bytes the EFA port sent again (retrans_bytes)",
    EFA_LABELS,
    unit="bytes",
)
EFA_RETRANSMIT_TIMEOUTS = Metric(
    "efa_retransmit_timeouts_total", "counter", "Retransmission timeouts (retrans_timeout_events)", EFA_LABELS
)
EFA_RECEIVE_DROPS = Metric(
    "efa_receive_drops_total", "counter", "Received packets dropped (rx_drops)", EFA_LABELS
)
EFA_UNRESPONSIVE_REMOTES = Metric(
    "efa_unresponsive_remote_events_total",
    "counter",
    "Peers that stopped answering (unresponsive_remote_events)",
    EFA_LABELS,
)
EFA_IMPAIRED_REMOTES = Metric(
    "efa_impaired_remote_connection_events_total",
    "counter",
    "Connections to impaired peers (impaired_remote_conn_events)",
    EFA_LABELS,
)
HOST_MEMORY_USED = Metric(
    "host_memory_used_bytes",
    "gauge",
    "Host memory in use (total - available)",
    NODE_LABELS,
    unit="bytes",
    cloudwatch="HostMemoryUsedBytes",
    cloudwatch_unit="Bytes",
)
HOST_MEMORY_TOTAL = Metric(
    "host_memory_total_bytes", "gauge", "Host memory installed", NODE_LABELS, unit="bytes"
)

# --- a served model (trainer/serving): `run` is the model version's run, `job_id` the server (`local` for make
# serve), `model` the version's name, `endpoint` the API path ---------------------------------------------------------
SERVING_LABELS = (*RUN_LABELS, "model", "endpoint")
SERVING_REQUESTS = Metric(
    "serving_requests_total",
    "counter",
    "Requests answered, by endpoint and HTTP status",
    (*SERVING_LABELS, "status"),
)
SERVING_REQUEST_TIME = Metric(
    "serving_request_seconds_total",
    "counter",
    "Seconds from a request's arrival to its last byte, summed (divide by requests for the mean)",
    SERVING_LABELS,
    unit="seconds",
)
SERVING_FIRST_BYTE_TIME = Metric(
    "serving_first_byte_seconds_total",
    "counter",
    "Seconds from a request's arrival to its first body byte (a stream's first token), summed",
    SERVING_LABELS,
    unit="seconds",
)
SERVING_IN_FLIGHT = Metric(
    "serving_requests_in_flight", "gauge", "Requests being answered now", SERVING_LABELS
)
SERVING_PROMPT_TOKENS = Metric(
    "serving_prompt_tokens_total", "counter", "Prompt tokens of the requests accepted", SERVING_LABELS
)
SERVING_COMPLETION_TOKENS = Metric(
    "serving_completion_tokens_total",
    "counter",
    "Tokens generated, as each answer's usage reports them",
    SERVING_LABELS,
)

METRICS: tuple[Metric, ...] = tuple(value for value in dict(globals()).values() if isinstance(value, Metric))
BY_NAME = {metric.name: metric for metric in METRICS}
# What a model server exports (trainer/serving/metrics.py), not a training process.
SERVING_METRICS = tuple(metric for metric in METRICS if "endpoint" in metric.labels)
# What a node reports about itself (trainer/monitoring/node.py), as opposed to what the loop records.
NODE_METRICS = tuple(metric for metric in METRICS if "node" in metric.labels and "rank" not in metric.labels)


# CloudWatch dimension sets, by the labels a metric carries (trainer/monitoring/cloudwatch.py writes them; the
# stack's alarms and dashboard read the per-queue sets: one metric per stack).
RUN_DIMENSIONS = [["JobQueue"], ["JobQueue", "Run"]]
RANK_DIMENSIONS = [["JobQueue", "Run", "Rank"]]
NODE_DIMENSIONS = [["JobQueue", "Node"]]
TASK_DIMENSIONS = [["JobQueue", "Run", "Task"]]
