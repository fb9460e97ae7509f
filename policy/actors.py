"""The actors of a stack and what each must and must not do, read from the planned policies (policy/access.py decides).

`StackPolicies` reads the offline preview's documents once: role inline policies, the stack's managed policies
attached to roles, the key policy, bucket and topic policies, role trust policies. Each `*_needs` function lists one
actor's calls, each with the document that says the actor makes it (`Need.source`), and the calls a team must never be
able to make (`Need.allowed` False). `NEEDS` is every list the access check reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.config import StackConfig
from infra.mocks import ACCOUNT_ID, PlannedResource
from infra.preview import Plan
from policy.iam_evaluation import Policy, Principal
from trainer.contract.container import runnable_definition_name
from trainer.contract.teams import TEAM_TAG, team_prefix

# Pulumi's auto-names end in a random suffix of 7 hex characters; the access check stands one in for it.
AUTONAME_SUFFIX = "-0a1b2c3"
KMS_SOURCE = "KMS developer guide, Determining access to an AWS KMS key"
KARPENTER_SOURCE = (
    'Karpenter troubleshooting v1.14, "Node terminates before ready on failed encrypted EBS volume"'
)
EKS_SECRETS_SOURCE = (
    'EKS user guide, "Encrypt Kubernetes secrets with KMS on existing clusters"; terraform-aws-modules/terraform-aws-eks '
    "v19 main.tf cluster_encryption and issue 1913 (the role's own calls, invokedBy eks.amazonaws.com)"
)
CLOUDTRAIL_SOURCE = 'CloudTrail User Guide, "Configure AWS KMS key policies for CloudTrail"'
CLOUDTRAIL_LOGS_SOURCE = 'CloudTrail User Guide, "Sending events to CloudWatch Logs"'
CLOUDTRAIL_S3_SOURCE = 'CloudTrail User Guide, "Amazon S3 bucket policy for CloudTrail"'
CONFIG_SOURCE = (
    'AWS Config Developer Guide, "Permissions for the Amazon S3 Bucket for the AWS Config Delivery Channel"'
)
LOGS_SOURCE = 'CloudWatch Logs User Guide, "Encrypt log data in CloudWatch Logs using AWS KMS"'
SNS_SOURCE = 'SNS Developer Guide, "Encrypted topics: compatibility with event sources from AWS services"'
S3_KMS_SOURCE = 'S3 User Guide, "Using server-side encryption with AWS KMS keys (SSE-KMS)": permissions'
BATCH_SOURCE = 'Batch User Guide, "Resource: Restrict to POSIX user, Docker image, privilege level, and role"'
TEAMS_SOURCE = "docs/security.md#teams (infra/teams.py)"


@dataclass(frozen=True)
class Need:
    """One call an actor makes: `allowed` True when it must succeed, False when it must be refused."""

    actor: str
    action: str
    resource: str
    source: str
    context: Mapping[str, str | Sequence[str]] = field(default_factory=dict)
    allowed: bool = True


class StackPolicies:
    """The plan's principals and resource policies, looked up by what the needs name."""

    def __init__(self, plan: Plan, cfg: StackConfig) -> None:
        self.cfg, self.account, self.resources = cfg, ACCOUNT_ID, plan.resources
        self.region = cfg.region
        managed = {r.outputs.get("arn"): r for r in self.of_type("aws:iam/policy:Policy")}
        by_role: dict[str, list[Policy]] = {}
        for r in self.of_type("aws:iam/rolePolicy:RolePolicy"):
            by_role.setdefault(r.inputs["role"], []).append(Policy(f"{r.name} (inline)", r.inputs["policy"]))
        for r in self.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment"):
            if r.inputs["policyArn"] in managed:  # AWS-managed policies: their text is not in the plan
                policy = managed[r.inputs["policyArn"]]
                by_role.setdefault(r.inputs["role"], []).append(Policy(policy.name, policy.inputs["policy"]))
        self.roles: dict[str, Principal] = {}
        for r in self.of_type("aws:iam/role:Role"):
            policies = by_role.get(r.outputs.get("name", r.name), []) + by_role.get(r.id, [])
            tags = {k: str(v) for k, v in (r.inputs.get("tags") or {}).items()}
            self.roles[r.name] = Principal(r.outputs["arn"], self.account, tags=tags, policies=policies)
        self.trust = {
            r.name: Policy(f"{r.name} (trust)", r.inputs["assumeRolePolicy"])
            for r in self.of_type("aws:iam/role:Role")
        }
        self.keys = {
            r.outputs["arn"]: Policy(f"{r.name} (key policy)", r.inputs["policy"])
            for r in self.of_type("aws:kms/key:Key")
        }
        self.buckets = {
            r.inputs["bucket"]: Policy(f"{r.name} (bucket policy)", r.inputs["policy"])
            for r in self.of_type("aws:s3/bucketPolicy:BucketPolicy")
        }
        self.topics = {
            r.inputs["arn"]: Policy(f"{r.name} (topic policy)", r.inputs["policy"])
            for r in self.of_type("aws:sns/topicPolicy:TopicPolicy")
        }

    def of_type(self, type_: str) -> list[PlannedResource]:
        return [r for r in self.resources if r.type == type_]

    def role(self, suffix: str) -> tuple[str, Principal] | None:
        found = [(name, p) for name, p in self.roles.items() if name == f"{self.cfg.name_prefix}{suffix}"]
        return found[0] if found else None

    def service(self, name: str) -> Principal:
        return Principal(name, self.account, service=True)

    def resource_policy(self, resource: str) -> tuple[Policy | None, bool]:
        """The policy that governs `resource` and whether it is a key policy."""
        if resource in self.keys:
            return self.keys[resource], True
        if resource.startswith("arn:aws:s3:::"):
            return self.buckets.get(resource.removeprefix("arn:aws:s3:::").split("/")[0]), False
        if resource.startswith("arn:aws:iam::") and ":role/" in resource:
            name = next((n for n, p in self.roles.items() if p.arn == resource), None)
            return (self.trust.get(name) if name else None), False
        return self.topics.get(resource), False

    def batch_arn(self, kind: str, suffix: str, runnable: bool = False) -> str | None:
        """A Batch queue's or job definition's ARN as AWS names it: `<name>-<suffix>`, revision 1; `runnable`: the
        definition the verbs register revisions under (`<x>-run` for a template, trainer/contract/container.py)."""
        type_ = {
            "job-queue": "aws:batch/jobQueue:JobQueue",
            "job-definition": "aws:batch/jobDefinition:JobDefinition",
        }
        found = [r for r in self.of_type(type_[kind]) if r.name == f"{self.cfg.name_prefix}{suffix}"]
        if not found:
            return None
        physical = found[0].inputs.get("name") or found[0].name + AUTONAME_SUFFIX
        revision = ":1" if kind == "job-definition" else ""
        if kind == "job-definition" and runnable:
            physical = runnable_definition_name(physical)
        return f"arn:aws:batch:{self.region}:{self.account}:{kind}/{physical}{revision}"

    @property
    def stack_key(self) -> str:
        (key,) = [
            r.outputs["arn"]
            for r in self.of_type("aws:kms/key:Key")
            if r.name == f"{self.cfg.name_prefix}-key"
        ]
        return key


def via(stack: StackPolicies, service: str) -> dict[str, str]:
    """The keys KMS adds to a call a service makes for a principal of the account (KMS developer guide,
    "kms:ViaService", "kms:CallerAccount")."""
    return {"kms:ViaService": f"{service}.{stack.region}.amazonaws.com", "kms:CallerAccount": stack.account}


TLS = {"aws:SecureTransport": "true"}


def karpenter_needs(stack: StackPolicies) -> list[Need]:
    """The controller launches GPU nodes with CreateFleet (type instant); EBS uses the stack key for the root
    volume with the controller's credentials (infra/karpenter.py ROOT_VOLUME_KEY_ACTIONS)."""
    found = stack.role("-karpenter")
    if found is None:
        return []
    actor, key = found[0], stack.stack_key
    needs = [
        Need(actor, action, key, KARPENTER_SOURCE, via(stack, "ec2"))
        for action in (
            "kms:DescribeKey",
            "kms:Decrypt",
            "kms:GenerateDataKeyWithoutPlaintext",
            "kms:ReEncryptFrom",
        )
    ]
    needs.append(
        Need(
            actor,
            "kms:CreateGrant",
            key,
            KARPENTER_SOURCE,
            {**via(stack, "ec2"), "kms:GrantIsForAWSResource": "true"},
        )
    )
    # Not outside EC2: the controller never decrypts with the key itself.
    needs.append(
        Need(actor, "kms:Decrypt", key, KMS_SOURCE, {"kms:CallerAccount": stack.account}, allowed=False)
    )
    return needs


def eks_cluster_needs(stack: StackPolicies) -> list[Need]:
    """The control plane encrypts and decrypts Secrets with the stack key as its cluster role, calling KMS itself:
    no kms:ViaService in the request (infra/keys.py EKS_CLUSTER_ROLE_KEY_ACTIONS), only the caller's account."""
    found = stack.role("-eks-cluster")
    if found is None:
        return []
    actor, key = found[0], stack.stack_key
    caller = {"kms:CallerAccount": stack.account}
    actions = ("kms:Encrypt", "kms:Decrypt", "kms:DescribeKey", "kms:ListGrants")
    return [Need(actor, action, key, EKS_SECRETS_SOURCE, caller) for action in actions]


def cloudtrail_needs(stack: StackPolicies) -> list[Need]:
    """The stack's own trail: its key (encrypt, decrypt for the bucket key, describe) and its bucket."""
    needs: list[Need] = []
    for trail in stack.of_type("aws:cloudtrail/trail:Trail"):
        arn, key, bucket = (
            trail.outputs["arn"],
            str(trail.inputs.get("kmsKeyId")),
            trail.inputs["s3BucketName"],
        )
        source = {"aws:SourceArn": arn, "aws:SourceAccount": stack.account}
        if key in stack.keys:
            context = {**source, "kms:EncryptionContext:aws:cloudtrail:arn": arn}
            needs += [
                Need("cloudtrail.amazonaws.com", "kms:GenerateDataKey", key, CLOUDTRAIL_SOURCE, context),
                Need("cloudtrail.amazonaws.com", "kms:Decrypt", key, CLOUDTRAIL_SOURCE, source),
                Need("cloudtrail.amazonaws.com", "kms:DescribeKey", key, CLOUDTRAIL_SOURCE, source),
            ]
        role = trail.inputs.get("cloudWatchLogsRoleArn")
        if role:  # CloudTrail assumes the delivery role (CloudTrail User Guide, "Sending events to CloudWatch Logs")
            needs.append(
                Need("cloudtrail.amazonaws.com", "sts:AssumeRole", role, CLOUDTRAIL_LOGS_SOURCE, source)
            )
            group = str(trail.inputs["cloudWatchLogsGroupArn"]).removesuffix(":*")
            delivery = next((name for name, p in stack.roles.items() if p.arn == role), role)
            stream = f"{group}:log-stream:{stack.account}_CloudTrail_{stack.region}"
            needs += [
                Need(delivery, action, stream, CLOUDTRAIL_LOGS_SOURCE)
                for action in ("logs:CreateLogStream", "logs:PutLogEvents")
            ]
        prefix = f"{trail.inputs['s3KeyPrefix']}/" if trail.inputs.get("s3KeyPrefix") else ""
        objects = f"arn:aws:s3:::{bucket}/{prefix}AWSLogs/{stack.account}/CloudTrail/log.json.gz"
        needs += [
            Need(
                "cloudtrail.amazonaws.com",
                "s3:GetBucketAcl",
                f"arn:aws:s3:::{bucket}",
                CLOUDTRAIL_S3_SOURCE,
                {**source, **TLS},
            ),
            Need(
                "cloudtrail.amazonaws.com",
                "s3:PutObject",
                objects,
                CLOUDTRAIL_S3_SOURCE,
                {**source, **TLS, "s3:x-amz-acl": "bucket-owner-full-control"},
            ),
        ]
    return needs


def config_needs(stack: StackPolicies) -> list[Need]:
    """AWS Config delivers snapshots to its channel's bucket under the stack key (AWS Config Developer Guide,
    "Permissions for the Amazon S3 Bucket for the AWS Config Delivery Channel", "Permissions for the KMS Key")."""
    needs: list[Need] = []
    buckets = {r.id: r for r in stack.of_type("aws:s3/bucket:Bucket")}
    for channel in stack.of_type("aws:cfg/deliveryChannel:DeliveryChannel"):
        bucket = buckets[channel.inputs["s3BucketName"]].outputs["bucket"]
        prefix = f"{channel.inputs['s3KeyPrefix']}/" if channel.inputs.get("s3KeyPrefix") else ""
        source = {"aws:SourceAccount": stack.account, **TLS}
        key = f"arn:aws:s3:::{bucket}/{prefix}AWSLogs/{stack.account}/Config/snapshot.json.gz"
        needs += [
            Need("config.amazonaws.com", "s3:GetBucketAcl", f"arn:aws:s3:::{bucket}", CONFIG_SOURCE, source),
            Need(
                "config.amazonaws.com",
                "s3:PutObject",
                key,
                CONFIG_SOURCE,
                {**source, "s3:x-amz-acl": "bucket-owner-full-control"},
            ),
        ]
        if channel.inputs.get("s3KmsKeyArn") in stack.keys:
            needs.append(
                Need(
                    "config.amazonaws.com",
                    "kms:GenerateDataKey",
                    channel.inputs["s3KmsKeyArn"],
                    CONFIG_SOURCE,
                    {"aws:SourceAccount": stack.account},
                )
            )
    return needs


def log_group_needs(stack: StackPolicies) -> list[Need]:
    """CloudWatch Logs encrypts each log group under the key with the group's ARN as encryption context."""
    principal = f"logs.{stack.region}.amazonaws.com"
    return [
        Need(
            principal,
            action,
            group.inputs["kmsKeyId"],
            LOGS_SOURCE,
            {"kms:EncryptionContext:aws:logs:arn": group.outputs["arn"]},
        )
        for group in stack.of_type("aws:cloudwatch/logGroup:LogGroup")
        if group.inputs.get("kmsKeyId") in stack.keys
        for action in ("kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey")
    ]


def alarm_topic_needs(stack: StackPolicies) -> list[Need]:
    """CloudWatch alarms publish to the encrypted topic: the topic policy and the key policy both allow it."""
    needs: list[Need] = []
    alarms = stack.of_type("aws:cloudwatch/metricAlarm:MetricAlarm")
    for topic in stack.of_type("aws:sns/topic:Topic"):
        arn = topic.outputs["arn"]
        for alarm in (a for a in alarms if arn in (a.inputs.get("alarmActions") or [])):
            name = alarm.inputs.get("name") or alarm.name + AUTONAME_SUFFIX
            alarm_arn = f"arn:aws:cloudwatch:{stack.region}:{stack.account}:alarm:{name}"
            source = {"aws:SourceArn": alarm_arn, "aws:SourceAccount": stack.account}
            needs.append(Need("cloudwatch.amazonaws.com", "sns:Publish", arn, SNS_SOURCE, source))
            if topic.inputs.get("kmsMasterKeyId") in stack.keys:
                key = topic.inputs["kmsMasterKeyId"]
                needs += [
                    Need("cloudwatch.amazonaws.com", action, key, SNS_SOURCE, source)
                    for action in ("kms:GenerateDataKey", "kms:Decrypt")
                ]
            break  # one alarm stands for all: they share the topic policy's statement
    return needs


def bucket_object(stack: StackPolicies, bucket: str, key: str) -> str:
    return f"arn:aws:s3:::{stack.cfg.name_prefix}-{bucket}/{key}"


def job_role_needs(stack: StackPolicies) -> list[Need]:
    """The training job reads datasets and writes checkpoints through S3, SSE-KMS under the stack key."""
    found = stack.role("-job")
    if found is None:
        return []
    actor = found[0]
    return [
        Need(actor, "s3:GetObject", bucket_object(stack, "datasets", "data/shard-0.bin"), S3_KMS_SOURCE, TLS),
        Need(
            actor,
            "s3:PutObject",
            bucket_object(stack, "checkpoints", "runs/r/iter_0000001/0.distcp"),
            S3_KMS_SOURCE,
            TLS,
        ),
        Need(actor, "kms:Decrypt", stack.stack_key, S3_KMS_SOURCE, via(stack, "s3")),
        Need(actor, "kms:GenerateDataKey", stack.stack_key, S3_KMS_SOURCE, via(stack, "s3")),
    ]


def register_context(container: Mapping[str, Any]) -> dict[str, str]:
    """The condition keys Batch evaluates for RegisterJobDefinition, from one container's properties (Service
    Authorization Reference, AWS Batch: batch:Image, batch:Privileged, batch:User, batch:LogDriver,
    batch:AWSLogsGroup; a key whose field the request leaves out is absent)."""
    log = container.get("logConfiguration") or {}
    found = {
        "batch:Image": container.get("image"),
        "batch:Privileged": None if "privileged" not in container else str(container["privileged"]).lower(),
        "batch:User": container.get("user"),
        "batch:LogDriver": log.get("logDriver"),
        "batch:AWSLogsGroup": (log.get("options") or {}).get("awslogs-group"),
    }
    return {key: value for key, value in found.items() if value is not None}


def planned_container(stack: StackPolicies, suffix: str) -> dict[str, Any] | None:
    """The first container of a planned job definition, as registered."""
    found = [
        r
        for r in stack.of_type("aws:batch/jobDefinition:JobDefinition")
        if r.name == f"{stack.cfg.name_prefix}{suffix}"
    ]
    if not found:
        return None
    if "nodeProperties" in found[0].inputs:
        return dict(json.loads(found[0].inputs["nodeProperties"])["nodeRangeProperties"][0]["container"])
    return dict(json.loads(found[0].inputs["containerProperties"]))


def team_needs(stack: StackPolicies) -> list[Need]:
    """Each team's workflow (tests/jobs/test_team_workflow.py runs it against moto), and what it must not reach."""
    teams = [t.name for t in stack.cfg.teams]
    needs: list[Need] = []
    repository = f"{stack.account}.dkr.ecr.{stack.region}.amazonaws.com/{stack.cfg.name_prefix}-trainer"
    queue = stack.batch_arn("job-queue", "-gpu")
    definition = stack.batch_arn("job-definition", "-train", runnable=True)  # where a team's revisions go
    job_role, instance_role = stack.role("-job"), stack.role("-instance")
    for team in teams:
        if stack.role(f"-team-{team}") is None:
            continue
        actor = f"{stack.cfg.name_prefix}-team-{team}"
        other = next((t for t in teams if t != team), "another-team")
        for bucket in ("datasets", "checkpoints"):
            for action in ("s3:GetObject", "s3:PutObject"):
                needs.append(
                    Need(
                        actor,
                        action,
                        bucket_object(stack, bucket, f"{team_prefix(team)}run/f"),
                        TEAMS_SOURCE,
                        TLS,
                    )
                )
                needs.append(
                    Need(
                        actor,
                        action,
                        bucket_object(stack, bucket, f"{team_prefix(other)}run/f"),
                        TEAMS_SOURCE,
                        TLS,
                        allowed=False,
                    )
                )
                needs.append(
                    Need(
                        actor,
                        action,
                        bucket_object(stack, bucket, "data/shared/f"),
                        TEAMS_SOURCE,
                        TLS,
                        allowed=False,
                    )
                )
        needs.append(Need(actor, "kms:Decrypt", stack.stack_key, S3_KMS_SOURCE, via(stack, "s3")))
        needs.append(
            Need(
                actor,
                "kms:Decrypt",
                stack.stack_key,
                KMS_SOURCE,
                {"kms:CallerAccount": stack.account},
                allowed=False,
            )
        )
        if queue is None or definition is None:
            continue  # an EKS stack: jobs are JobSets in the team's namespace (policy/rbac.py)
        share = {"batch:ShareIdentifier": team, f"aws:RequestTag/{TEAM_TAG}": team}
        for resource in (queue, definition):
            needs.append(Need(actor, "batch:SubmitJob", resource, TEAMS_SOURCE, share))
            needs.append(
                Need(
                    actor,
                    "batch:SubmitJob",
                    resource,
                    TEAMS_SOURCE,
                    {**share, "batch:ShareIdentifier": other},
                    allowed=False,
                )
            )
        tagged = f"arn:aws:batch:{stack.region}:{stack.account}:job/0123"
        needs.append(
            Need(actor, "batch:TerminateJob", tagged, TEAMS_SOURCE, {f"aws:ResourceTag/{TEAM_TAG}": team})
        )
        needs.append(
            Need(
                actor,
                "batch:TerminateJob",
                tagged,
                TEAMS_SOURCE,
                {f"aws:ResourceTag/{TEAM_TAG}": other},
                allowed=False,
            )
        )
        # A new image is a new revision of the shared definition (trainer/jobs/submit.py job_definition_for): the
        # stack's own container with the pushed image; anything else in it reaches every team that submits to it.
        container = planned_container(stack, "-train") or {}
        pushed = {**container, "image": f"{repository}:v2"}
        needs.append(
            Need(actor, "batch:RegisterJobDefinition", definition, BATCH_SOURCE, register_context(pushed))
        )
        for changed in (
            {**pushed, "privileged": True},
            {**pushed, "image": "public.ecr.aws/someone/else:latest"},
            {**pushed, "user": "root"},
            {**pushed, "logConfiguration": {"logDriver": "syslog"}},
        ):
            needs.append(
                Need(
                    actor,
                    "batch:RegisterJobDefinition",
                    definition,
                    BATCH_SOURCE,
                    register_context(changed),
                    allowed=False,
                )
            )
        if job_role is not None:
            needs.append(
                Need(
                    actor,
                    "iam:PassRole",
                    job_role[1].arn,
                    BATCH_SOURCE,
                    {"iam:PassedToService": "ecs-tasks.amazonaws.com"},
                )
            )
        if instance_role is not None:
            needs.append(Need(actor, "iam:PassRole", instance_role[1].arn, BATCH_SOURCE, allowed=False))
        if stack.role(f"-team-{other}") is not None:
            needs.append(
                Need(
                    actor,
                    "sts:AssumeRole",
                    stack.roles[f"{stack.cfg.name_prefix}-team-{other}"].arn,
                    TEAMS_SOURCE,
                    allowed=False,
                )
            )
    return needs


NEEDS = (
    karpenter_needs,
    eks_cluster_needs,
    cloudtrail_needs,
    config_needs,
    log_group_needs,
    alarm_topic_needs,
    job_role_needs,
    team_needs,
)
