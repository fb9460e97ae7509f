"""The audit trail (infra/audit.py) under the Pulumi mocks, the key policy's CloudTrail statements, and the log
bucket's Object Lock settings applied to moto's S3, where a locked log file cannot be deleted."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from infra.audit import AUDIT_NAMESPACE, CIS_ALARMS

ORG_TRAIL = "arn:aws:cloudtrail:us-east-1:111122223333:trail/org-trail"


def audit_bucket(stack):
    return stack.one("s3.Bucket", "-audit-logs")


def of(stack, kind: str, bucket) -> list[dict]:
    return [r.inputs for r in stack.all(kind) if r.inputs.get("bucket") == bucket.id]


def statements(document: str) -> dict[str, dict]:
    return {s.get("Sid"): s for s in json.loads(document)["Statement"]}


def test_trail_records_all_regions_and_both_buckets_data_events_signed_and_encrypted(stack):
    trail = stack.one("cloudtrail.Trail").inputs
    assert trail["name"] == f"trainstack-{stack.stack}-audit"
    assert (trail["isMultiRegionTrail"], trail["includeGlobalServiceEvents"]) == (True, True)
    assert trail["enableLogFileValidation"] is True
    assert trail["kmsKeyId"] == stack.key_arn
    assert trail["s3BucketName"] == audit_bucket(stack).id
    (selector,) = trail["eventSelectors"]
    assert (selector["includeManagementEvents"], selector["readWriteType"]) == (True, "All")
    (data,) = selector["dataResources"]
    buckets = [stack.one("s3.Bucket", f"-{b}").outputs["arn"] for b in ("datasets", "checkpoints")]
    assert data == {"type": "AWS::S3::Object", "values": [f"{arn}/" for arn in buckets]}
    group = stack.one("cloudwatch.LogGroup", "-audit")
    assert trail["cloudWatchLogsGroupArn"] == f"{group.outputs['arn']}:*"


def test_log_bucket_is_object_locked_in_the_stacks_mode_for_the_configured_days(stack):
    bucket = audit_bucket(stack)
    assert bucket.inputs["objectLockEnabled"] is True
    (lock,) = of(stack, "s3.BucketObjectLockConfiguration", bucket)
    assert lock["objectLockEnabled"] == "Enabled"
    assert lock["rule"]["defaultRetention"] == {
        "mode": stack.config.audit_lock,
        "days": stack.config.audit_retention_days,
    }
    assert of(stack, "s3.BucketVersioning", bucket)[0]["versioningConfiguration"] == {"status": "Enabled"}
    (block,) = of(stack, "s3.BucketPublicAccessBlock", bucket)
    assert all(block[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls"))
    assert block["restrictPublicBuckets"] is True
    (encryption,) = of(stack, "s3.BucketServerSideEncryptionConfiguration", bucket)
    assert encryption["rules"][0]["applyServerSideEncryptionByDefault"]["kmsMasterKeyId"] == stack.key_arn


def test_prod_locks_in_compliance_mode_and_keeps_bucket_and_key_on_destroy(prod):
    bucket, key = audit_bucket(prod), prod.one("kms.Key")
    assert prod.config.audit_lock == "COMPLIANCE"
    assert (bucket.protect, bucket.retain_on_delete, bucket.inputs["forceDestroy"]) == (True, True, False)
    assert (key.protect, key.retain_on_delete) == (True, True)


@pytest.mark.parametrize("name", ["dev", "staging", "eks-dev"])
def test_unprotected_stacks_lock_in_governance_mode_and_destroy_deletes_the_logs(variant, name):
    stack = variant(name)
    bucket, key = audit_bucket(stack), stack.one("kms.Key")
    assert stack.config.audit_lock == "GOVERNANCE"
    assert (bucket.protect, bucket.retain_on_delete, bucket.inputs["forceDestroy"]) == (False, False, True)
    assert (key.protect, key.retain_on_delete) == (False, False)
    # The bucket is deleted before the key: a destroy that fails on the bucket leaves its key in place.
    assert key.urn in bucket.dependencies


def test_compliance_mode_without_protect_data_is_refused():
    from infra.config import StackConfigError, parse_stack_config, read_stack_file

    values = {**read_stack_file("dev"), "trainstack:auditLockMode": "COMPLIANCE"}
    with pytest.raises(StackConfigError, match="trainstack:auditLockMode = 'COMPLIANCE' on a stack without"):
        parse_stack_config("dev", values)
    with pytest.raises(StackConfigError, match="trainstack:auditLockMode = 'LEGAL'"):
        parse_stack_config("dev", {**values, "trainstack:auditLockMode": "LEGAL"})
    kept = parse_stack_config("dev", {**values, "trainstack:protectData": True})
    assert kept.audit_lock == "COMPLIANCE"


def test_log_bucket_admits_only_this_trail_and_tls(stack):
    (policy,) = of(stack, "s3.BucketPolicy", audit_bucket(stack))
    found = statements(policy["policy"])
    trail = stack.one("cloudtrail.Trail").outputs["arn"]
    assert found["DenyInsecureTransport"]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert found["CloudTrailAclCheck"]["Condition"] == {"StringEquals": {"aws:SourceArn": trail}}
    write = found["CloudTrailWrite"]
    assert write["Resource"].endswith(f"/AWSLogs/{trail.split(':')[4]}/*")
    assert write["Condition"]["StringEquals"] == {
        "s3:x-amz-acl": "bucket-owner-full-control",
        "aws:SourceArn": trail,
    }


def test_key_policy_lets_cloudtrail_encrypt_only_for_the_stack_trail(stack):
    found = statements(stack.one("kms.Key").inputs["policy"])
    trail = stack.one("cloudtrail.Trail").outputs["arn"]
    encrypt = found["CloudTrailEncryptsStackTrail"]
    assert encrypt["Principal"] == {"Service": "cloudtrail.amazonaws.com"}
    assert encrypt["Action"] == "kms:GenerateDataKey*"
    assert encrypt["Condition"]["StringEquals"] == {"aws:SourceArn": trail}
    context = encrypt["Condition"]["StringLike"]["kms:EncryptionContext:aws:cloudtrail:arn"]
    assert context == f"arn:aws:cloudtrail:*:{trail.split(':')[4]}:trail/*"
    assert found["CloudTrailDescribesKey"]["Condition"] == {"StringEquals": {"aws:SourceArn": trail}}
    # "Granting decrypt permissions": with the log bucket's S3 Bucket Key, CreateTrail needs kms:Decrypt.
    decrypt = found["CloudTrailDecryptsForBucketKey"]
    assert (decrypt["Principal"], decrypt["Action"]) == (
        {"Service": "cloudtrail.amazonaws.com"},
        "kms:Decrypt",
    )
    assert decrypt["Condition"] == {"StringEquals": {"aws:SourceArn": trail}}


def test_each_cis_event_has_a_metric_filter_and_an_alarm_on_the_stack_topic(stack):
    topic = stack.one("sns.Topic", "-alarms").outputs["arn"]
    group = stack.one("cloudwatch.LogGroup", "-audit").outputs["name"]
    filters = {f.name: f.inputs for f in stack.all("cloudwatch.LogMetricFilter")}
    alarms = {a.name: a.inputs for a in stack.all("cloudwatch.MetricAlarm") if a.parent == "audit"}
    assert len(filters) == len(alarms) == len(CIS_ALARMS) == 5
    for cis in CIS_ALARMS:
        name = f"trainstack-{stack.stack}-audit-{cis.name}"
        assert filters[name]["logGroupName"] == group and filters[name]["pattern"] == cis.pattern
        assert filters[name]["metricTransformation"] == {
            "name": cis.name,
            "namespace": AUDIT_NAMESPACE,
            "value": "1",
        }
        alarm = alarms[name]
        assert (alarm["namespace"], alarm["metricName"]) == (AUDIT_NAMESPACE, cis.name)
        assert (alarm["comparisonOperator"], alarm["threshold"]) == ("GreaterThanOrEqualToThreshold", 1)
        assert alarm["alarmActions"] == [topic] and cis.control in alarm["alarmDescription"]


def test_alarm_patterns_name_the_events_an_operator_must_hear_about():
    by_control = {cis.control: cis.pattern for cis in CIS_ALARMS}
    assert '$.userIdentity.type="Root"' in by_control["CloudWatch.1"]
    assert "AccessDenied*" in by_control["CloudWatch.2"]
    assert "($.eventName=PutRolePolicy)" in by_control["CloudWatch.4"]
    assert "($.eventName=StopLogging)" in by_control["CloudWatch.5"]
    assert "($.eventName=ScheduleKeyDeletion)" in by_control["CloudWatch.7"]


def test_stack_exports_its_trail_and_bucket(stack):
    assert stack.plan.outputs["audit_trail"] == stack.one("cloudtrail.Trail").outputs["arn"]
    assert stack.plan.outputs["audit_bucket"] == audit_bucket(stack).outputs["bucket"]


@pytest.fixture(scope="module")
def with_org_trail(variant):
    return variant("staging", **{"trainstack:organizationTrail": ORG_TRAIL})


def test_with_an_organization_trail_the_stack_relies_on_it_and_says_so(with_org_trail):
    assert with_org_trail.all("cloudtrail.Trail") == []
    assert [b.name for b in with_org_trail.all("s3.Bucket") if "audit" in b.name] == []
    assert with_org_trail.plan.outputs["audit_trail"] == ORG_TRAIL
    assert "CloudTrailEncryptsStackTrail" not in statements(with_org_trail.one("kms.Key").inputs["policy"])
    from policy.offline import evaluate, policy_resources

    assert evaluate(policy_resources(with_org_trail.plan), "staging") == []


def test_bad_organization_trail_is_refused():
    from infra.config import StackConfigError, parse_stack_config, read_stack_file

    with pytest.raises(StackConfigError, match="not a trail ARN like arn:aws:cloudtrail:"):
        parse_stack_config("dev", {**read_stack_file("dev"), "trainstack:organizationTrail": "org-trail"})


@mock_aws
@pytest.mark.parametrize(("name", "bypass_deletes"), [("prod", False), ("dev", True)])
def test_a_locked_log_file_cannot_be_deleted_before_its_retention_ends(variant, name, bypass_deletes):
    """The planned Object Lock configuration, applied to moto's S3: deleting the locked version is refused; with
    s3:BypassGovernanceRetention's header (what force_destroy sends) only governance mode gives way."""
    stack = variant(name)
    (lock,) = of(stack, "s3.BucketObjectLockConfiguration", audit_bucket(stack))
    s3 = boto3.client("s3", region_name="us-east-1")
    bucket = audit_bucket(stack).id
    s3.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    retention = lock["rule"]["defaultRetention"]
    s3.put_object_lock_configuration(
        Bucket=bucket,
        ObjectLockConfiguration={
            "ObjectLockEnabled": lock["objectLockEnabled"],
            "Rule": {"DefaultRetention": {"Mode": retention["mode"], "Days": int(retention["days"])}},
        },
    )
    key = "AWSLogs/123456789012/CloudTrail/us-east-1/2026/12/04/log.json.gz"
    version = s3.put_object(Bucket=bucket, Key=key, Body=b"{}")["VersionId"]
    with pytest.raises(ClientError) as refused:
        s3.delete_object(Bucket=bucket, Key=key, VersionId=version)
    assert refused.value.response["Error"]["Code"] == "AccessDenied"
    if bypass_deletes:
        s3.delete_object(Bucket=bucket, Key=key, VersionId=version, BypassGovernanceRetention=True)
        assert "Versions" not in s3.list_object_versions(Bucket=bucket)
    else:
        with pytest.raises(ClientError) as refused:
            s3.delete_object(Bucket=bucket, Key=key, VersionId=version, BypassGovernanceRetention=True)
        assert refused.value.response["Error"]["Code"] == "AccessDenied"


@pytest.fixture(scope="module")
def with_security_hub(variant):
    return variant("dev", **{"trainstack:securityHub": True})


def test_security_hub_is_off_by_default(stack):
    assert [r for r in stack.plan.resources if r.type.startswith(("aws:securityhub/", "aws:cfg/"))] == []


def test_security_hub_switch_enables_fsbp_and_config_recording_into_a_bucket_without_object_lock(
    with_security_hub,
):
    stack = with_security_hub
    assert stack.one("securityhub.Account").inputs["enableDefaultStandards"] is False
    standard = stack.one("securityhub.StandardsSubscription").inputs["standardsArn"]
    assert (
        standard
        == "arn:aws:securityhub:us-east-1::standards/aws-foundational-security-best-practices/v/1.0.0"
    )
    recorder = stack.one("cfg.Recorder").inputs
    assert recorder["roleArn"].endswith(":role/aws-service-role/config.amazonaws.com/AWSServiceRoleForConfig")
    assert recorder["recordingGroup"]["allSupported"] is True
    channel = stack.one("cfg.DeliveryChannel").inputs
    # Issue 46 item 8: "AWS Config does not support the delivery channel to an Amazon S3 bucket where object lock
    # is enabled" (AWS::Config::DeliveryChannel reference): its own bucket, not the locked audit log bucket.
    config_bucket = stack.one("s3.Bucket", "-config")
    assert (channel["s3BucketName"], channel["s3KmsKeyArn"]) == (config_bucket.id, stack.key_arn)
    assert channel["s3BucketName"] != audit_bucket(stack).id
    assert not config_bucket.inputs.get("objectLockEnabled")
    assert of(stack, "s3.BucketObjectLockConfiguration", config_bucket) == []
    assert stack.one("cfg.RecorderStatus").inputs["isEnabled"] is True
    (policy,) = of(stack, "s3.BucketPolicy", config_bucket)
    delivery = statements(policy["policy"])["ConfigDelivery"]
    assert delivery["Resource"].endswith(
        f"/config/AWSLogs/{delivery['Condition']['StringEquals']['aws:SourceAccount']}/Config/*"
    )
    key = statements(stack.one("kms.Key").inputs["policy"])["ConfigDeliversToItsBucket"]
    assert key["Principal"] == {"Service": "config.amazonaws.com"}
    from policy.offline import evaluate, policy_resources

    # Only the advisory warning every stack without alarmEmails gets (policy/audit.py cis-alarms-heard).
    assert {v.policy for v in evaluate(policy_resources(stack.plan), "dev")} == {"cis-alarms-heard"}


def test_security_hub_with_an_organization_trail_is_refused():
    from infra.config import StackConfigError, parse_stack_config, read_stack_file

    values = {
        **read_stack_file("dev"),
        "trainstack:securityHub": True,
        "trainstack:organizationTrail": ORG_TRAIL,
    }
    with pytest.raises(
        StackConfigError,
        match="trainstack:securityHub = True: the stack's Security Hub and AWS Config belong with its own",
    ):
        parse_stack_config("dev", values)


def test_the_delivery_role_trusts_cloudtrail_as_the_guides_default_role_does(stack):
    """Issue 46 item 13: CloudTrail_CloudWatchLogs_Role's trust has no condition (CloudTrail User Guide, "Sending
    events to CloudWatch Logs"); with aws:SourceArn delivery stopped (prowler-cloud/prowler issue 4714)."""
    (trust,) = json.loads(stack.one("iam.Role", "-audit-delivery").inputs["assumeRolePolicy"])["Statement"]
    assert trust == {
        "Effect": "Allow",
        "Principal": {"Service": "cloudtrail.amazonaws.com"},
        "Action": "sts:AssumeRole",
    }
