"""fsx-free-capacity-sum-per-minute: hand-built alarms, and every stack's offline preview."""

from __future__ import annotations

import pytest

from policy.monitoring import fsx_free_capacity_period
from policy.offline import evaluate

ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
FREE = {"namespace": "AWS/FSx", "metricName": "FreeDataStorageCapacity", "statistic": "Sum"}


def test_a_one_minute_sum_passes(resource, violations):
    assert violations(fsx_free_capacity_period, resource(ALARM, {**FREE, "period": 60.0})) == []


def test_a_five_minute_sum_is_a_violation(resource, violations):
    [(name, message)] = violations(
        fsx_free_capacity_period, resource(ALARM, {**FREE, "period": 300.0}, name="fsx")
    )
    assert name == "fsx" and "period=300.0 s" in message and "Set period=60" in message


def test_other_metrics_and_statistics_are_not_judged(resource, violations):
    minimum = resource(ALARM, {**FREE, "statistic": "Minimum", "period": 300.0})
    steps = resource(
        ALARM, {"namespace": "trainstack", "metricName": "Steps", "statistic": "Sum", "period": 300.0}
    )
    assert violations(fsx_free_capacity_period, minimum, steps) == []


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_every_stack_passes(planned, stack):
    assert [
        v for v in evaluate(planned(stack), stack) if v.policy == "fsx-free-capacity-sum-per-minute"
    ] == []
