"""Alerting that reaches someone, and alert messages kept under the stack's key.

- Every CloudWatch alarm has an action: an alarm with none changes state in the console and tells nobody.
- Every SNS topic is encrypted with a customer-managed KMS key (`kms_master_key_id`), not unencrypted and not the
  AWS-managed `alias/aws/sns`, whose key policy no CloudWatch alarm or EventBridge rule can be granted use of
  (SNS Developer Guide, "Enable compatibility between event sources from AWS services and encrypted topics").
- An alarm on FSx's `FreeDataStorageCapacity` with the Sum statistic reads a 60-second period: FSx for Lustre emits
  one point per disk per minute and the file system's free bytes are their Sum per minute, so a longer period
  multiplies the free space it reads (FSx for Lustre User Guide, "Amazon FSx for Lustre metrics and dimensions").
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


# The one period over which the Sum of FreeDataStorageCapacity is the file system's free bytes (see above).
FSX_FREE_CAPACITY_SUM_PERIOD_S = 60


def validate_fsx_free_capacity_period(
    args: ResourceValidationArgs, report_violation: ReportViolation
) -> None:
    if args.resource_type != aws_types.METRIC_ALARM:
        return
    props = args.props
    if (props.get("namespace"), props.get("metricName"), props.get("statistic")) != (
        "AWS/FSx",
        "FreeDataStorageCapacity",
        "Sum",
    ):
        return
    period = props.get("period")
    if period != FSX_FREE_CAPACITY_SUM_PERIOD_S:
        report_violation(
            f"alarm '{args.name}' sums FSx FreeDataStorageCapacity over period={period!r} s: FSx for Lustre emits "
            "one point per disk per minute, so only a 60 s Sum is the file system's free bytes (a 300 s Sum reads "
            "five times the free space). Set period=60 (infra/monitoring.py).",
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

fsx_free_capacity_period = ResourceValidationPolicy(
    name="fsx-free-capacity-sum-per-minute",
    description=(
        "An alarm summing FSx FreeDataStorageCapacity uses a 60 s period, the one over which the Sum is the file "
        'system\'s free bytes (FSx for Lustre User Guide, "Amazon FSx for Lustre metrics and dimensions").'
    ),
    validate=validate_fsx_free_capacity_period,
)
