"""Alerting that reaches someone, and alert messages kept under the stack's key.

- Every CloudWatch alarm has an action: an alarm with none changes state in the console and tells nobody.
- Every SNS topic is encrypted with a customer-managed KMS key (`kms_master_key_id`), not unencrypted and not the
  AWS-managed `alias/aws/sns`, whose key policy no CloudWatch alarm or EventBridge rule can be granted use of
  (SNS Developer Guide, "Enable compatibility between event sources from AWS services and encrypted topics").
"""

from __future__ import annotations

from pulumi_policy import ReportViolation, ResourceValidationArgs, ResourceValidationPolicy
from pulumi_policy.proxy import UnknownValueError

from policy import aws_types
from policy.resources import is_customer_managed_key


def validate_alarm_has_action(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type != aws_types.METRIC_ALARM:
        return
    try:
        actions = list(args.props.get("alarmActions") or [])
        enabled = args.props.get("actionsEnabled")
    except UnknownValueError:  # an action ARN computed during the preview: the alarm has one
        return
    if not actions:
        report_violation(
            f"alarm '{args.name}' has no alarm action, so it pages nobody: set alarm_actions=[<the stack's "
            "alarm topic ARN>] (infra/monitoring.py)",
            None,
        )
    elif enabled is False:
        report_violation(
            f"alarm '{args.name}' has actions_enabled=False, so its actions never run: remove it", None
        )


def validate_topic_encrypted(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type == aws_types.SNS_TOPIC and not is_customer_managed_key(
        args.props, "kmsMasterKeyId"
    ):
        report_violation(
            f"SNS topic '{args.name}' is not encrypted with a customer-managed key: set kms_master_key_id to the "
            "stack key's ARN",
            None,
        )


alarm_has_action = ResourceValidationPolicy(
    name="alarm-has-action",
    description="Every CloudWatch alarm notifies someone: alarm_actions is set and actions are enabled.",
    validate=validate_alarm_has_action,
)

topic_encrypted = ResourceValidationPolicy(
    name="sns-topic-encrypted",
    description="Every SNS topic is encrypted with a customer-managed KMS key.",
    validate=validate_topic_encrypted,
)
