"""audit-trail-recorded and cis-metric-filters over the stacks' offline previews, with one guardrail taken away."""

from __future__ import annotations

import copy

import pytest
from pulumi_policy.proxy import unknown_checking_proxy

from policy.audit import audit_trail_recorded, cis_metric_filters

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
