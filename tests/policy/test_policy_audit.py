"""audit-trail-recorded and cis-metric-filters over the stacks' offline previews, with one guardrail taken away."""

from __future__ import annotations

import copy
import json

import pytest
from pulumi_policy.proxy import unknown_checking_proxy

from policy.audit import (
    audit_trail_recorded,
    cis_alarms_heard,
    cis_metric_filters,
    cloudtrail_key_policy,
    config_recording,
    locked_logs_kept,
)

TRAIL = "aws:cloudtrail/trail:Trail"
ORG_TRAIL = "arn:aws:cloudtrail:us-east-1:111122223333:trail/org-trail"


def with_props(resources, type_: str, **changes):
    """The stack's resources with `changes` made to the props of every resource of `type_`."""
    changed = []
    for r in resources:
        if r.resource_type == type_:
            r = copy.copy(r)  # the cached plan's resource stays as it was
            r.props = unknown_checking_proxy({**dict(r.props), **changes})
        changed.append(r)
    return changed


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_every_stack_records_and_watches_its_trail(planned, violations, stack):
    resources = planned(stack)
    assert violations(audit_trail_recorded, *resources) == []
    assert violations(cis_metric_filters, *resources) == []


def test_a_stack_relying_on_the_organization_trail_passes(planned, violations):
    resources = planned("staging", **{"trainstack:organizationTrail": ORG_TRAIL})
    assert violations(audit_trail_recorded, *resources) == []
    assert violations(cis_metric_filters, *resources) == []


def test_a_stack_without_any_trail_fails(planned, violations):
    resources = [r for r in planned("dev") if r.resource_type != TRAIL]
    [(_, message)] = violations(audit_trail_recorded, *resources)
    assert "the stack records no audit trail" in message and "trainstack:organizationTrail" in message


@pytest.mark.parametrize(
    ("change", "wanted"),
    [
        ({"enableLogFileValidation": False}, "does not validate its log files"),
        ({"isMultiRegionTrail": False}, "is not multi-region with management events"),
        ({"kmsKeyId": "alias/aws/cloudtrail"}, "is not encrypted with a customer-managed key"),
        ({"cloudWatchLogsGroupArn": None}, "does not feed CloudWatch Logs"),
    ],
)
def test_a_trail_missing_a_setting_fails_on_that_setting(planned, violations, change, wanted):
    [(name, message)] = violations(audit_trail_recorded, *with_props(planned("dev"), TRAIL, **change))
    assert name == "trainstack-dev-audit" and wanted in message


LOCK = "aws:s3/bucketObjectLockConfiguration:BucketObjectLockConfiguration"
BUCKET = "aws:s3/bucket:Bucket"


def test_a_log_bucket_without_an_object_lock_default_retention_fails(planned, violations):
    [(_, message)] = violations(audit_trail_recorded, *with_props(planned("dev"), LOCK, rule=None))
    assert "without an Object Lock default retention" in message


@pytest.mark.parametrize("stack", ["dev", "staging", "prod", "eks-dev"])
def test_every_stack_can_be_destroyed_without_losing_a_key_locked_logs_need(planned, violations, stack):
    assert violations(locked_logs_kept, *planned(stack)) == []


def test_round_three_dev_compliance_lock_on_an_unprotected_stack_fails(planned, violations):
    """The source's case (S3 User Guide: compliance mode "can't be ... deleted by any user, including the root
    user"): dev as built before issue 36, COMPLIANCE for 365 days, neither bucket nor key protected."""
    compliance = {"rule": {"defaultRetention": {"mode": "COMPLIANCE", "days": 365}}}
    resources = with_props(with_props(planned("dev"), LOCK, **compliance), BUCKET, forceDestroy=False)
    found = violations(locked_logs_kept, *resources)
    messages = [message for name, message in found if name == "trainstack-dev-audit-logs"]
    assert len(messages) == 2
    assert "COMPLIANCE mode but not protected" in messages[0]
    assert "its key 'trainstack-dev-key' is not protected" in messages[1]


def test_prod_with_an_unprotected_key_fails(planned, violations):
    resources = []
    for r in planned("prod"):
        if r.resource_type == "aws:kms/key:Key":
            r = copy.copy(r)
            r.opts = copy.copy(r.opts)
            r.opts.protect = False
        resources.append(r)
    [(name, message)] = violations(locked_logs_kept, *resources)
    assert (
        name == "trainstack-prod-audit-logs" and "its key 'trainstack-prod-key' is not protected" in message
    )


def test_a_governance_locked_bucket_without_force_destroy_fails_in_an_unprotected_stack(planned, violations):
    resources = with_props(planned("dev"), BUCKET, forceDestroy=False)
    [(name, message)] = violations(locked_logs_kept, *resources)
    assert name == "trainstack-dev-audit-logs" and "force_destroy=True" in message


def test_a_missing_cis_filter_fails_naming_its_control(planned, violations):
    filters = "aws:cloudwatch/logMetricFilter:LogMetricFilter"
    resources = [
        r for r in planned("dev") if not (r.resource_type == filters and r.name.endswith("-root-use"))
    ]
    [(_, message)] = violations(cis_metric_filters, *resources)
    assert "CloudWatch.1" in message and "LogMetricFilter" in message


def test_a_cis_alarm_without_an_action_fails(planned, violations):
    alarm = "aws:cloudwatch/metricAlarm:MetricAlarm"
    found = violations(cis_metric_filters, *with_props(planned("dev"), alarm, alarmActions=[]))
    assert len(found) == 5 and all("no alarm with an action" in message for _, message in found)


@pytest.mark.parametrize("stack", ["dev", "staging", "prod", "eks-dev"])
def test_every_stack_key_lets_cloudtrail_encrypt_decrypt_and_describe(planned, violations, stack):
    assert violations(cloudtrail_key_policy, *planned(stack)) == []


def test_the_key_policy_of_round_three_without_decrypt_fails_with_a_bucket_key(planned, violations):
    """The guide's failing case: GenerateDataKey* and DescribeKey only, the log bucket with an S3 Bucket Key."""
    key = "aws:kms/key:Key"
    resources = planned("dev")
    (planned_key,) = [r for r in resources if r.resource_type == key]
    document = json.loads(planned_key.props["policy"])
    document["Statement"] = [
        s for s in document["Statement"] if s.get("Sid") != "CloudTrailDecryptsForBucketKey"
    ]
    [(name, message)] = violations(
        cloudtrail_key_policy, *with_props(resources, key, policy=json.dumps(document))
    )
    assert name == "trainstack-dev-audit"
    assert "kms:Decrypt (its bucket uses an S3 Bucket Key)" in message
    assert "InsufficientEncryptionPolicyException" in message


def test_without_a_bucket_key_decrypt_is_not_required_but_encrypt_and_describe_are(planned, violations):
    encryption = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    key = "aws:kms/key:Key"
    resources = planned("dev")
    (planned_key,) = [r for r in resources if r.resource_type == key]
    document = json.loads(planned_key.props["policy"])
    document["Statement"] = [
        s
        for s in document["Statement"]
        if s.get("Sid") not in ("CloudTrailDecryptsForBucketKey", "CloudTrailDescribesKey")
    ]
    no_bucket_key = [
        {**dict(rule), "bucketKeyEnabled": False}
        for rule in next(r for r in resources if r.resource_type == encryption and "audit" in r.name).props[
            "rules"
        ]
    ]
    changed = with_props(resources, key, policy=json.dumps(document))
    changed = [
        with_props([r], encryption, rules=no_bucket_key)[0] if "audit" in r.name else r for r in changed
    ]
    [(_, message)] = violations(cloudtrail_key_policy, *changed)
    assert "kms:DescribeKey:" in message and "kms:Decrypt" not in message


def test_cis_alarms_without_a_subscriber_warn_on_each_alarm_and_pass_with_one(planned, violations):
    found = violations(cis_alarms_heard, *planned("dev"))
    assert sorted(name for name, _ in found) == sorted(
        f"trainstack-dev-audit-{metric}"
        for metric in (
            "root-use",
            "unauthorized-api-calls",
            "iam-policy-changes",
            "trail-changes",
            "key-disabled-or-deleted",
        )
    )
    assert all("trainstack:alarmEmails" in message for _, message in found)
    assert (
        violations(
            cis_alarms_heard,
            *planned("dev", **{"trainstack:alarmEmails": json.dumps(["oncall@example.com"])}),
        )
        == []
    )


def test_config_delivering_to_the_locked_audit_bucket_fails_and_its_own_bucket_passes(planned, violations):
    """Issue 46 item 8: as the stack had it, the delivery channel pointed at the Object-Locked audit bucket."""
    resources = planned("prod", **{"trainstack:securityHub": "true"})
    assert violations(config_recording, *resources) == []
    (audit,) = [
        r for r in resources if r.name == "trainstack-prod-audit-logs" and r.resource_type.endswith("Bucket")
    ]
    (channel,) = [r for r in resources if r.resource_type == "aws:cfg/deliveryChannel:DeliveryChannel"]
    as_before = copy.copy(channel)
    as_before.property_dependencies = {**channel.property_dependencies, "s3BucketName": [audit]}
    [(name, message)] = violations(config_recording, *[as_before if r is channel else r for r in resources])
    assert (
        name == "trainstack-prod-config" and "'trainstack-prod-audit-logs', which has Object Lock" in message
    )
