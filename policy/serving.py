"""Every SageMaker endpoint is encrypted with the stack's key, placed in the stack's VPC, and rolled back by alarms.

- `endpoint-guarded`, over any Model, EndpointConfiguration or Endpoint a Pulumi program registers: the
  configuration names a customer-managed KMS key for the instances' storage volumes (CreateEndpointConfig
  KmsKeyId), the model runs in a VPC (CreateModel VpcConfig: subnets and security groups), the endpoint updates
  with automatic rollback on CloudWatch alarms (DeploymentConfig.AutoRollbackConfiguration.Alarms). trainstack's
  own endpoint is created by `make deploy`, not Pulumi (trainer/contract/serving.py says why), and its requests are
  held to the same three rules before any call (trainer/deploy/endpoint.py `request_problems`).
- `serving-rollback-alarms`, over a stack with the inference pool (infra/serving.py): the alarms `make deploy`
  names as rollback alarms exist and page someone: the 5XX error rate, the ModelLatency p99 and the smoke check.
- `serving-canary-fits`, over the pool's fleet and canary (the component's inputs): a canary holds at most half
  of the smallest green fleet (botocore sagemaker TrafficRoutingConfig.CanarySize), or there is none (0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pulumi_policy import (
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError

from policy import aws_types
from policy.resources import as_list, is_customer_managed_key, of_type
from trainer.contract.serving import SMOKE_NAMESPACE, canary_problem

SERVING_COMPONENT = "trainstack:serving:Serving"


def _get(props: Mapping[str, Any], key: str) -> Any:
    try:
        return props.get(key)
    except UnknownValueError:  # computed in the preview: set
        return "unknown"


def endpoint_problems(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    if resource_type == aws_types.SAGEMAKER_ENDPOINT_CONFIGURATION and not is_customer_managed_key(
        props, "kmsKeyArn"
    ):
        return ["does not encrypt its instances' volumes with the stack key: set kms_key_arn to its ARN"]
    if resource_type == aws_types.SAGEMAKER_MODEL:
        vpc = _get(props, "vpcConfig")
        if vpc == "unknown":
            return []
        if not vpc or not as_list(vpc.get("subnets")) or not as_list(vpc.get("securityGroupIds")):
            return [
                "runs outside the stack's VPC: set vpc_config with the stack's private subnets and the pool's "
                "security group"
            ]
    if resource_type == aws_types.SAGEMAKER_ENDPOINT:
        config = _get(props, "deploymentConfig")
        if config == "unknown":
            return []
        alarms = as_list(((config or {}).get("autoRollbackConfiguration") or {}).get("alarms"))
        if not alarms:
            return [
                "updates without automatic rollback: set deployment_config.auto_rollback_configuration.alarms "
                "to the stack's rollback alarms"
            ]
    return []


def validate_endpoint_guarded(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    for problem in endpoint_problems(args.resource_type, args.props):
        report_violation(f"SageMaker resource '{args.name}' {problem}", None)


def _pages(alarm: PolicyResource) -> bool:
    return bool(as_list(_get(alarm.props, "alarmActions")))


def _watches(alarm: PolicyResource) -> set[str]:
    """The metric names an alarm reads, directly or through its metric queries."""
    names = {str(_get(alarm.props, "metricName"))} if _get(alarm.props, "metricName") else set()
    for query in as_list(_get(alarm.props, "metricQueries")):
        metric = query.get("metric") or {}
        if metric.get("metricName"):
            names.add(str(metric["metricName"]))
    return names


def serving_alarm_problems(resources: Sequence[PolicyResource]) -> list[str]:
    alarms = [a for a in of_type(resources, [aws_types.METRIC_ALARM]) if _pages(a)]
    wanted = {
        "the 5XX error rate (AWS/SageMaker Invocation5XXErrors)": lambda a: (
            "Invocation5XXErrors" in _watches(a)
        ),
        "the p99 model latency (AWS/SageMaker ModelLatency)": lambda a: (
            "ModelLatency" in _watches(a) and _get(a.props, "extendedStatistic") == "p99"
        ),
        f"the smoke check ({SMOKE_NAMESPACE})": lambda a: _get(a.props, "namespace") == SMOKE_NAMESPACE,
    }
    return [
        f"has no alarm on {what} that pages the stack's topic; make deploy rolls back on it (infra/serving.py)"
        for what, matches in wanted.items()
        if not any(matches(a) for a in alarms)
    ]


def validate_serving_rollback_alarms(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    components = of_type(args.resources, [SERVING_COMPONENT])
    if not components:
        return  # no inference pool
    for problem in serving_alarm_problems(args.resources):
        report_violation(f"the inference pool {problem}", components[0].urn)


endpoint_guarded = ResourceValidationPolicy(
    name="endpoint-guarded",
    description=(
        "SageMaker endpoints encrypt their volumes with a customer-managed key, run their models in a VPC and "
        "roll updates back on CloudWatch alarms."
    ),
    validate=validate_endpoint_guarded,
)

serving_rollback_alarms = StackValidationPolicy(
    name="serving-rollback-alarms",
    description=(
        "A stack with an inference pool has the rollback alarms its deployments name (5XX rate, p99 model "
        "latency, smoke check), each paging the stack's topic."
    ),
    validate=validate_serving_rollback_alarms,
)


def validate_serving_canary_fits(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    for component in of_type(args.resources, [SERVING_COMPONENT]):
        percent, fleet = _get(component.props, "canaryPercent"), _get(component.props, "minInstances")
        known = isinstance(percent, (int, float)) and isinstance(fleet, (int, float))
        if known and (problem := canary_problem(int(percent), int(fleet))):
            report_violation(f"the inference pool's {problem}", component.urn)


serving_canary_fits = StackValidationPolicy(
    name="serving-canary-fits",
    description=(
        "An inference pool's canary is at most half of its smallest green fleet (SageMaker's CanarySize), or the "
        "pool has no canary."
    ),
    validate=validate_serving_canary_fits,
)
