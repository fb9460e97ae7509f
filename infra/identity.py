"""IAM for the GPU cluster: the instance role and profile, the Batch job role and the execution role.

Least privilege: every statement names its resources (buckets, the stack key, the repository, the stack's log
groups, the stack's Batch-made ECS clusters). Only the actions in `WILDCARD_RESOURCE_ACTIONS`, which AWS does not
let a policy scope to a resource, appear with `"Resource": "*"`; no statement has a `"*"` action.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_aws as aws

from infra.config import StackConfig
from infra.iam import (
    ECR_PULL_ACTIONS,
    LOG_WRITE_ACTIONS,
    QUARANTINE_ACTIONS,
    WILDCARD_RESOURCE_ACTIONS,
    allow,
    policy_document,
    service_trust_policy,
)

if TYPE_CHECKING:
    from infra.data_lake import DataLake
    from infra.keys import Keys
    from infra.registry import Registry


@dataclass
class IdentityArgs:
    config: StackConfig
    account_id: pulumi.Input[str]
    keys: Keys
    lake: DataLake
    registry: Registry


class Identity(pulumi.ComponentResource):
    """Instance role + profile (ECS agent, image pulls, SSM sessions), job role (data + key), execution role."""

    def __init__(self, name: str, args: IdentityArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainstack:identity:Identity", name, None, opts)
        cfg = args.config
        prefix, region, account = cfg.name_prefix, cfg.region, args.account_id
        logs = pulumi.Output.concat(
            "arn:aws:logs:", region, ":", account, ":log-group:", cfg.log_group_prefix, "/*"
        )
        ecs = pulumi.Output.concat("arn:aws:ecs:", region, ":", account)
        datasets, checkpoints = args.lake.datasets.arn, args.lake.checkpoints.arn
        repository = args.registry.repository.arn

        self.instance_role = self._role(
            f"{prefix}-instance",
            service_trust_policy("ec2.amazonaws.com"),
            "GPU nodes: ECS agent, image pulls, SSM sessions",
            allow("AwsRequiresWildcardResource", list(WILDCARD_RESOURCE_ACTIONS), ["*"]),
            allow(
                "EcsAgentOnStackClusters",
                [
                    "ecs:DeregisterContainerInstance",
                    "ecs:Poll",
                    "ecs:RegisterContainerInstance",
                    "ecs:StartTelemetrySession",
                    "ecs:SubmitAttachmentStateChanges",
                    "ecs:SubmitContainerStateChange",
                    "ecs:SubmitTaskStateChange",
                    "ecs:UpdateContainerInstancesState",
                ],
                # Batch names the ECS cluster after the compute environment: <ce name>_Batch_<uuid>.
                [
                    pulumi.Output.concat(ecs, ":cluster/", prefix, "-*"),
                    pulumi.Output.concat(ecs, ":container-instance/", prefix, "-*"),
                ],
            ),
            allow("PullTrainerImage", ECR_PULL_ACTIONS, [repository]),
            allow("WriteStackLogs", LOG_WRITE_ACTIONS, [logs]),
            allow(
                "SsmSessions",
                ["ssm:UpdateInstanceInformation"],
                [pulumi.Output.concat("arn:aws:ec2:", region, ":", account, ":instance/*")],
            ),
        )
        self.instance_profile = aws.iam.InstanceProfile(
            f"{prefix}-instance", role=self.instance_role.name, opts=pulumi.ResourceOptions(parent=self)
        )
        self.job_role = self._role(
            f"{prefix}-job",
            service_trust_policy("ecs-tasks.amazonaws.com", account),
            "Training containers: read datasets, read/write checkpoints",
            allow("ListBuckets", ["s3:ListBucket"], [datasets, checkpoints]),
            allow("ReadDatasets", ["s3:GetObject"], [pulumi.Output.concat(datasets, "/*")]),
            allow(
                "ReadWriteCheckpoints",
                ["s3:AbortMultipartUpload", "s3:DeleteObject", "s3:GetObject", "s3:PutObject"],
                [pulumi.Output.concat(checkpoints, "/*")],
            ),
            allow(
                "UseStackKey", ["kms:Decrypt", "kms:DescribeKey", "kms:GenerateDataKey"], [args.keys.key.arn]
            ),
            allow("FindOwnAutoScalingGroup", ["autoscaling:DescribeAutoScalingInstances"], ["*"]),
            # Only this stack's instances: the launch template and the compute environment tag every node with
            # the stack's tags (aws:ResourceTag works for both actions: Service Authorization Reference).
            allow(
                "QuarantineOwnNode",
                QUARANTINE_ACTIONS,
                [
                    pulumi.Output.concat("arn:aws:ec2:", region, ":", account, ":instance/*"),
                    pulumi.Output.concat("arn:aws:autoscaling:", region, ":", account, ":autoScalingGroup:*"),
                ],
                Condition={"StringEquals": {"aws:ResourceTag/stack": cfg.stack}},
            ),
        )
        self.execution_role = self._role(
            f"{prefix}-execution",
            service_trust_policy("ecs-tasks.amazonaws.com", account),
            "ECS on behalf of training containers: image pulls and logs",
            allow("AwsRequiresWildcardResource", ["ecr:GetAuthorizationToken"], ["*"]),
            allow("PullTrainerImage", ECR_PULL_ACTIONS, [repository]),
            allow("WriteStackLogs", LOG_WRITE_ACTIONS, [logs]),
        )
        self.register_outputs(
            {
                "instance_profile_arn": self.instance_profile.arn,
                "job_role_arn": self.job_role.arn,
                "execution_role_arn": self.execution_role.arn,
            }
        )

    def _role(
        self, name: str, trust: pulumi.Output[str], description: str, *statements: dict[str, Any]
    ) -> aws.iam.Role:
        """A role with one inline policy: what it may do is read in one place, next to who may assume it."""
        role = aws.iam.Role(
            name, assume_role_policy=trust, description=description, opts=pulumi.ResourceOptions(parent=self)
        )
        aws.iam.RolePolicy(
            name, role=role.id, policy=policy_document(*statements), opts=pulumi.ResourceOptions(parent=self)
        )
        return role
