"""endpoint-guarded and serving-rollback-alarms (policy/serving.py): a passing and a failing case each, and every
checked-in stack's inference pool passing as it is."""

from __future__ import annotations

import pytest

from policy.serving import endpoint_guarded, serving_canary_fits, serving_rollback_alarms
from trainer.contract.stack import stack_names

KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
VPC = {"subnets": ["subnet-1"], "securityGroupIds": ["sg-1"]}
ROLLBACK = {"autoRollbackConfiguration": {"alarms": [{"alarmName": "x-errors"}]}}


@pytest.mark.parametrize(
    ("type_", "props"),
    [
        ("aws:sagemaker/endpointConfiguration:EndpointConfiguration", {"kmsKeyArn": KEY}),
        ("aws:sagemaker/model:Model", {"vpcConfig": VPC}),
        ("aws:sagemaker/endpoint:Endpoint", {"deploymentConfig": ROLLBACK}),
    ],
)
def test_a_guarded_endpoint_passes(resource, violations, type_, props):
    assert violations(endpoint_guarded, resource(type_, props)) == []


@pytest.mark.parametrize(
    ("type_", "props", "wanted"),
    [
        ("aws:sagemaker/endpointConfiguration:EndpointConfiguration", {}, "kms_key_arn"),
        (
            "aws:sagemaker/endpointConfiguration:EndpointConfiguration",
            {"kmsKeyArn": "arn:aws:kms:us-east-1:123456789012:alias/aws/sagemaker"},
            "kms_key_arn",
        ),
        ("aws:sagemaker/model:Model", {}, "vpc_config"),
        (
            "aws:sagemaker/model:Model",
            {"vpcConfig": {"subnets": [], "securityGroupIds": ["sg-1"]}},
            "vpc_config",
        ),
        ("aws:sagemaker/endpoint:Endpoint", {}, "auto_rollback_configuration"),
        ("aws:sagemaker/endpoint:Endpoint", {"deploymentConfig": {"blueGreenUpdatePolicy": {}}}, "alarms"),
    ],
)
def test_an_unguarded_endpoint_is_a_violation(resource, violations, type_, props, wanted):
    [(name, message)] = violations(endpoint_guarded, resource(type_, props, name="ep"))
    assert name == "ep" and wanted in message


@pytest.mark.parametrize("stack", stack_names())
def test_every_stacks_pool_has_its_rollback_alarms(planned, violations, stack):
    resources = planned(stack)
    assert any(r.resource_type == "trainstack:serving:Serving" for r in resources)
    assert violations(serving_rollback_alarms, *resources) == []
    assert violations(endpoint_guarded, *resources) == []


@pytest.mark.parametrize("stack", stack_names())
def test_every_stacks_canary_fits_its_fleet_or_there_is_none(planned, violations, stack):
    assert violations(serving_canary_fits, *planned(stack)) == []


def test_a_canary_of_one_instance_out_of_one_is_a_violation(violations, resource):
    pool = {"minInstances": 1, "maxInstances": 2, "canaryPercent": 10}
    [(_, message)] = violations(
        serving_canary_fits, resource("trainstack:serving:Serving", pool, name="pool")
    )
    assert "1 instance(s), over the 50 % of the fleet SageMaker allows (CanarySize)" in message
    assert (
        violations(serving_canary_fits, resource("trainstack:serving:Serving", {**pool, "canaryPercent": 0}))
        == []
    )
    assert (
        violations(serving_canary_fits, resource("trainstack:serving:Serving", {**pool, "minInstances": 2}))
        == []
    )


def test_a_pool_without_its_alarms_is_a_violation(planned, violations):
    resources = [r for r in planned("dev") if r.resource_type != "aws:cloudwatch/metricAlarm:MetricAlarm"]
    found = violations(serving_rollback_alarms, *resources)
    assert [m.split("alarm on ")[1].split(" that")[0] for _, m in found] == [
        "the 5XX error rate (AWS/SageMaker Invocation5XXErrors)",
        "the p99 model latency (AWS/SageMaker ModelLatency)",
        "the smoke check (trainstack/Serving)",
    ]


def test_a_stack_without_a_pool_is_not_judged(planned, violations):
    resources = [
        r
        for r in planned("dev")
        if r.resource_type not in ("trainstack:serving:Serving", "aws:cloudwatch/metricAlarm:MetricAlarm")
    ]
    assert violations(serving_rollback_alarms, *resources) == []
