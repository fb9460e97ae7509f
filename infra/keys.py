"""The stack's customer-managed KMS key: rotation on, an alias, and a policy that lets only its services use it.

Who may use the key, and how:
- the account's administrators manage it, each action listed (no encrypt/decrypt, no grants through this statement);
- principals of this account encrypt and decrypt only through S3, FSx, ECR and EC2 (`kms:ViaService`), so the job
  role reads checkpoints through S3 but cannot call KMS directly; `kms:CreateGrant` only under that condition
  (AWS KMS developer guide, "kms:ViaService"), for services that hold a grant while they work (EBS, FSx);
- CloudWatch Logs, only for the stack's log groups (the `aws:logs:arn` encryption context);
- on EKS stacks, the control plane's cluster role, for Secrets' envelope encryption (eks_cluster_role_statement);
- the service-linked roles that act for us without IAM policies of ours: Auto Scaling and Batch (encrypted EBS root
  volumes of GPU nodes) and FSx's S3 access role (data repository associations with SSE-KMS buckets). They are
  matched by `aws:PrincipalArn` so the key can be created before those roles exist in a fresh account; their
  `kms:CreateGrant` only with `kms:GrantIsForAWSResource` (AWS KMS developer guide, "kms:GrantIsForAWSResource").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.config import StackConfig
from infra.iam import policy_document

CRYPTO_ACTIONS = ["kms:Decrypt", "kms:DescribeKey", "kms:Encrypt", "kms:GenerateDataKey*", "kms:ReEncrypt*"]
# Key administration, each action named (AWS KMS developer guide, "Default key policy" / "Allows key administrators
# to administer the KMS key"), without the guide's `kms:Create*`: it includes kms:CreateGrant, with which any
# principal of the account allowed by IAM could grant itself Decrypt. Grants are given only through services below.
ADMIN_ACTIONS = [
    "kms:CancelKeyDeletion",
    "kms:CreateAlias",
    "kms:DeleteAlias",
    "kms:DescribeKey",
    "kms:DisableKey",
    "kms:DisableKeyRotation",
    "kms:EnableKey",
    "kms:EnableKeyRotation",
    "kms:GetKeyPolicy",
    "kms:GetKeyRotationStatus",
    "kms:ListGrants",
    "kms:ListKeyPolicies",
    "kms:ListKeyRotations",
    "kms:ListResourceTags",
    "kms:PutKeyPolicy",
    "kms:RevokeGrant",
    "kms:RotateKeyOnDemand",
    "kms:ScheduleKeyDeletion",
    "kms:TagResource",
    "kms:UntagResource",
    "kms:UpdateAlias",
    "kms:UpdateKeyDescription",
]
# Services that encrypt the stack's data with the key on a caller's behalf.
VIA_SERVICES = ("s3", "fsx", "ecr", "ec2")
# EKS stacks: the principal that creates the cluster lets EKS create the key grant the control plane uses (EKS user
# guide, "Encrypt Kubernetes secrets with KMS on existing clusters"), a call EKS makes on its behalf (kms:ViaService
# eks.<region>).
EKS_VIA_SERVICES = ("eks",)
# The control plane's own calls are its cluster role's session (CloudTrail shows them "invokedBy":
# "eks.amazonaws.com" under the role: terraform-aws-modules/terraform-aws-eks issue 1913), not calls for a caller, so
# whether they carry kms:ViaService is not documented (the KMS developer guide's ViaService table does not list EKS).
# The key policy therefore names the role itself, with the actions terraform-aws-eks v19 gives it (main.tf,
# aws_iam_policy.cluster_encryption); no kms:ViaService condition, and no kms:CreateGrant (the creator's grant goes
# through EKS, above; a grant without kms:ViaService would break the policy pack's kms-create-grant rule).
EKS_CLUSTER_ROLE_KEY_ACTIONS = ("kms:Encrypt", "kms:Decrypt", "kms:DescribeKey", "kms:ListGrants")
# The inference pool (infra/serving.py): SageMaker encrypts the endpoint's ML storage volumes with the key named in
# the endpoint configuration (SageMaker API reference, CreateEndpointConfig KmsKeyId).
SERVING_VIA_SERVICES = ("sagemaker",)
SERVICE_LINKED_ROLES = (
    "aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling",
    "aws-service-role/batch.amazonaws.com/AWSServiceRoleForBatch",
    "aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/AWSServiceRoleForFSxS3Access_*",
)


# Services that publish to the topic; with an encrypted topic each needs kms:GenerateDataKey* and kms:Decrypt on
# its key (SNS Developer Guide, "Enable compatibility between event sources from AWS services and encrypted topics").
# Budgets too (Cost Management User Guide, "Creating an Amazon SNS topic for budget notifications"; infra/budget.py).
TOPIC_PUBLISHERS = ("cloudwatch.amazonaws.com", "events.amazonaws.com", "budgets.amazonaws.com")


def eks_cluster_role_statement(cfg: StackConfig, account: pulumi.Input[str]) -> dict[str, Any]:
    """The EKS control plane's role encrypts and decrypts Secrets with the key (EKS_CLUSTER_ROLE_KEY_ACTIONS). Matched
    by `aws:PrincipalArn` (a role session's is the role's ARN: IAM User Guide, "AWS global condition context keys")
    on exactly Pulumi's name for it, `<eks_cluster_role>-` and 7 characters (`?` is one character: IAM User Guide,
    "IAM JSON policy elements: Condition operators", ARN condition operators), as the
    key exists before the role. A role of exactly that form made by whoever may create roles would match too (such a
    principal can already give a role of its own any identity policy); docs/eks.md says so."""
    role = pulumi.Output.concat("arn:aws:iam::", account, ":role/", cfg.eks_cluster_role, "-???????")
    return {
        "Sid": "EksClusterRoleEncryptsSecrets",
        "Effect": "Allow",
        "Principal": {"AWS": "*"},
        "Action": list(EKS_CLUSTER_ROLE_KEY_ACTIONS),
        "Resource": "*",
        "Condition": {
            "StringEquals": {"aws:PrincipalAccount": account},
            "ArnLike": {"aws:PrincipalArn": role},
        },
    }


def topic_key_statement() -> dict[str, Any]:
    """The key-policy statement this key policy adds: alarms and EventBridge may encrypt messages for the topic.

    No aws:SourceArn condition: EventBridge's KMS requests carry none (EventBridge User Guide, encrypted SNS
    targets), and one would drop every failed-job message without an error."""
    return {
        "Sid": "AlarmsAndEventsPublishToEncryptedTopic",
        "Effect": "Allow",
        "Principal": {"Service": list(TOPIC_PUBLISHERS)},
        "Action": ["kms:Decrypt", "kms:GenerateDataKey*"],
        "Resource": "*",
    }


def cloudtrail_key_statements(cfg: StackConfig, account: pulumi.Input[str]) -> list[dict[str, Any]]:
    """The three elements CloudTrail User Guide, "Configure AWS KMS key policies for CloudTrail" requires for a
    trail, each only for this trail (its aws:SourceArn, the guide's best practice): encrypt the log and digest files
    (with the kms:EncryptionContext:aws:cloudtrail:arn condition), decrypt, and describe the key. The decrypt is
    CloudTrail's own ("Granting decrypt permissions": with an S3 Bucket Key on the log bucket, as infra/audit.py
    sets, kms:Decrypt is required to create or update a trail with SSE-KMS); people read the logs through S3
    (UseThroughStackServices). policy/audit.py `cloudtrail-key-policy` checks all three."""
    trail = pulumi.Output.concat(
        "arn:aws:cloudtrail:", cfg.region, ":", account, ":trail/", cfg.audit_trail_name
    )
    return [
        {
            "Sid": "CloudTrailEncryptsStackTrail",
            "Effect": "Allow",
            "Principal": {"Service": "cloudtrail.amazonaws.com"},
            "Action": "kms:GenerateDataKey*",
            "Resource": "*",
            "Condition": {
                "StringEquals": {"aws:SourceArn": trail},
                "StringLike": {
                    "kms:EncryptionContext:aws:cloudtrail:arn": pulumi.Output.concat(
                        "arn:aws:cloudtrail:*:", account, ":trail/*"
                    )
                },
            },
        },
        {
            "Sid": "CloudTrailDecryptsForBucketKey",
            "Effect": "Allow",
            "Principal": {"Service": "cloudtrail.amazonaws.com"},
            "Action": "kms:Decrypt",
            "Resource": "*",
            "Condition": {"StringEquals": {"aws:SourceArn": trail}},
        },
        {
            "Sid": "CloudTrailDescribesKey",
            "Effect": "Allow",
            "Principal": {"Service": "cloudtrail.amazonaws.com"},
            "Action": "kms:DescribeKey",
            "Resource": "*",
            "Condition": {"StringEquals": {"aws:SourceArn": trail}},
        },
    ]


def config_key_statement(account: pulumi.Input[str]) -> dict[str, Any]:
    """AWS Config writes its snapshots to its SSE-KMS bucket (infra/audit.py; AWS Config Developer Guide, "Permissions for
    the KMS Key": the config.amazonaws.com principal with aws:SourceAccount)."""
    return {
        "Sid": "ConfigDeliversToItsBucket",
        "Effect": "Allow",
        "Principal": {"Service": "config.amazonaws.com"},
        "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
        "Resource": "*",
        "Condition": {"StringEquals": {"aws:SourceAccount": account}},
    }


@dataclass
class KeysArgs:
    config: StackConfig
    account_id: pulumi.Input[str]


class Keys(pulumi.ComponentResource):
    """One customer-managed key per stack; every bucket, log group, volume, repository and FSx uses it."""

    def __init__(self, name: str, args: KeysArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainstack:keys:Keys", name, None, opts)
        cfg, account = args.config, args.account_id

        self.key = aws.kms.Key(
            f"{cfg.name_prefix}-key",
            description=f"trainstack {cfg.stack}: datasets, checkpoints, file system, images, volumes, logs",
            enable_key_rotation=True,
            deletion_window_in_days=30,
            policy=self._policy(cfg, account),
            # Kept with protectData, and so as long as compliance-locked audit logs need it (infra/config.py refuses
            # COMPLIANCE without protectData; policy/audit.py `locked-logs-kept`).
            opts=pulumi.ResourceOptions(
                parent=self, protect=cfg.protect_data, retain_on_delete=cfg.protect_data
            ),
        )
        self.alias = aws.kms.Alias(
            f"{cfg.name_prefix}-key",
            name=f"alias/{cfg.name_prefix}",
            target_key_id=self.key.key_id,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"key_arn": self.key.arn, "alias": self.alias.name})

    @staticmethod
    def _policy(cfg: StackConfig, account: pulumi.Input[str]) -> pulumi.Output[str]:
        root = {"AWS": pulumi.Output.concat("arn:aws:iam::", account, ":root")}
        log_groups = pulumi.Output.concat(
            "arn:aws:logs:", cfg.region, ":", account, ":log-group:", cfg.log_group_prefix, "/*"
        )
        services = (*VIA_SERVICES, *EKS_VIA_SERVICES) if cfg.orchestrator == "eks" else VIA_SERVICES
        services = (*services, *SERVING_VIA_SERVICES) if cfg.serving is not None else services
        via_services = [f"{service}.{cfg.region}.amazonaws.com" for service in services]
        if (
            cfg.orchestrator == "eks"
        ):  # Container Insights' and the control plane's groups, created under the key
            container_insights = pulumi.Output.concat(
                "arn:aws:logs:",
                cfg.region,
                ":",
                account,
                ":log-group:/aws/containerinsights/",
                cfg.eks_cluster_name,
                "/*",
            )
            control_plane = pulumi.Output.concat(
                "arn:aws:logs:", cfg.region, ":", account, ":log-group:", cfg.eks_log_group
            )
            logs_scope: Any = [log_groups, container_insights, control_plane]
        else:
            logs_scope = log_groups
        if cfg.serving is not None:  # the endpoint's log group (infra/serving.py), outside the stack's prefix
            serving_logs = pulumi.Output.concat(
                "arn:aws:logs:", cfg.region, ":", account, ":log-group:", cfg.serving_log_group
            )
            logs_scope = [*(logs_scope if isinstance(logs_scope, list) else [logs_scope]), serving_logs]
        linked_roles = {
            "StringEquals": {"aws:PrincipalAccount": account},
            "ArnLike": {
                "aws:PrincipalArn": [
                    pulumi.Output.concat("arn:aws:iam::", account, ":role/", role)
                    for role in SERVICE_LINKED_ROLES
                ]
            },
        }
        return policy_document(
            {
                "Sid": "KeyAdministration",
                "Effect": "Allow",
                "Principal": root,
                "Action": ADMIN_ACTIONS,
                "Resource": "*",
            },
            {
                "Sid": "UseThroughStackServices",
                "Effect": "Allow",
                "Principal": root,
                "Action": [*CRYPTO_ACTIONS, "kms:CreateGrant"],
                "Resource": "*",
                "Condition": {"StringEquals": {"kms:CallerAccount": account, "kms:ViaService": via_services}},
            },
            {
                "Sid": "CloudWatchLogsForStackLogGroups",
                "Effect": "Allow",
                "Principal": {"Service": f"logs.{cfg.region}.amazonaws.com"},
                "Action": CRYPTO_ACTIONS,
                "Resource": "*",
                "Condition": {"ArnLike": {"kms:EncryptionContext:aws:logs:arn": logs_scope}},
            },
            {
                "Sid": "ServiceLinkedRolesUseKey",
                "Effect": "Allow",
                "Principal": {"AWS": "*"},
                "Action": CRYPTO_ACTIONS,
                "Resource": "*",
                "Condition": linked_roles,
            },
            {
                "Sid": "ServiceLinkedRolesGrantForAwsResources",
                "Effect": "Allow",
                "Principal": {"AWS": "*"},
                "Action": "kms:CreateGrant",
                "Resource": "*",
                "Condition": {**linked_roles, "Bool": {"kms:GrantIsForAWSResource": "true"}},
            },
            *([eks_cluster_role_statement(cfg, account)] if cfg.orchestrator == "eks" else []),
            topic_key_statement(),  # the alarm topic (infra/monitoring.py)
            # The audit trail (infra/audit.py), unless the organisation's trail records this account.
            *(cloudtrail_key_statements(cfg, account) if cfg.organization_trail is None else []),
            *([config_key_statement(account)] if cfg.security_hub else []),  # trainstack:securityHub
        )
