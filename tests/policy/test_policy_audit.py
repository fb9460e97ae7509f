"""audit-trail-recorded and cis-metric-filters over the stacks' offline previews, with one guardrail taken away."""

from __future__ import annotations

import copy
import json

import pytest
from pulumi_policy.proxy import unknown_checking_proxy

from policy.audit import audit_trail_recorded, cis_metric_filters, cloudtrail_key_policy

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


def test_a_log_bucket_without_compliance_mode_lock_fails(planned, violations):
    lock = "aws:s3/bucketObjectLockConfiguration:BucketObjectLockConfiguration"
    governance = {"rule": {"defaultRetention": {"mode": "GOVERNANCE", "days": 365}}}
    [(_, message)] = violations(audit_trail_recorded, *with_props(planned("dev"), lock, **governance))
    assert "without Object Lock in compliance mode" in message


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
