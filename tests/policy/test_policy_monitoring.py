"""alarm-has-action and sns-topic-encrypted: hand-built resources, and every stack's offline preview."""

from __future__ import annotations

import pytest

from policy.monitoring import alarm_has_action, topic_encrypted
from policy.offline import evaluate

ALARM, TOPIC = "aws:cloudwatch/metricAlarm:MetricAlarm", "aws:sns/topic:Topic"
KEY = "arn:aws:kms:us-east-1:123456789012:key/k"


def test_alarm_with_an_action_passes(resource, violations):
    assert (
        violations(alarm_has_action, resource(ALARM, {"alarmActions": ["arn:aws:sns:us-east-1:1:t"]})) == []
    )


def test_alarm_without_action_is_a_violation(resource, violations):
    [(name, message)] = violations(alarm_has_action, resource(ALARM, {}, name="stalled"))
    assert name == "stalled" and "no alarm action" in message and "alarm_actions" in message


def test_alarm_with_actions_disabled_is_a_violation(resource, violations):
    props = {"alarmActions": ["arn:aws:sns:us-east-1:1:t"], "actionsEnabled": False}
    [(_, message)] = violations(alarm_has_action, resource(ALARM, props))
    assert "actions_enabled=False" in message


def test_topic_with_the_stack_key_passes(resource, violations):
    assert violations(topic_encrypted, resource(TOPIC, {"kmsMasterKeyId": KEY})) == []


@pytest.mark.parametrize("props", [{}, {"kmsMasterKeyId": "alias/aws/sns"}])
def test_unencrypted_or_aws_managed_topic_is_a_violation(resource, violations, props):
    [(name, message)] = violations(topic_encrypted, resource(TOPIC, props, name="alarms"))
    assert name == "alarms" and "kms_master_key_id" in message


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_every_stack_passes_the_monitoring_policies(planned, stack):
    found = [
        v for v in evaluate(planned(stack), stack) if v.policy in ("alarm-has-action", "sns-topic-encrypted")
    ]
    assert found == []
