"""The audit trail: who did what in the stack's account, recorded where nobody can erase it (prod: compliance mode;
elsewhere only a principal allowed to bypass governance retention; docs/security.md).

- A CloudTrail trail in all regions with management events, S3 data events on the datasets and checkpoints buckets,
  log file validation (signed digest files) and SSE-KMS with the stack key (CIS AWS Foundations Benchmark v1.4.0
  3.1, 3.2, 3.7, 3.10, 3.11; Security Hub CloudTrail.1, .2, .4, .5).
- Delivered to a dedicated bucket: public access blocked, TLS only, versioned, S3 Object Lock for
  `auditRetentionDays` in the stack's `audit_lock` mode (S3 User Guide, "Locking objects with Object Lock": in
  compliance mode no user, root included, can delete or overwrite a locked version before its retention ends; in
  governance mode a user with s3:BypassGovernanceRetention can). COMPLIANCE (prod, with `protectData`): the bucket
  and the key are protected and retained on delete, so the logs and the key that decrypts them outlive `pulumi
  destroy`. GOVERNANCE (dev, staging): `force_destroy`, so `pulumi destroy` deletes the locked logs with the bucket
  (pulumi-aws s3.Bucket `force_destroy`: "all objects (including any locked objects) should be deleted"), and the
  bucket depends on the key, so the key is scheduled for deletion only once the bucket is gone.
- Also delivered to a CloudWatch Logs group, where metric filters count the events an operator must hear about and
  alarms page the stack's topic (Security Hub "controls for CloudWatch", CloudWatch.1/.2/.4/.5/.7, whose filter
  patterns are the CIS benchmark's, in `CIS_ALARMS`).

With `trainstack:organizationTrail: <arn>` the account is already recorded by the organisation's trail: the stack
creates none of this and exports that ARN instead (the organisation's management account owns its alarms).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pulumi
import pulumi_aws as aws

from infra.buckets import deny_insecure_transport, private_encrypted_versioned
from infra.config import StackConfig
from infra.iam import LOG_WRITE_ACTIONS, allow, policy_document, service_trust_policy

if TYPE_CHECKING:
    from infra.data_lake import DataLake
    from infra.keys import Keys
    from infra.monitoring import Monitoring

# Metric namespace of the audit alarms' counts.
AUDIT_NAMESPACE = "trainstack/audit"
# Where AWS Config's snapshots go in the audit bucket, with `securityHub: true`.
CONFIG_PREFIX = "config"


@dataclass(frozen=True)
class CisAlarm:
    name: str  # resource-name suffix and metric name
    control: str  # Security Hub control id; the CIS ids are in docs/security.md
    description: str
    pattern: str  # the control's CIS filter pattern


# The CIS v1.2.0 3.x / v1.4.0 4.x remediation pattern each Security Hub CloudWatch control names (copied from public
# copies of the benchmark's texts: the AWS page itself was not readable here).
CIS_ALARMS = (
    CisAlarm(
        "root-use",
        "CloudWatch.1",
        "The root user made a call",
        '{$.userIdentity.type="Root" && $.userIdentity.invokedBy NOT EXISTS && $.eventType !="AwsServiceEvent"}',
    ),
    CisAlarm(
        "unauthorized-api-calls",
        "CloudWatch.2",
        "An API call was refused (unauthorised operation or access denied)",
        '{($.errorCode="*UnauthorizedOperation") || ($.errorCode="AccessDenied*")}',
    ),
    CisAlarm(
        "iam-policy-changes",
        "CloudWatch.4",
        "An IAM policy was created, changed, attached or detached",
        "{($.eventName=DeleteGroupPolicy)||($.eventName=DeleteRolePolicy)||($.eventName=DeleteUserPolicy)||"
        "($.eventName=PutGroupPolicy)||($.eventName=PutRolePolicy)||($.eventName=PutUserPolicy)||"
        "($.eventName=CreatePolicy)||($.eventName=DeletePolicy)||($.eventName=CreatePolicyVersion)||"
        "($.eventName=DeletePolicyVersion)||($.eventName=AttachRolePolicy)||($.eventName=DetachRolePolicy)||"
        "($.eventName=AttachUserPolicy)||($.eventName=DetachUserPolicy)||($.eventName=AttachGroupPolicy)||"
        "($.eventName=DetachGroupPolicy)}",
    ),
    CisAlarm(
        "trail-changes",
        "CloudWatch.5",
        "A trail was created, changed, deleted, started or stopped",
        "{($.eventName=CreateTrail) || ($.eventName=UpdateTrail) || ($.eventName=DeleteTrail) || "
        "($.eventName=StartLogging) || ($.eventName=StopLogging)}",
    ),
    CisAlarm(
        "key-disabled-or-deleted",
        "CloudWatch.7",
        "A KMS key was disabled or scheduled for deletion",
        "{($.eventSource=kms.amazonaws.com) && (($.eventName=DisableKey) || ($.eventName=ScheduleKeyDeletion))}",
    ),
)


def config_bucket_statements(bucket_arn: pulumi.Input[str], account: pulumi.Input[str]) -> list[dict]:
    """AWS Config Developer Guide, "Permissions for the Amazon S3 Bucket for the AWS Config Delivery Channel"."""
    config = {"Service": "config.amazonaws.com"}
    source = {"aws:SourceAccount": account}
    return [
        {
            "Sid": "ConfigBucketCheck",
            "Effect": "Allow",
            "Principal": config,
            "Action": ["s3:GetBucketAcl", "s3:ListBucket"],
            "Resource": bucket_arn,
            "Condition": {"StringEquals": source},
        },
        {
            "Sid": "ConfigDelivery",
            "Effect": "Allow",
            "Principal": config,
            "Action": "s3:PutObject",
            "Resource": pulumi.Output.concat(
                bucket_arn, "/", CONFIG_PREFIX, "/AWSLogs/", account, "/Config/*"
            ),
            "Condition": {"StringEquals": {"s3:x-amz-acl": "bucket-owner-full-control", **source}},
        },
    ]


@dataclass
class AuditArgs:
    config: StackConfig
    account_id: pulumi.Input[str]
    keys: Keys
    lake: DataLake
    monitoring: Monitoring


class Audit(pulumi.ComponentResource):
    """The stack's trail, its Object-Locked log bucket and log group, and the CIS alarms on the stack's topic."""

    def __init__(self, name: str, args: AuditArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        # Inputs the policy pack reads: where data may live (policy/residency.py), whose trail records the stack
        # (policy/audit.py).
        inputs = {
            "allowedRegions": args.config.data_regions,
            "organizationTrail": args.config.organization_trail,
        }
        super().__init__("trainstack:audit:Audit", name, inputs, opts)
        cfg = args.config
        if cfg.organization_trail is not None:
            self.outputs: dict[str, pulumi.Input[str]] = {"audit_trail": cfg.organization_trail}
            self.register_outputs(self.outputs)
            return
        child = pulumi.ResourceOptions(parent=self)
        prefix, account = cfg.name_prefix, args.account_id
        trail_arn = pulumi.Output.concat(
            "arn:aws:cloudtrail:", cfg.region, ":", account, ":trail/", cfg.audit_trail_name
        )

        self.bucket = self._log_bucket(cfg, account, args.keys, trail_arn)
        self.log_group = aws.cloudwatch.LogGroup(
            f"{prefix}-audit",
            name=f"{cfg.log_group_prefix}/cloudtrail",
            retention_in_days=cfg.log_retention_days,
            kms_key_id=args.keys.key.arn,
            opts=child,
        )
        # CloudTrail User Guide, "Role policy document for CloudTrail to use CloudWatch Logs for monitoring".
        delivery_role = aws.iam.Role(
            f"{prefix}-audit-delivery",
            description="CloudTrail delivers the stack trail's events to its log group",
            # The trust of CloudTrail's own CloudWatch Logs role (CloudTrail User Guide, "Sending events to CloudWatch
            # Logs" / "Role policy document for CloudTrail to use CloudWatch Logs": CloudTrail_CloudWatchLogs_Role), no
            # condition: AWS documents no aws:SourceArn on this AssumeRole, and delivery stopped with one
            # (prowler-cloud/prowler issue 4714; issue 46 item 13). The role can only write the trail's log group.
            assume_role_policy=service_trust_policy("cloudtrail.amazonaws.com"),
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{prefix}-audit-delivery",
            role=delivery_role.id,
            policy=policy_document(
                allow(
                    "DeliverToTrailLogGroup",
                    LOG_WRITE_ACTIONS,
                    [pulumi.Output.concat(self.log_group.arn, ":log-stream:*")],
                )
            ),
            opts=child,
        )
        self.trail = aws.cloudtrail.Trail(
            f"{prefix}-audit",
            name=cfg.audit_trail_name,
            s3_bucket_name=self.bucket.id,
            is_multi_region_trail=True,
            include_global_service_events=True,
            enable_log_file_validation=True,
            kms_key_id=args.keys.key.arn,
            cloud_watch_logs_group_arn=pulumi.Output.concat(self.log_group.arn, ":*"),
            cloud_watch_logs_role_arn=delivery_role.arn,
            event_selectors=[
                {
                    "read_write_type": "All",
                    "include_management_events": True,
                    # "arn:aws:s3:::<bucket>/" selects every object of the bucket (CloudTrail API, DataResource).
                    "data_resources": [
                        {
                            "type": "AWS::S3::Object",
                            "values": [
                                pulumi.Output.concat(args.lake.datasets.arn, "/"),
                                pulumi.Output.concat(args.lake.checkpoints.arn, "/"),
                            ],
                        }
                    ],
                }
            ],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.bucket_policy]),
        )
        topic = args.monitoring.topic.arn
        self.alarms = []
        for alarm in CIS_ALARMS:
            aws.cloudwatch.LogMetricFilter(
                f"{prefix}-audit-{alarm.name}",
                log_group_name=self.log_group.name,
                pattern=alarm.pattern,
                metric_transformation={"name": alarm.name, "namespace": AUDIT_NAMESPACE, "value": "1"},
                opts=child,
            )
            self.alarms.append(
                aws.cloudwatch.MetricAlarm(
                    f"{prefix}-audit-{alarm.name}",
                    alarm_description=f"{alarm.description} in {cfg.stack}'s account ({alarm.control})",
                    namespace=AUDIT_NAMESPACE,
                    metric_name=alarm.name,
                    statistic="Sum",
                    period=300,
                    evaluation_periods=1,
                    threshold=1,
                    comparison_operator="GreaterThanOrEqualToThreshold",
                    treat_missing_data="notBreaching",
                    alarm_actions=[topic],
                    ok_actions=[topic],
                    opts=child,
                )
            )
        if cfg.security_hub:
            self._security_hub(cfg, account, args.keys)
        self.outputs = {"audit_trail": self.trail.arn, "audit_bucket": self.bucket.bucket}
        self.register_outputs(self.outputs)

    def _security_hub(self, cfg: StackConfig, account: pulumi.Input[str], keys: Keys) -> None:
        """`securityHub: true`: Security Hub with the Foundational Security Best Practices standard, and the AWS
        Config recorder its checks need, delivering to the audit bucket (docs/security.md: what they cost)."""
        child = pulumi.ResourceOptions(parent=self)
        hub = aws.securityhub.Account(
            f"{cfg.name_prefix}-security-hub",
            enable_default_standards=False,
            control_finding_generator="SECURITY_CONTROL",  # one finding per control, as make compliance reads them
            opts=child,
        )
        aws.securityhub.StandardsSubscription(
            f"{cfg.name_prefix}-fsbp",
            # Security Hub User Guide, "AWS Foundational Security Best Practices standard": the standard's ARN.
            standards_arn=f"arn:aws:securityhub:{cfg.region}::standards/aws-foundational-security-best-practices/v/1.0.0",
            opts=pulumi.ResourceOptions(parent=self, depends_on=[hub]),
        )
        recorder = aws.cfg.Recorder(
            f"{cfg.name_prefix}-config",
            name=cfg.name_prefix,
            # Security Hub Config.1 wants the service-linked role (aws iam create-service-linked-role
            # --aws-service-name config.amazonaws.com creates it once per account).
            role_arn=pulumi.Output.concat(
                "arn:aws:iam::",
                account,
                ":role/aws-service-role/config.amazonaws.com/AWSServiceRoleForConfig",
            ),
            recording_group={"all_supported": True, "include_global_resource_types": False},
            opts=child,
        )
        config_bucket, config_policy = self._config_bucket(cfg, account, keys)
        channel = aws.cfg.DeliveryChannel(
            f"{cfg.name_prefix}-config",
            name=cfg.name_prefix,
            s3_bucket_name=config_bucket.id,
            s3_key_prefix=CONFIG_PREFIX,
            s3_kms_key_arn=keys.key.arn,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[recorder, config_policy]),
        )
        aws.cfg.RecorderStatus(
            f"{cfg.name_prefix}-config",
            name=recorder.name,
            is_enabled=True,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[channel]),
        )

    def _config_bucket(
        self, cfg: StackConfig, account: pulumi.Input[str], keys: Keys
    ) -> tuple[aws.s3.Bucket, aws.s3.BucketPolicy]:
        """AWS Config's own bucket, without Object Lock: "AWS Config does not support the delivery channel to an
        Amazon S3 bucket where object lock is enabled" (CloudFormation reference, AWS::Config::DeliveryChannel; AWS
        Config Developer Guide: "... with default retention enabled"), so not the audit log bucket (issue 46 item 8).
        Versioned, under the stack key, private, TLS only, as every bucket of the stack (policy/s3.py)."""
        name = f"{cfg.name_prefix}-config"
        bucket = aws.s3.Bucket(
            name,
            force_destroy=not cfg.protect_data,
            opts=pulumi.ResourceOptions(
                parent=self,
                protect=cfg.protect_data,
                retain_on_delete=cfg.protect_data,
                depends_on=[keys.key],
            ),
        )
        _, public_access = private_encrypted_versioned(name, bucket, keys.key.arn, self)
        policy = aws.s3.BucketPolicy(
            name,
            bucket=bucket.id,
            policy=policy_document(
                deny_insecure_transport(bucket),
                *config_bucket_statements(bucket.arn, account),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[public_access]),
        )
        return bucket, policy

    def _log_bucket(
        self, cfg: StackConfig, account: pulumi.Input[str], keys: Keys, trail_arn: pulumi.Output[str]
    ) -> aws.s3.Bucket:
        name = f"{cfg.name_prefix}-audit-logs"
        # Compliance-locked logs cannot be deleted by anyone before their retention ends: kept (the config refuses
        # COMPLIANCE without protectData). Governance-locked ones go with the bucket on destroy.
        outlives_destroy = cfg.audit_lock == "COMPLIANCE" or cfg.protect_data
        bucket = aws.s3.Bucket(
            name,
            object_lock_enabled=True,
            force_destroy=not outlives_destroy,
            opts=pulumi.ResourceOptions(
                parent=self,
                protect=cfg.protect_data,
                retain_on_delete=outlives_destroy,
                # Deleted before the key: a bucket whose destroy fails (locked logs left) keeps its key too.
                depends_on=[keys.key],
            ),
        )
        versioning, public_access = private_encrypted_versioned(name, bucket, keys.key.arn, self)
        self.object_lock = aws.s3.BucketObjectLockConfiguration(
            name,
            bucket=bucket.id,
            object_lock_enabled="Enabled",
            rule={"default_retention": {"mode": cfg.audit_lock, "days": cfg.audit_retention_days}},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[versioning]),
        )
        # CloudTrail User Guide, "Amazon S3 bucket policy for CloudTrail": ACL check and writes, only for this trail.
        self.bucket_policy = aws.s3.BucketPolicy(
            name,
            bucket=bucket.id,
            policy=policy_document(
                deny_insecure_transport(bucket),
                {
                    "Sid": "CloudTrailAclCheck",
                    "Effect": "Allow",
                    "Principal": {"Service": "cloudtrail.amazonaws.com"},
                    "Action": "s3:GetBucketAcl",
                    "Resource": bucket.arn,
                    "Condition": {"StringEquals": {"aws:SourceArn": trail_arn}},
                },
                {
                    "Sid": "CloudTrailWrite",
                    "Effect": "Allow",
                    "Principal": {"Service": "cloudtrail.amazonaws.com"},
                    "Action": "s3:PutObject",
                    "Resource": pulumi.Output.concat(bucket.arn, "/AWSLogs/", account, "/*"),
                    "Condition": {
                        "StringEquals": {
                            "s3:x-amz-acl": "bucket-owner-full-control",
                            "aws:SourceArn": trail_arn,
                        }
                    },
                },
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[public_access]),
        )
        return bucket
