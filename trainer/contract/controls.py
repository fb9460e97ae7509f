"""The security controls `make compliance` reports on: each control's id and text, the policy-pack policies and the
resource types that implement it, or why the stack does not cover it. One list, read by policy/compliance.py
and docs/security.md.

Ids and titles are Security Hub's (Security Hub User Guide, "Security Hub controls reference": the AWS Foundational
Security Best Practices standard, with the CIS AWS Foundations Benchmark requirements each control maps to);
`trainstack.*` are this project's own promises (docs/security.md). Which standard evaluates a control is Security
Hub's to say (Security Hub User Guide, archived awsdocs/aws-security-hub-user-guide 47bfe2f, fsbp-standard.md and
cis-aws-foundations-benchmark.md): FSBP has CloudTrail.1/.2/.4/.5 but no CloudTrail.6/.7 and no CloudWatch.1-14,
which CIS v1.2.0 (all fourteen) and v1.4.0 (all but .2 and .3) have; `make compliance LIVE=1` asks the account.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Control:
    id: str
    title: str
    policies: tuple[str, ...] = ()  # policy/ policies whose passing means the control holds
    resource_types: tuple[str, ...] = ()  # what implements it; none in the stack means not covered
    not_covered: str = ""  # why the stack leaves it to someone else (set when no policy implements it)
    evidence: str = ""  # where else it is proven (tests), for controls a policy cannot judge
    # A CIS alarm control: the metric its alarm watches (infra/audit.py CIS_ALARMS); present only when that alarm is.
    cis_metric: str = ""
    # A control Security Hub judges on every resource of its types: the input each must have set, and why the
    # resources that lack it are accepted (policy/compliance.py reports them as "accepted", never as pass).
    holds_when: str = ""
    accepted: str = ""


TRAIL = "aws:cloudtrail/trail:Trail"
BUCKET = "aws:s3/bucket:Bucket"
KEY = "aws:kms/key:Key"
ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
# The CIS alarm controls' audit also wants a subscriber on the alarms' topic (Security Hub controls for CloudWatch,
# remediation: "Create at least one subscriber to the topic"): policy/audit.py cis-alarms-heard.
CIS_FILTERS = ("cis-metric-filters", "cis-alarms-heard")
# The CIS alarm controls the stack does not build (their patterns: Security Hub controls for CloudWatch).
ACCOUNT_ALARM = (
    "the stack builds no metric filter or alarm for it: {what}, which belong to the account's or the "
    "organisation's alarms (one set per account, CIS v1.2.0/v1.4.0), not to one stack's"
)
CHANGES_ALARM = (
    "the stack builds no metric filter or alarm for it: every `pulumi up` of the stack makes {what} itself, so a "
    "per-stack alarm would page on each deployment; the account's or organisation's CIS alarms cover it"
)

CONTROLS: tuple[Control, ...] = (
    Control(
        "CloudTrail.1",
        "CloudTrail should be enabled and configured with at least one multi-Region trail that includes read and "
        "write management events (CIS 3.1)",
        ("audit-trail-recorded",),
        (TRAIL,),
    ),
    Control(
        "CloudTrail.2",
        "CloudTrail should have encryption at-rest enabled (CIS 3.7)",
        ("audit-trail-recorded",),
        (TRAIL,),
    ),
    Control(
        "CloudTrail.4",
        "CloudTrail log file validation should be enabled (CIS 3.2)",
        ("audit-trail-recorded",),
        (TRAIL,),
    ),
    Control(
        "CloudTrail.5",
        "CloudTrail trails should be integrated with Amazon CloudWatch Logs (CIS 3.4)",
        ("audit-trail-recorded",),
        (TRAIL,),
    ),
    Control(
        "CloudTrail.6",
        "Ensure the S3 bucket used to store CloudTrail logs is not publicly accessible (CIS 3.3)",
        ("s3-public-access-blocked", "s3-tls-only"),
        (BUCKET,),
    ),
    Control(
        "CloudTrail.7",
        "Ensure S3 bucket access logging is enabled on the CloudTrail S3 bucket (CIS 3.6)",
        not_covered="the log bucket has no server access logging: its writers are CloudTrail alone and every "
        "read of it is a management or data event only if a trail records the log bucket, which this stack's "
        "does not (it records the datasets and checkpoints buckets)",
    ),
    Control(
        "CloudWatch.1",
        'A log metric filter and alarm should exist for usage of the "root" user (CIS 3.3 / 1.7)',
        CIS_FILTERS,
        (ALARM,),
        cis_metric="root-use",
    ),
    Control(
        "CloudWatch.2",
        "Ensure a log metric filter and alarm exist for unauthorized API calls (CIS 3.1)",
        CIS_FILTERS,
        (ALARM,),
        cis_metric="unauthorized-api-calls",
    ),
    Control(
        "CloudWatch.3",
        "Ensure a log metric filter and alarm exist for Management Console sign-in without MFA (CIS 3.2)",
        not_covered=ACCOUNT_ALARM.format(
            what="console sign-ins of IAM users, which the stack creates none of"
        ),
    ),
    Control(
        "CloudWatch.4",
        "Ensure a log metric filter and alarm exist for IAM policy changes (CIS 3.4)",
        CIS_FILTERS,
        (ALARM,),
        cis_metric="iam-policy-changes",
    ),
    Control(
        "CloudWatch.5",
        "Ensure a log metric filter and alarm exist for CloudTrail configuration changes (CIS 3.5)",
        CIS_FILTERS,
        (ALARM,),
        cis_metric="trail-changes",
    ),
    Control(
        "CloudWatch.6",
        "Ensure a log metric filter and alarm exist for AWS Management Console authentication failures (CIS 3.6)",
        not_covered=ACCOUNT_ALARM.format(
            what="console sign-in failures, which the stack creates no users for"
        ),
    ),
    Control(
        "CloudWatch.7",
        "Ensure a log metric filter and alarm exist for disabling or scheduled deletion of customer created "
        "CMKs (CIS 3.7)",
        CIS_FILTERS,
        (ALARM,),
        cis_metric="key-disabled-or-deleted",
    ),
    Control(
        "CloudWatch.8",
        "Ensure a log metric filter and alarm exist for S3 bucket policy changes (CIS 3.8)",
        not_covered=CHANGES_ALARM.format(what="bucket policy and lifecycle changes"),
    ),
    Control(
        "CloudWatch.9",
        "Ensure a log metric filter and alarm exist for AWS Config configuration changes (CIS 3.9)",
        not_covered=CHANGES_ALARM.format(
            what="AWS Config recorder and delivery channel changes (securityHub)"
        ),
    ),
    Control(
        "CloudWatch.10",
        "Ensure a log metric filter and alarm exist for security group changes (CIS 3.10)",
        not_covered=CHANGES_ALARM.format(what="security group changes"),
    ),
    Control(
        "CloudWatch.11",
        "Ensure a log metric filter and alarm exist for changes to Network Access Control Lists (NACL) (CIS 3.11)",
        not_covered=CHANGES_ALARM.format(what="network ACL changes (the VPC's default ACL)"),
    ),
    Control(
        "CloudWatch.12",
        "Ensure a log metric filter and alarm exist for changes to network gateways (CIS 3.12)",
        not_covered=CHANGES_ALARM.format(what="internet gateway changes"),
    ),
    Control(
        "CloudWatch.13",
        "Ensure a log metric filter and alarm exist for route table changes (CIS 3.13)",
        not_covered=CHANGES_ALARM.format(what="route and route table changes"),
    ),
    Control(
        "CloudWatch.14",
        "Ensure a log metric filter and alarm exist for VPC changes (CIS 3.14)",
        not_covered=CHANGES_ALARM.format(what="VPC changes"),
    ),
    Control("KMS.4", "AWS KMS key rotation should be enabled (CIS 3.8)", ("kms-key-rotation",), (KEY,)),
    Control(
        "S3.5", "S3 general purpose buckets should require requests to use SSL", ("s3-tls-only",), (BUCKET,)
    ),
    Control(
        "S3.8",
        "S3 general purpose buckets should block public access",
        ("s3-public-access-blocked",),
        (BUCKET,),
    ),
    Control(
        "S3.14", "S3 general purpose buckets should have versioning enabled", ("s3-versioning",), (BUCKET,)
    ),
    Control(
        "S3.15",
        "S3 general purpose buckets should have Object Lock enabled",
        ("audit-trail-recorded",),
        (BUCKET,),
        holds_when="objectLockEnabled",
        accepted="datasets and checkpoints are rewritten and deleted by design (re-prepared, pruned) and versioned "
        "instead (S3.14); AWS Config's bucket may not have Object Lock (AWS::Config::DeliveryChannel reference); "
        "the audit log bucket has it (audit-trail-recorded)",
    ),
    Control(
        "S3.17",
        "S3 general purpose buckets should be encrypted at rest with AWS KMS keys",
        ("s3-cmk-encryption",),
        (BUCKET,),
    ),
    Control(
        "EC2.8",
        "EC2 instances should use Instance Metadata Service Version 2 (IMDSv2)",
        ("imdsv2-required",),
        ("aws:ec2/launchTemplate:LaunchTemplate",),
    ),
    Control(
        "EC2.53",
        "EC2 security groups should not allow ingress from 0.0.0.0/0 to remote server administration ports",
        ("no-internet-ingress",),
        ("aws:ec2/securityGroup:SecurityGroup",),
    ),
    Control(
        "IAM.1",
        'IAM policies should not allow full "*" administrative privileges',
        ("iam-no-wildcard-action", "iam-no-wildcard-resource"),
        ("aws:iam/role:Role",),
    ),
    Control(
        "SNS.1",
        "SNS topics should be encrypted at-rest using AWS KMS",
        ("sns-topic-encrypted",),
        ("aws:sns/topic:Topic",),
    ),
    Control(
        "IAM.6",
        "Hardware MFA should be enabled for the root user (CIS 1.6)",
        not_covered="an account setting, outside any stack: the CloudWatch.1 alarm pages when root is used, once its "
        "topic has a subscriber",
    ),
    Control(
        "Config.1",
        "AWS Config should be enabled and use the service-linked role for resource recording",
        ("config-recording",),
        resource_types=("aws:cfg/recorder:Recorder",),
        not_covered="off unless trainstack:securityHub is true (it costs money: docs/security.md#compliance-report)",
    ),
    Control(
        "trainstack.residency",
        "Regional resources, replication rules and cross-region copies stay in trainstack:allowedRegions",
        ("data-residency",),
        ("pulumi:providers:aws",),
    ),
    Control(
        "trainstack.teams",
        "A team's role is denied another team's S3 prefixes, queue share and jobs",
        # Teams on Batch get a fair-share scheduling policy, on EKS per-team RoleBindings (infra/eks_teams.py).
        resource_types=(
            "aws:batch/schedulingPolicy:SchedulingPolicy",
            "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding",
        ),
        not_covered="the stack has no trainstack:teams (on Batch or EKS): it is single-tenant",
        evidence="policy evaluation of the generated team policy: tests/infra/test_teams.py; on EKS the team "
        "namespaces' RBAC and pod roles: tests/policy/test_policy_rbac.py, tests/infra/test_eks_teams.py",
    ),
    # EKS stacks (docs/eks.md). EKS.8's title as Security Hub's controls reference words it; the control checks that
    # the `audit` control plane log type is enabled.
    Control(
        "EKS.8",
        "EKS clusters should have audit logging enabled",
        ("eks-audit-logs-enabled",),
        ("aws:eks/cluster:Cluster",),
        not_covered="the stack runs its jobs on AWS Batch (trainstack:orchestrator), so it has no EKS cluster",
    ),
    Control(
        "trainstack.eks-teams",
        "On EKS, a team's Kubernetes group reaches only its own namespace and JobSets, and its pods read only its S3 "
        "prefix",
        ("eks-team-rbac-own-namespace",),
        ("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding",),
        not_covered="the stack has no teams on EKS",
        evidence="RBAC decided per verb and namespace and the pod roles under moto's IAM enforcement: "
        "tests/policy/test_policy_rbac.py, tests/infra/test_eks_teams.py",
    ),
)
