"""The inference pool (`trainstack:serving`): what Pulumi owns of the stack's SageMaker real-time endpoint.

Ownership (trainer/contract/serving.py): Pulumi owns the execution role, the security group and the rollback alarms;
`make deploy` (trainer/deploy/) owns the Model, EndpointConfig and Endpoint, and registers the variant's
autoscaling, all from the outputs this component exports. Separate from training capacity on Batch and EKS stacks
alike: its own instances (SageMaker ML instances), its own role, its own security group.

- The role reads only exports: `s3:GetObject` under `<run>/export/` keys of the checkpoints bucket (where
  `finetune-stages` writes them, trainer/models/pipeline.py), not checkpoints, tag events or datasets; decrypts with
  the stack key; pulls the pinned LMI image; manages the endpoint's network interfaces in the stack's private
  subnets (SageMaker Developer Guide, "Give SageMaker AI Hosted Endpoints Access to Resources in Your Amazon VPC");
  writes the endpoint's log group, which the stack creates with its retention and key
  (`StackConfig.serving_log_group`).
- The security group: no ingress (invocations reach the container through SageMaker, not the ENI), HTTPS out
  (S3 through the gateway endpoint, ECR, AWS APIs).
- Alarms, each paging the stack's topic and each a rollback alarm of every deployment
  (DeploymentConfig.AutoRollbackConfiguration): the 5XX error rate, the p99 model latency (ModelLatency is in
  microseconds: SageMaker Developer Guide, "Amazon SageMaker AI metrics in Amazon CloudWatch", endpoint invocation
  metrics), and the smoke check's mismatch that `make deploy` puts while the canary bakes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_aws as aws

from infra.config import ServingConfig, StackConfig
from infra.iam import (
    ECR_PULL_ACTIONS,
    SAGEMAKER_VPC_DESCRIBE_ACTIONS,
    allow,
    policy_document,
    service_trust_policy,
)
from infra.network import Network, https_out_group
from trainer.contract.serving import (
    LMI_REPOSITORY,
    SMOKE_METRIC,
    SMOKE_NAMESPACE,
    VARIANT,
    lmi_account,
    lmi_image,
)

if TYPE_CHECKING:
    from infra.data_lake import DataLake
    from infra.keys import Keys
    from infra.monitoring import Monitoring

PERIOD_S = 60
# The key prefix of every export in the checkpoints bucket: <run>/export/<version>/... (trainer/models/pipeline.py).
EXPORT_KEYS = "*/export/*"
# Network interface actions an endpoint in a VPC needs, scoped to the stack's subnets, group and interfaces.
ENI_ACTIONS = [
    "ec2:CreateNetworkInterface",
    "ec2:CreateNetworkInterfacePermission",
    "ec2:DeleteNetworkInterface",
    "ec2:DeleteNetworkInterfacePermission",
]
# ... and the Describe actions, which name no resource type: only the VPC guide's five (every ec2:Describe* of
# WILDCARD_RESOURCE_ACTIONS would hand the role Karpenter's instance, image and price discovery too).
ENI_DESCRIBE_ACTIONS = list(SAGEMAKER_VPC_DESCRIBE_ACTIONS)
# Its log group exists (the stack creates it): streams and events only.
ENDPOINT_LOG_ACTIONS = ["logs:CreateLogStream", "logs:PutLogEvents"]


@dataclass
class ServingArgs:
    config: StackConfig
    account_id: pulumi.Input[str]
    network: Network
    keys: Keys
    lake: DataLake
    monitoring: Monitoring


def alarm_names(cfg: StackConfig) -> dict[str, str]:
    """The rollback alarms by what they watch; known before they exist, so the outputs can list them."""
    endpoint = cfg.serving_endpoint_name
    return {kind: f"{endpoint}-{kind}" for kind in ("errors", "latency", "smoke")}


class Serving(pulumi.ComponentResource):
    """The execution role, security group and rollback alarms of the stack's endpoint."""

    def __init__(self, name: str, args: ServingArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        cfg, serving = args.config, args.config.serving
        assert serving is not None, "Serving is composed only for a stack with trainstack:serving"
        # The pool's fleet and canary as the component's inputs: the policy pack's serving-canary-fits reads them.
        pool = {
            "minInstances": serving.min_instances,
            "maxInstances": serving.max_instances,
            "canaryPercent": serving.canary_percent,
        }
        super().__init__("trainstack:serving:Serving", name, pool, opts)
        child = pulumi.ResourceOptions(parent=self)
        endpoint = cfg.serving_endpoint_name

        self.security_group = https_out_group(
            endpoint,
            args.network.vpc.id,
            "SageMaker endpoint instances: HTTPS to S3, ECR and AWS APIs; no ingress",
            child,
        )
        # Created before SageMaker would create it, so that it keeps the stack's retention and key.
        self.log_group = aws.cloudwatch.LogGroup(
            endpoint,
            name=cfg.serving_log_group,
            retention_in_days=cfg.log_retention_days,
            kms_key_id=args.keys.key.arn,
            opts=child,
        )
        self.role = aws.iam.Role(
            f"{endpoint}-role",
            assume_role_policy=service_trust_policy("sagemaker.amazonaws.com", args.account_id),
            description="SageMaker endpoint: read the exports it serves, pull the LMI image, its ENIs and logs",
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{endpoint}-role",
            role=self.role.id,
            policy=policy_document(*self._statements(cfg, args)),
            opts=child,
        )
        actions: dict[str, Any] = {
            "alarm_actions": [args.monitoring.topic.arn],
            "ok_actions": [args.monitoring.topic.arn],
            "opts": child,
        }
        names = alarm_names(cfg)
        on_variant = {"EndpointName": endpoint, "VariantName": VARIANT}
        self.alarms = {
            "errors": aws.cloudwatch.MetricAlarm(
                names["errors"],
                name=names["errors"],
                alarm_description=(
                    f"{endpoint}: 5XX responses above {serving.error_rate_alarm_percent:g} % of invocations; rolls "
                    "a deployment back (docs/serving-stack.md#alarms)"
                ),
                metric_queries=error_rate_queries(on_variant),
                evaluation_periods=2,
                datapoints_to_alarm=1,
                threshold=serving.error_rate_alarm_percent,
                comparison_operator="GreaterThanThreshold",
                treat_missing_data="notBreaching",  # no traffic, no errors
                **actions,
            ),
            "latency": aws.cloudwatch.MetricAlarm(
                names["latency"],
                name=names["latency"],
                alarm_description=(
                    f"{endpoint}: p99 model latency above {serving.latency_p99_alarm_ms} ms; rolls a deployment "
                    "back (docs/serving-stack.md#alarms)"
                ),
                namespace="AWS/SageMaker",
                metric_name="ModelLatency",
                dimensions=on_variant,
                extended_statistic="p99",
                period=PERIOD_S,
                evaluation_periods=2,
                datapoints_to_alarm=2,
                threshold=serving.latency_p99_alarm_ms * 1000,  # ModelLatency: microseconds
                comparison_operator="GreaterThanThreshold",
                treat_missing_data="notBreaching",
                **actions,
            ),
            "smoke": aws.cloudwatch.MetricAlarm(
                names["smoke"],
                name=names["smoke"],
                alarm_description=(
                    f"{endpoint}: a smoke request's greedy answer differs from the one recorded at evaluation; "
                    "rolls a deployment back (docs/serving-stack.md#alarms)"
                ),
                namespace=SMOKE_NAMESPACE,
                metric_name=SMOKE_METRIC,
                dimensions={"EndpointName": endpoint},
                statistic="Maximum",
                period=PERIOD_S,
                evaluation_periods=1,
                threshold=1,
                comparison_operator="GreaterThanOrEqualToThreshold",
                treat_missing_data="notBreaching",  # put only while a deployment bakes
                **actions,
            ),
        }
        self.outputs = serving_outputs(cfg, serving, self.role.arn, self.security_group.id, args.network)
        self.register_outputs(self.outputs)

    @staticmethod
    def _statements(cfg: StackConfig, args: ServingArgs) -> list[dict[str, Any]]:
        bucket, account, region = args.lake.checkpoints.arn, args.account_id, cfg.region
        subnets = [subnet.arn for subnet in args.network.private_subnets]
        interfaces = pulumi.Output.concat("arn:aws:ec2:", region, ":", account, ":network-interface/*")
        group = pulumi.Output.concat("arn:aws:ec2:", region, ":", account, ":security-group/*")
        logs = pulumi.Output.concat(
            "arn:aws:logs:", region, ":", account, ":log-group:", cfg.serving_log_group
        )
        return [
            allow("ReadExports", ["s3:GetObject"], [pulumi.Output.concat(bucket, "/", EXPORT_KEYS)]),
            allow(
                "ListExports",
                ["s3:ListBucket"],
                [bucket],
                Condition={"StringLike": {"s3:prefix": [EXPORT_KEYS]}},
            ),
            allow("DecryptExports", ["kms:Decrypt", "kms:DescribeKey"], [args.keys.key.arn]),
            allow("AwsRequiresWildcardResource", ["ecr:GetAuthorizationToken", *ENI_DESCRIBE_ACTIONS], ["*"]),
            allow(
                "PullLmiImage",
                ECR_PULL_ACTIONS,
                [f"arn:aws:ecr:{region}:{lmi_account(region)}:repository/{LMI_REPOSITORY}"],
            ),
            allow("EndpointNetworkInterfaces", ENI_ACTIONS, [*subnets, interfaces, group]),
            # SageMaker Developer Guide, "Auto-Rollback Configuration and Monitoring": the execution role needs
            # cloudwatch:DescribeAlarms on the auto-rollback alarms for deployment guardrails to watch them.
            allow(
                "ReadRollbackAlarms",
                ["cloudwatch:DescribeAlarms"],
                [
                    pulumi.Output.concat("arn:aws:cloudwatch:", region, ":", account, ":alarm:", name)
                    for name in alarm_names(cfg).values()
                ],
            ),
            allow(
                "WriteEndpointLogs",
                ENDPOINT_LOG_ACTIONS,
                [logs, pulumi.Output.concat(logs, ":log-stream:*")],
            ),
        ]


def error_rate_queries(on_variant: dict[str, str]) -> list[Any]:
    """5XX responses as a percentage of invocations per minute (CloudWatch metric math); no data without traffic."""

    def metric(query_id: str, name: str) -> dict[str, Any]:
        return {
            "id": query_id,
            "metric": {
                "namespace": "AWS/SageMaker",
                "metric_name": name,
                "dimensions": on_variant,
                "period": PERIOD_S,
                "stat": "Sum",
            },
        }

    return [
        metric("errors", "Invocation5XXErrors"),
        metric("invocations", "Invocations"),
        {"id": "rate", "expression": "100 * errors / invocations", "label": "5XX %", "return_data": True},
    ]


def serving_outputs(
    cfg: StackConfig, serving: ServingConfig, role_arn: Any, security_group_id: Any, network: Network
) -> dict[str, Any]:
    """What `make deploy` reads (trainer/contract/outputs.py SERVING_OUTPUTS)."""
    return {
        "serving_endpoint": cfg.serving_endpoint_name,
        "serving_role_arn": role_arn,
        "serving_security_group": security_group_id,
        "serving_subnets": [subnet.id for subnet in network.private_subnets],
        "serving_image": lmi_image(cfg.region),
        "serving_instance_type": serving.instance_type,
        "serving_min_instances": serving.min_instances,
        "serving_max_instances": serving.max_instances,
        "serving_invocations_per_instance": serving.invocations_per_instance,
        "serving_canary_percent": serving.canary_percent,
        "serving_bake_minutes": serving.bake_minutes,
        "serving_alarms": list(alarm_names(cfg).values()),
    }
