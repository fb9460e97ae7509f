"""Alerting and the run dashboard: an SNS topic encrypted with the stack key, CloudWatch alarms that page it, an
EventBridge rule for failed Batch jobs, and a CloudWatch dashboard of the trainer's metrics beside FSx's.

The trainer's metrics arrive as CloudWatch embedded-metric-format lines in the job's log stream
(trainer/monitoring/cloudwatch.py), in namespace `trainstack` with dimension `JobQueue` (AWS_BATCH_JQ_NAME), so
alarms per queue watch whatever runs the queue holds. Metric names are read from trainer/contract/metrics.py.

- Training stalled, one alarm per queue the stack creates (the GPU queue, and dev's Spot queue): the Maximum over
  every job on the queue of `SecondsSinceLastStep`, which each run's rank 0 writes every minute from a background
  thread (since its last step, or its start before the first), above `stallAlarmMinutes`. The Maximum is per job in
  effect: one stalled or never-started job among several healthy ones raises it (a Sum of `Steps` over the queue,
  used before, did not move). No data is not breaching: an idle queue, and a run that ended cleanly, stay quiet. A
  job that died is a failed Batch job, which the failed-job rule reports.
- Slow training: `MFU` or `TokensPerSecond` below `minMfu` / `minTokensPerSecond` for `throughputAlarmMinutes`
  (only when a floor is configured; no data here is not breaching, the stall alarm covers silence).
- Job failed: Batch's "Batch Job State Change" events with status FAILED for any of the stack's queues (Batch User
  Guide, "Job state change events": `detail.jobQueue` is the queue's ARN) go to the topic.
- FSx nearly full: `FreeDataStorageCapacity` (AWS/FSx, dimension FileSystemId) below `fsxFreeCapacityAlarmPercent`
  of the capacity. FSx for Lustre emits one point per disk per minute, so the Sum over one minute is the file
  system's free bytes and a Sum over five minutes reads five times too much (FSx for Lustre User Guide, "Amazon FSx
  for Lustre metrics and dimensions", storage capacity metrics): the alarm and the widget read 60-second Sums.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import pulumi
import pulumi_aws as aws

from infra.config import StackConfig
from infra.iam import policy_document
from trainer.contract import metrics as registry
from trainer.contract.metrics import NODE_DIMENSIONS, RANK_DIMENSIONS, RUN_DIMENSIONS
from trainer.contract.serving import VARIANT

if TYPE_CHECKING:
    from infra.cluster import Cluster
    from infra.eks import Eks
    from infra.keys import Keys
    from infra.lustre import Lustre

NAMESPACE = registry.CLOUDWATCH_NAMESPACE
PERIOD_S = 60
FSX_PERIOD_S = 300
# Where Container Insights publishes cluster metrics (CloudWatch user guide, "Container Insights metrics").
CONTAINER_INSIGHTS_NAMESPACE = "ContainerInsights"
# FreeDataStorageCapacity: one point per disk per minute; their Sum over exactly one minute is the file system's
# free bytes (FSx for Lustre User Guide, "Amazon FSx for Lustre metrics and dimensions").
FSX_CAPACITY_PERIOD_S = 60
# Where an endpoint's instance metrics go (SageMaker Developer Guide, "Amazon SageMaker AI metrics in Amazon
# CloudWatch": endpoint instance metrics, CPUUtilization, GPUUtilization).
ENDPOINT_INSTANCE_NAMESPACE = "/aws/sagemaker/Endpoints"


class _AlarmActions(TypedDict):
    """What every alarm of the stack shares (passed with ** to MetricAlarm)."""

    alarm_actions: list[pulumi.Input[str]]
    ok_actions: list[pulumi.Input[str]]
    opts: pulumi.ResourceOptions


@dataclass
class MonitoringArgs:
    config: StackConfig
    account_id: pulumi.Input[str]
    keys: Keys
    lustre: Lustre
    cluster: Cluster | Eks


class Monitoring(pulumi.ComponentResource):
    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainstack:monitoring:Monitoring", name, None, opts)
        cfg, child = args.config, pulumi.ResourceOptions(parent=self)
        prefix = cfg.name_prefix
        # The trainer's JobQueue dimension: Batch queue names ("gpu", and "spot" where the stack has one), or on EKS
        # the stack's Kueue LocalQueue.
        queues = self._queue_names(args)
        queue = queues["gpu"]
        file_system = args.lustre.file_system

        self.topic = aws.sns.Topic(f"{prefix}-alarms", kms_master_key_id=args.keys.key.arn, opts=child)
        self.subscriptions = [
            aws.sns.TopicSubscription(
                f"{prefix}-alarms-{index}", topic=self.topic.arn, protocol="email", endpoint=email, opts=child
            )
            for index, email in enumerate(cfg.alarm_emails)
        ]
        alarm: _AlarmActions = {
            "alarm_actions": [self.topic.arn],
            "ok_actions": [self.topic.arn],
            "opts": child,
        }
        self.failed_jobs: aws.cloudwatch.MetricAlarm | aws.cloudwatch.EventRule
        if cfg.orchestrator == "eks":
            self.failed_jobs = self._failed_pods_alarm(cfg, alarm)
            aws.sns.TopicPolicy(
                f"{prefix}-alarms",
                arn=self.topic.arn,
                policy=self._topic_policy(cfg, args.account_id, self.topic.arn, None),
                opts=child,
            )
        else:
            batch_queues = args.cluster.job_queues  # type: ignore[union-attr]
            self.failed_jobs = aws.cloudwatch.EventRule(
                f"{prefix}-job-failed",
                description=f"trainstack {cfg.stack}: a job on one of the stack's queues failed",
                event_pattern=pulumi.Output.all(*(q.arn for q in batch_queues.values())).apply(
                    failed_job_pattern
                ),
                opts=child,
            )
            aws.cloudwatch.EventTarget(
                f"{prefix}-job-failed", rule=self.failed_jobs.name, arn=self.topic.arn, opts=child
            )
            aws.sns.TopicPolicy(
                f"{prefix}-alarms",
                arn=self.topic.arn,
                policy=self._topic_policy(cfg, args.account_id, self.topic.arn, self.failed_jobs.arn),
                opts=child,
            )
        on_queue = {"JobQueue": queue}
        self.alarms = [
            aws.cloudwatch.MetricAlarm(
                f"{prefix}-training-stalled" if key == "gpu" else f"{prefix}-{key}-training-stalled",
                alarm_description=(
                    f"A job on {cfg.stack}'s {key} queue made no step for {cfg.stall_alarm_minutes} min (or none "
                    "since it started); runbook: docs/monitoring.md#runbook"
                ),
                namespace=NAMESPACE,
                metric_name=registry.SECONDS_SINCE_LAST_STEP.cloudwatch,
                dimensions={"JobQueue": job_queue},
                statistic="Maximum",
                period=PERIOD_S,
                # Any one of the last three minutes: a heartbeat line that lands in the next minute does not flap.
                evaluation_periods=3,
                datapoints_to_alarm=1,
                threshold=cfg.stall_alarm_minutes * 60,
                comparison_operator="GreaterThanThreshold",
                treat_missing_data="notBreaching",
                **alarm,
            )
            for key, job_queue in queues.items()
        ]
        for metric, floor, what in (
            (registry.MFU, cfg.min_mfu, "MFU"),
            (registry.TOKENS_PER_SECOND, cfg.min_tokens_per_second, "tokens/s"),
        ):
            if floor is None:
                continue
            self.alarms.append(
                aws.cloudwatch.MetricAlarm(
                    f"{prefix}-{metric.name.replace('_', '-')}-low",
                    alarm_description=(
                        f"{what} below {floor:g} for {cfg.throughput_alarm_minutes} min on {cfg.stack}'s GPU queue"
                    ),
                    namespace=NAMESPACE,
                    metric_name=metric.cloudwatch,
                    dimensions=on_queue,
                    statistic="Average",
                    period=PERIOD_S,
                    evaluation_periods=cfg.throughput_alarm_minutes,
                    threshold=floor,
                    comparison_operator="LessThanThreshold",
                    treat_missing_data="notBreaching",
                    **alarm,
                )
            )
        free_bytes = cfg.fsx_storage_capacity_gib * 2**30 * cfg.fsx_free_capacity_alarm_percent / 100
        self.alarms.append(
            aws.cloudwatch.MetricAlarm(
                f"{prefix}-fsx-nearly-full",
                alarm_description=(
                    f"FSx for Lustre of {cfg.stack} has under {cfg.fsx_free_capacity_alarm_percent} % free"
                ),
                namespace="AWS/FSx",
                metric_name="FreeDataStorageCapacity",
                dimensions={"FileSystemId": file_system.id},
                statistic="Sum",
                period=FSX_CAPACITY_PERIOD_S,
                evaluation_periods=1,
                threshold=free_bytes,
                comparison_operator="LessThanThreshold",
                treat_missing_data="missing",
                **alarm,
            )
        )
        self.dashboard = aws.cloudwatch.Dashboard(
            f"{prefix}-training",
            dashboard_name=f"{prefix}-training",
            dashboard_body=pulumi.Output.all(file_system.id, *queues.values()).apply(
                lambda values: json.dumps(
                    dashboard_body(
                        cfg.region,
                        values[1],
                        values[0],
                        values[1:],
                        endpoint=cfg.serving_endpoint_name if cfg.serving is not None else None,
                    )
                )
            ),
            opts=child,
        )
        self.outputs = {"alarm_topic_arn": self.topic.arn, "dashboard_name": self.dashboard.dashboard_name}
        self.register_outputs(self.outputs)

    @staticmethod
    def _queue_names(args: MonitoringArgs) -> dict[str, pulumi.Input[str]]:
        if args.config.orchestrator == "eks":
            from infra.cluster_software import local_queue_name

            return {"gpu": local_queue_name(args.config)}
        return {key: q.name for key, q in args.cluster.job_queues.items()}  # type: ignore[union-attr]

    def _failed_pods_alarm(self, cfg: StackConfig, alarm: _AlarmActions) -> aws.cloudwatch.MetricAlarm:
        """EKS: a failed JobSet leaves its pods Failed (restartPolicy Never; JobSet deletes them only to restart),
        which Container Insights counts as `pod_status_failed` per cluster (aws/amazon-cloudwatch-agent
        translator/translate/otel/exporter/awsemf/kubernetes.go, enhanced Container Insights). Two minutes in a
        row, so that the pods of a JobSet restart (deleted within seconds) do not page; Batch pages on the
        FAILED event instead."""
        return aws.cloudwatch.MetricAlarm(
            f"{cfg.name_prefix}-job-failed",
            alarm_description=(
                f"Pods failed on {cfg.stack}'s EKS cluster for 2 min: a JobSet failed (kubectl get jobsets -n "
                "trainstack); runbook: docs/eks.md#runbook"
            ),
            namespace=CONTAINER_INSIGHTS_NAMESPACE,
            metric_name="pod_status_failed",
            dimensions={"ClusterName": cfg.eks_cluster_name},
            statistic="Maximum",
            period=PERIOD_S,
            evaluation_periods=2,
            datapoints_to_alarm=2,
            threshold=0,
            comparison_operator="GreaterThanThreshold",
            treat_missing_data="notBreaching",
            **alarm,
        )

    @staticmethod
    def _topic_policy(
        cfg: StackConfig,
        account: pulumi.Input[str],
        topic: pulumi.Input[str],
        rule_arn: pulumi.Input[str] | None,
    ) -> Any:
        alarms = pulumi.Output.concat(
            "arn:aws:cloudwatch:", cfg.region, ":", account, ":alarm:", cfg.name_prefix, "-*"
        )
        statements: list[dict[str, Any]] = [
            {
                "Sid": "StackAlarmsPublish",
                "Effect": "Allow",
                "Principal": {"Service": "cloudwatch.amazonaws.com"},
                "Action": "sns:Publish",
                "Resource": topic,
                "Condition": {
                    "ArnLike": {"aws:SourceArn": alarms},
                    "StringEquals": {"aws:SourceAccount": account},
                },
            },
            # Cost Management User Guide, "Creating an Amazon SNS topic for budget notifications": this account's
            # budgets (infra/budget.py) only.
            {
                "Sid": "AccountBudgetsPublish",
                "Effect": "Allow",
                "Principal": {"Service": "budgets.amazonaws.com"},
                "Action": "sns:Publish",
                "Resource": topic,
                "Condition": {
                    "StringEquals": {"aws:SourceAccount": account},
                    "ArnLike": {"aws:SourceArn": pulumi.Output.concat("arn:aws:budgets::", account, ":*")},
                },
            },
        ]
        if rule_arn is not None:
            statements.append(
                {
                    "Sid": "FailedJobRulePublishes",
                    "Effect": "Allow",
                    "Principal": {"Service": "events.amazonaws.com"},
                    "Action": "sns:Publish",
                    "Resource": topic,
                    "Condition": {"ArnEquals": {"aws:SourceArn": rule_arn}},
                }
            )
        return policy_document(*statements)


def failed_job_pattern(queue_arns: list[str]) -> str:
    """EventBridge pattern: these queues' jobs entering FAILED (Batch User Guide, "Job state change events")."""
    return json.dumps(
        {
            "source": ["aws.batch"],
            "detail-type": ["Batch Job State Change"],
            "detail": {"status": ["FAILED"], "jobQueue": list(queue_arns)},
        }
    )


def _search(dimensions: list[str], metric: registry.Metric, queue: str, statistic: str) -> dict[str, str]:
    """A SEARCH expression: every series of `metric` under the queue, one line per Run / Rank / Node."""
    assert metric.cloudwatch is not None, f"{metric.name} is not pushed to CloudWatch"
    schema = ",".join([NAMESPACE, *dimensions])
    expression = f"SEARCH('{{{schema}}} MetricName=\"{metric.cloudwatch}\" JobQueue=\"{queue}\"', '{statistic}', {PERIOD_S})"
    return {"expression": expression, "label": metric.cloudwatch}


def _widget(title: str, series: list[Any], region: str, x: int, y: int, **properties: Any) -> dict[str, Any]:
    """A metric widget; `series`: metric arrays or expression objects, as the dashboard body takes them."""
    return {
        "type": "metric",
        "x": x,
        "y": y,
        "width": 12,
        "height": 6,
        "properties": {
            "title": title,
            "region": region,
            "view": "timeSeries",
            "metrics": series,
            **properties,
        },
    }


def dashboard_body(
    region: str,
    queue: str,
    file_system_id: str,
    queues: list[str] | tuple[str, ...] = (),
    endpoint: str | None = None,
) -> dict[str, Any]:
    """CloudWatch dashboard body (Dashboard Body Structure and Syntax, CloudWatch API reference): loss, throughput,
    MFU, step time per rank, GPUs and EFA per node, FSx throughput and free capacity for the GPU queue `queue`, and
    each run's seconds since its last step on every queue in `queues` (what the stall alarms read); with an
    `endpoint`, the inference pool's row (endpoint_widgets)."""
    run, rank, node = RUN_DIMENSIONS[1], RANK_DIMENSIONS[0], NODE_DIMENSIONS[0]

    def searches(dimensions, statistic, *wanted):
        return [
            [{**_search(dimensions, metric, queue, statistic), "id": f"m{i}"}]
            for i, metric in enumerate(wanted)
        ]

    fsx = {"FileSystemId": file_system_id}
    fsx_throughput = [
        [
            "AWS/FSx",
            "DataReadBytes",
            "FileSystemId",
            fsx["FileSystemId"],
            {"id": "read", "stat": "Sum", "visible": False},
        ],
        [
            "AWS/FSx",
            "DataWriteBytes",
            "FileSystemId",
            fsx["FileSystemId"],
            {"id": "write", "stat": "Sum", "visible": False},
        ],
        [{"expression": f"read/{FSX_PERIOD_S}", "label": "read bytes/s", "id": "r"}],
        [{"expression": f"write/{FSX_PERIOD_S}", "label": "write bytes/s", "id": "w"}],
    ]
    return {
        "widgets": [
            _widget(
                "Loss",
                searches(run, "Average", registry.TRAINING_LOSS, registry.VALIDATION_LOSS),
                region,
                0,
                0,
            ),
            _widget("Tokens/s", searches(run, "Average", registry.TOKENS_PER_SECOND), region, 12, 0),
            _widget("MFU", searches(run, "Average", registry.MFU), region, 0, 6),
            _widget("Step time per rank (s)", searches(rank, "Average", registry.STEP_TIME), region, 12, 6),
            _widget(
                "GPU utilisation, temperature, power (per node)",
                searches(
                    node, "Average", registry.GPU_UTILIZATION, registry.GPU_TEMPERATURE, registry.GPU_POWER
                ),
                region,
                0,
                12,
            ),
            _widget(
                "EFA bytes and retransmits (per node)",
                searches(
                    node,
                    "Sum",
                    registry.EFA_TRANSMITTED,
                    registry.EFA_RECEIVED,
                    registry.EFA_RETRANSMITTED_PACKETS,
                ),
                region,
                12,
                12,
            ),
            _widget(
                "Seconds since the last step, per run (stall alarms)",
                [
                    # A dynamic label (CloudWatch User Guide, "Use dynamic labels"): one line per queue and run.
                    [
                        {
                            **_search(run, registry.SECONDS_SINCE_LAST_STEP, name, "Maximum"),
                            "label": f"{name} ${{PROP('Dim.Run')}}",
                            "id": f"q{i}",
                        }
                    ]
                    for i, name in enumerate(queues or (queue,))
                ],
                region,
                0,
                24,
            ),
            # The cost row: each run's ledger (trainer/cost/ledger.py), every attempt counted.
            _widget(
                "Cost per run ($, $ per million tokens)",
                searches(run, "Maximum", registry.COST, registry.COST_PER_MILLION_TOKENS),
                region,
                12,
                24,
            ),
            _widget(
                "Goodput per run (productive share of paid time)",
                searches(run, "Average", registry.GOODPUT),
                region,
                0,
                30,
            ),
            _widget("FSx throughput (bytes/s)", fsx_throughput, region, 0, 18, period=FSX_PERIOD_S),
            _widget(
                "FSx free capacity (bytes)",
                [
                    [
                        "AWS/FSx",
                        "FreeDataStorageCapacity",
                        "FileSystemId",
                        fsx["FileSystemId"],
                        {"stat": "Sum"},
                    ]
                ],
                region,
                12,
                18,
                period=FSX_CAPACITY_PERIOD_S,
            ),
            *(endpoint_widgets(region, endpoint, 36) if endpoint is not None else []),
        ]
    }


def endpoint_widgets(region: str, endpoint: str, y: int) -> list[dict[str, Any]]:
    """The endpoint's row: invocations and 4XX/5XX, model latency p50/p99, instance count, GPU utilisation. Metric
    names and namespaces: SageMaker Developer Guide, "Amazon SageMaker AI metrics in Amazon CloudWatch" (endpoint
    invocation metrics in AWS/SageMaker; instance metrics, GPUUtilization among them, in
    /aws/sagemaker/Endpoints); the instance count: the variant's CPUUtilization SampleCount per minute."""
    variant = ["EndpointName", endpoint, "VariantName", VARIANT]
    invocations = [
        ["AWS/SageMaker", name, *variant, {"stat": "Sum"}]
        for name in ("Invocations", "Invocation4XXErrors", "Invocation5XXErrors")
    ]
    latency = [
        ["AWS/SageMaker", "ModelLatency", *variant, {"stat": stat, "label": f"ModelLatency {stat} (us)"}]
        for stat in ("p50", "p99")
    ]
    instances = [
        [
            ENDPOINT_INSTANCE_NAMESPACE,
            "CPUUtilization",
            *variant,
            {"stat": "SampleCount", "label": "instances reporting"},
        ]
    ]
    gpu = [[ENDPOINT_INSTANCE_NAMESPACE, "GPUUtilization", *variant, {"stat": "Average"}]]
    return [
        _widget(f"{endpoint}: invocations, 4XX, 5XX", invocations, region, 0, y),
        _widget(f"{endpoint}: model latency p50, p99 (microseconds)", latency, region, 12, y),
        _widget(f"{endpoint}: instances", instances, region, 0, y + 6),
        _widget(f"{endpoint}: GPU utilisation (%)", gpu, region, 12, y + 6),
    ]
