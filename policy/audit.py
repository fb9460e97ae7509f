"""The audit trail (infra/audit.py): recorded everywhere, signed, encrypted, locked, and watched.

- `audit-trail-recorded`: a trainstack program either relies on an organisation trail (its audit component's
  `organizationTrail` input) or has a trail that is multi-region with management events, validates its log files,
  encrypts them with a customer key, feeds CloudWatch Logs, and writes to a bucket with an Object Lock default
  retention (Security Hub CloudTrail.1, .2, .4, .5; S3 User Guide "Locking objects with Object Lock").
- `locked-logs-kept`: a bucket locked in COMPLIANCE mode is protected, and so is the key of its default encryption
  (nobody can delete its logs before their retention ends, and they stay encrypted with that key); one locked in
  GOVERNANCE mode in an unprotected stack has force_destroy, so `pulumi destroy` can delete it.
- `cloudtrail-key-policy`: the key a trail encrypts with lets CloudTrail generate data keys, describe the key and,
  when the trail's bucket uses an S3 Bucket Key, decrypt (CloudTrail User Guide, "Configure AWS KMS key policies for
  CloudTrail", required elements for trails: without them CreateTrail/UpdateTrail answer
  InsufficientEncryptionPolicyException at `pulumi up`).
- `cis-metric-filters`: with the stack's own trail, each CIS event (infra/audit.py `CIS_ALARMS`: root use,
  unauthorised calls, IAM policy changes, trail changes, key disabled or deleted) has a metric filter with that
  control's pattern and an alarm with an action on its metric (Security Hub CloudWatch.1, .2, .4, .5, .7).
- `config-recording`: AWS Config's recorder uses its service-linked role (Security Hub Config.1) and its delivery
  channel writes to a bucket without Object Lock ("AWS Config does
  not support the delivery channel to an Amazon S3 bucket where object lock is enabled", CloudFormation reference
  AWS::Config::DeliveryChannel; the AWS Config Developer Guide says so of default retention).
- `cis-alarms-heard` (advisory): the topic each CIS alarm notifies has a subscription; the controls' audit wants one
  ("Create at least one subscriber to the topic", Security Hub controls for CloudWatch). Advisory: a stack without
  `trainstack:alarmEmails` still deploys, and `make policy` and `make compliance` both report it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyResource,
    ReportViolation,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError

from infra.audit import AUDIT_NAMESPACE, CIS_ALARMS
from policy import aws_types
from policy.iam import parse_document, statements
from policy.resources import as_list, is_customer_managed_key, of_type, referenced, referrers

AUDIT_COMPONENT = "trainstack:audit:Audit"
TRAIL = "aws:cloudtrail/trail:Trail"
BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
OBJECT_LOCK = "aws:s3/bucketObjectLockConfiguration:BucketObjectLockConfiguration"
METRIC_FILTER = "aws:cloudwatch/logMetricFilter:LogMetricFilter"
METRIC_ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
SUBSCRIPTION = "aws:sns/topicSubscription:TopicSubscription"
DELIVERY_CHANNEL = "aws:cfg/deliveryChannel:DeliveryChannel"
RECORDER = "aws:cfg/recorder:Recorder"
# Security Hub Config.1: "AWS Config should be enabled and use the service-linked role for resource recording".
CONFIG_LINKED_ROLE = ":role/aws-service-role/config.amazonaws.com/AWSServiceRoleForConfig"
LOCK_MODES = ("COMPLIANCE", "GOVERNANCE")
CLOUDTRAIL_PRINCIPAL = "cloudtrail.amazonaws.com"
# CloudTrail User Guide, "Configure AWS KMS key policies for CloudTrail", "Required KMS key policy elements for
# trails": 1 encrypt (kms:GenerateDataKey*), 3 describe (kms:DescribeKey); 2 decrypt, which "If you are using an
# existing S3 bucket with an S3 Bucket Key, kms:Decrypt permissions are required to create or update a trail with
# SSE-KMS encryption enabled".
TRAIL_KEY_ACTIONS = ("kms:GenerateDataKey", "kms:DescribeKey")
BUCKET_KEY_ACTION = "kms:Decrypt"


def _get(props: Mapping[str, Any], key: str) -> Any:
    try:
        return props.get(key)
    except UnknownValueError:
        return "<unknown>"  # computed at `pulumi up`: the program did set it


def _records_management_events_everywhere(trail: PolicyResource) -> bool:
    selectors = as_list(_get(trail.props, "eventSelectors"))
    management = not selectors or any(s.get("includeManagementEvents", True) for s in selectors)
    return _get(trail.props, "isMultiRegionTrail") is True and management


def lock_mode(bucket: PolicyResource, resources: Sequence[PolicyResource]) -> str | None:
    """The bucket's Object Lock default retention mode (COMPLIANCE, GOVERNANCE), None without one."""
    if _get(bucket.props, "objectLockEnabled") is not True:
        return None
    for lock in referrers(resources, [OBJECT_LOCK], "bucket", bucket):
        mode = ((lock.props.get("rule") or {}).get("defaultRetention") or {}).get("mode")
        if mode in LOCK_MODES:
            return str(mode)
    return None


def trail_problems(trail: PolicyResource, resources: Sequence[PolicyResource]) -> list[str]:
    problems = []
    if not _records_management_events_everywhere(trail):
        problems.append("is not multi-region with management events (is_multi_region_trail=True)")
    if _get(trail.props, "enableLogFileValidation") is not True:
        problems.append("does not validate its log files (enable_log_file_validation=True)")
    if not is_customer_managed_key(trail.props, "kmsKeyId"):
        problems.append("is not encrypted with a customer-managed key (kms_key_id=<stack key ARN>)")
    if not _get(trail.props, "cloudWatchLogsGroupArn"):
        problems.append(
            "does not feed CloudWatch Logs, where the CIS alarms count events (cloud_watch_logs_*)"
        )
    buckets = referenced(trail, "s3BucketName", BUCKETS)
    if not buckets or not all(lock_mode(b, resources) for b in buckets):
        problems.append(
            "writes to a bucket without an Object Lock default retention (object_lock_enabled=True and "
            "aws.s3.BucketObjectLockConfiguration with default_retention mode COMPLIANCE or GOVERNANCE)"
        )
    return problems


def validate_audit_trail(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    components = of_type(args.resources, [AUDIT_COMPONENT])
    if not components:
        return  # not a trainstack program
    if _get(components[0].props, "organizationTrail"):
        return
    trails = of_type(args.resources, [TRAIL])
    if not trails:
        report_violation(
            "the stack records no audit trail: add infra/audit.py's trail, or name the organisation's trail "
            "in trainstack:organizationTrail",
            components[0].urn,
        )
    for trail in trails:
        for problem in trail_problems(trail, args.resources):
            report_violation(f"trail '{trail.name}' {problem}", trail.urn)


def cloudtrail_allowed(policy: Any) -> list[str]:
    """The action patterns a key policy's Allow statements grant the CloudTrail service principal."""
    document = parse_document(policy)
    if document is None:
        return []
    allowed = []
    for statement in statements(document):
        principal = statement.get("Principal")
        services = as_list(principal.get("Service")) if isinstance(principal, Mapping) else []
        if statement.get("Effect") == "Allow" and (principal == "*" or CLOUDTRAIL_PRINCIPAL in services):
            allowed += [str(action) for action in as_list(statement.get("Action"))]
    return allowed


def grants(allowed: Sequence[str], action: str) -> bool:
    """`allowed` (patterns such as kms:GenerateDataKey*) covers `action`; IAM action names ignore case."""
    return any(fnmatch.fnmatchcase(action.lower(), pattern.lower()) for pattern in allowed)


def uses_bucket_key(bucket: PolicyResource, resources: Sequence[PolicyResource]) -> bool:
    """The bucket's default encryption is SSE-KMS with an S3 Bucket Key (bucket_key_enabled)."""
    for config in referrers(resources, aws_types.BUCKET_ENCRYPTION, "bucket", bucket):
        for rule in as_list(_get(config.props, "rules")):
            if not isinstance(rule, Mapping):
                continue
            default = rule.get("applyServerSideEncryptionByDefault") or {}
            if rule.get("bucketKeyEnabled") is True and default.get("sseAlgorithm") == "aws:kms":
                return True
    return False


def trail_key_problems(trail: PolicyResource, resources: Sequence[PolicyResource]) -> list[str]:
    """What the trail's key policy (the key's `policy`, or a KeyPolicy on it) does not grant CloudTrail."""
    problems = []
    by_urn = {r.urn: r for r in resources}
    buckets = referenced(trail, "s3BucketName", BUCKETS)
    needed = [*TRAIL_KEY_ACTIONS]
    if any(uses_bucket_key(bucket, resources) for bucket in buckets):
        needed.append(BUCKET_KEY_ACTION)
    for key in referenced(trail, "kmsKeyId", [aws_types.KMS_KEY]):
        key = by_urn.get(key.urn, key)
        documents = [_get(key.props, "policy")]
        documents += [
            _get(p.props, "policy") for p in referrers(resources, [aws_types.KMS_KEY_POLICY], "keyId", key)
        ]
        if "<unknown>" in documents:
            continue  # computed at `pulumi up`: judged then
        allowed = [action for document in documents for action in cloudtrail_allowed(document)]
        missing = [action for action in needed if not grants(allowed, action)]
        if missing:
            why = " (its bucket uses an S3 Bucket Key)" if BUCKET_KEY_ACTION in missing else ""
            problems.append(
                f"key '{key.name}' does not allow {CLOUDTRAIL_PRINCIPAL} {', '.join(missing)}{why}: CreateTrail "
                "answers InsufficientEncryptionPolicyException; add the statements of CloudTrail User Guide "
                '"Configure AWS KMS key policies for CloudTrail" (infra/keys.py cloudtrail_key_statements)'
            )
    return problems


def validate_cloudtrail_key_policy(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    for trail in of_type(args.resources, [TRAIL]):
        for problem in trail_key_problems(trail, args.resources):
            report_violation(f"trail '{trail.name}': {problem}", trail.urn)


def locked_bucket_problems(bucket: PolicyResource, resources: Sequence[PolicyResource]) -> list[str]:
    """What `pulumi destroy` would do wrong to a locked bucket: fail on it, or delete the key its logs need."""
    mode = lock_mode(bucket, resources)
    if mode == "COMPLIANCE":
        # S3 User Guide, "Locking objects with Object Lock": a compliance-mode version "can't be overwritten or
        # deleted by any user, including the root user", so destroy cannot empty the bucket, and the key that
        # decrypts the logs must stay as long as they do.
        problems = []
        if not bucket.opts.protect:
            problems.append(
                "is locked in COMPLIANCE mode but not protected: `pulumi destroy` cannot delete its logs before "
                "their retention ends; protect and retain it (trainstack:protectData: true) or lock in GOVERNANCE"
            )
        by_urn = {r.urn: r for r in resources}
        for config in referrers(resources, aws_types.BUCKET_ENCRYPTION, "bucket", bucket):
            for key in referenced(config, "rules", [aws_types.KMS_KEY]):
                if not by_urn.get(key.urn, key).opts.protect:
                    problems.append(
                        f"is locked in COMPLIANCE mode but its key '{key.name}' is not protected: destroy would "
                        "schedule the key's deletion while the logs it decrypts stay locked; protect the key"
                    )
        return problems
    if mode == "GOVERNANCE" and not bucket.opts.protect and _get(bucket.props, "forceDestroy") is not True:
        # pulumi-aws s3.Bucket force_destroy: "all objects (including any locked objects) should be deleted from
        # the bucket when the bucket is destroyed so that the bucket can be destroyed without error".
        return [
            "is locked in GOVERNANCE mode in an unprotected stack but has no force_destroy: `pulumi destroy` "
            "stops at the non-empty bucket; set force_destroy=True (it bypasses governance retention)"
        ]
    return []


def validate_locked_logs_kept(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    for bucket in of_type(args.resources, BUCKETS):
        for problem in locked_bucket_problems(bucket, args.resources):
            report_violation(f"bucket '{bucket.name}' {problem}", bucket.urn)


def validate_cis_metric_filters(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    if not of_type(args.resources, [TRAIL]):
        return  # an organisation trail's alarms live in its own account
    filters = of_type(args.resources, [METRIC_FILTER])
    alarms = of_type(args.resources, [METRIC_ALARM])
    for cis in CIS_ALARMS:
        matching = [f for f in filters if _get(f.props, "pattern") == cis.pattern]
        metrics = {
            (
                (f.props.get("metricTransformation") or {}).get("namespace"),
                (f.props.get("metricTransformation") or {}).get("name"),
            )
            for f in matching
        }
        alarmed = [
            a
            for a in alarms
            if (_get(a.props, "namespace"), _get(a.props, "metricName")) in metrics
            and _get(a.props, "alarmActions")
        ]
        if not matching or not alarmed:
            report_violation(
                f"no {'alarm with an action on the' if matching else ''} metric filter for {cis.control} "
                f"({cis.description.lower()}): add aws.cloudwatch.LogMetricFilter(pattern=<the control's pattern>) "
                "on the trail's log group and a MetricAlarm on its metric with alarm_actions=[<topic>]",
                None,
            )


def validate_config_recording(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    for recorder in of_type(args.resources, [RECORDER]):
        if not str(_get(recorder.props, "roleArn")).endswith(CONFIG_LINKED_ROLE):
            report_violation(
                f"the recorder '{recorder.name}' does not use AWS Config's service-linked role: set role_arn to "
                f"arn:aws:iam::<account>{CONFIG_LINKED_ROLE}",
                recorder.urn,
            )
    for channel in of_type(args.resources, [DELIVERY_CHANNEL]):
        for bucket in referenced(channel, "s3BucketName", BUCKETS):
            if _get(bucket.props, "objectLockEnabled") is True or referrers(
                args.resources, [OBJECT_LOCK], "bucket", bucket
            ):
                report_violation(
                    f"the delivery channel '{channel.name}' writes to bucket '{bucket.name}', which has Object Lock: "
                    "AWS Config does not deliver there; give it a bucket of its own without object_lock_enabled",
                    channel.urn,
                )


def validate_cis_alarms_heard(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    metrics = {cis.name: cis for cis in CIS_ALARMS}
    subscribed = {_get(s.props, "topic") for s in of_type(args.resources, [SUBSCRIPTION])}
    for alarm in of_type(args.resources, [METRIC_ALARM]):
        cis = metrics.get(_get(alarm.props, "metricName"))
        if cis is None or _get(alarm.props, "namespace") != AUDIT_NAMESPACE:
            continue
        unheard = [t for t in as_list(_get(alarm.props, "alarmActions")) if t not in subscribed]
        if unheard or not _get(alarm.props, "alarmActions"):
            report_violation(
                f"the {cis.control} alarm's topic has no subscriber, so nobody hears it: list addresses in "
                "trainstack:alarmEmails (the control's audit wants at least one subscriber)",
                alarm.urn,
            )


audit_trail_recorded = StackValidationPolicy(
    name="audit-trail-recorded",
    description=(
        "The stack's actions are recorded: a multi-region trail with log file validation, a customer-managed key, "
        "CloudWatch Logs delivery and an Object-Locked bucket, or the organisation's trail."
    ),
    validate=validate_audit_trail,
)

cloudtrail_key_policy = StackValidationPolicy(
    name="cloudtrail-key-policy",
    description="The key a trail encrypts with lets CloudTrail encrypt, describe the key and, with an S3 Bucket Key "
    "on the log bucket, decrypt (CloudTrail User Guide, KMS key policies for CloudTrail).",
    validate=validate_cloudtrail_key_policy,
)

locked_logs_kept = StackValidationPolicy(
    name="locked-logs-kept",
    description="A bucket locked in compliance mode, and the key that decrypts it, are protected from `pulumi "
    "destroy`; one locked in governance mode in an unprotected stack is force-destroyed with its logs.",
    validate=validate_locked_logs_kept,
)

cis_metric_filters = StackValidationPolicy(
    name="cis-metric-filters",
    description="With its own trail, the stack alarms on root use, refused calls, IAM policy and trail changes, "
    "and keys disabled or scheduled for deletion (CIS CloudWatch controls).",
    validate=validate_cis_metric_filters,
)

config_recording = StackValidationPolicy(
    name="config-recording",
    description="AWS Config records with its service-linked role and delivers to a bucket without Object Lock "
    "(Security Hub Config.1; AWS::Config::DeliveryChannel reference).",
    validate=validate_config_recording,
)

cis_alarms_heard = StackValidationPolicy(
    name="cis-alarms-heard",
    description="Each CIS alarm's topic has a subscriber (Security Hub CloudWatch.1, .2, .4, .5, .7 remediation).",
    validate=validate_cis_alarms_heard,
    enforcement_level=EnforcementLevel.ADVISORY,
)
