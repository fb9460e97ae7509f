"""IAM policy documents: the statement helpers and the action lists every component that writes a policy uses
(identity's roles, the key policy, the bucket policies, flow logs). Only the actions in
`WILDCARD_RESOURCE_ACTIONS`, which AWS does not let a policy scope to a resource, appear with `"Resource": "*"`."""

from __future__ import annotations

import json
from typing import Any

import pulumi

BATCH_READ_ACTIONS = (
    "batch:DescribeJobDefinitions",
    "batch:DescribeJobQueues",
    "batch:DescribeJobs",
    "batch:ListJobs",
)
# The current IAM policy language version (IAM User Guide, "IAM JSON policy elements: Version").
POLICY_VERSION = "2012-10-17"
# Karpenter's controller (infra/karpenter.py): EC2 Describe actions and pricing:GetProducts name no resource type
# (Service Authorization Reference, "Actions, resources, and condition keys for Amazon EC2" / "for AWS Price List");
# iam:ListInstanceProfiles is what Karpenter's own policy grants unscoped (getting-started cloudformation.yaml v1.14.1,
# AllowUnscopedInstanceProfileListAction).
KARPENTER_DISCOVERY_ACTIONS = (
    "ec2:DescribeCapacityReservations",
    "ec2:DescribeImages",
    "ec2:DescribeInstances",
    "ec2:DescribeInstanceStatus",
    "ec2:DescribeInstanceTypeOfferings",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeLaunchTemplates",
    "ec2:DescribePlacementGroups",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeSpotPriceHistory",
    "ec2:DescribeSubnets",
)
KARPENTER_UNSCOPED_ACTIONS = ("pricing:GetProducts", "iam:ListInstanceProfiles")
# Actions without resource-level permissions: AWS accepts them only with "Resource": "*".
# An endpoint in a VPC looks up its network (SageMaker Developer Guide, "Give SageMaker AI Hosted Endpoints Access to
# Resources in Your Amazon VPC"); EC2's Describe actions name no resource type.
SAGEMAKER_VPC_DESCRIBE_ACTIONS = (
    "ec2:DescribeDhcpOptions",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeSubnets",
    "ec2:DescribeVpcs",
)
WILDCARD_RESOURCE_ACTIONS = (
    "ecr:GetAuthorizationToken",
    "ecs:DiscoverPollEndpoint",
    "ec2:DescribeTags",
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
    # Describe actions of EC2 Auto Scaling name no resource type (Service Authorization Reference, "Actions,
    # resources, and condition keys for Amazon EC2 Auto Scaling"); a failing node looks up its own group.
    "autoscaling:DescribeAutoScalingInstances",
    # Batch's Describe and List actions name no resource type (Service Authorization Reference, "Actions,
    # resources, and condition keys for AWS Batch"); team roles see the queue with them (infra/teams.py).
    *BATCH_READ_ACTIONS,
    *KARPENTER_DISCOVERY_ACTIONS,
    *KARPENTER_UNSCOPED_ACTIONS,
    *SAGEMAKER_VPC_DESCRIBE_ACTIONS,
)
# What a node that fails its preflight does to itself (trainer/preflight/quarantine.py): mark itself Unhealthy in the
# Auto Scaling group Batch runs it in, or terminate itself where it is in none.
QUARANTINE_ACTIONS = ["autoscaling:SetInstanceHealth", "ec2:TerminateInstances"]

ECR_PULL_ACTIONS = ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
LOG_WRITE_ACTIONS = ["logs:CreateLogStream", "logs:PutLogEvents"]


def policy_document(*statements: dict[str, Any]) -> pulumi.Output[str]:
    """An IAM policy JSON document; statements may hold Outputs (ARNs)."""
    return pulumi.Output.json_dumps({"Version": POLICY_VERSION, "Statement": list(statements)})


def policy_text(*statements: dict[str, Any]) -> str:
    """The same document from statements already resolved (inside an `apply`)."""
    return json.dumps({"Version": POLICY_VERSION, "Statement": list(statements)})


def allow(sid: str, actions: list[str], resources: list[Any], **extra: Any) -> dict[str, Any]:
    return {"Sid": sid, "Effect": "Allow", "Action": actions, "Resource": resources, **extra}


def service_trust_policy(service: str, account_id: pulumi.Input[str] | None = None) -> pulumi.Output[str]:
    """Trust for one AWS service principal; with an account, only on that account's behalf (confused deputy)."""
    statement: dict[str, Any] = {
        "Effect": "Allow",
        "Principal": {"Service": service},
        "Action": "sts:AssumeRole",
    }
    if account_id is not None:
        statement["Condition"] = {"StringEquals": {"aws:SourceAccount": account_id}}
    return policy_document(statement)
