"""Karpenter's interruption queue: the EC2 and AWS Health events it acts on before a node is taken away.

Without a queue Karpenter misses more than Spot: scheduled maintenance (AWS Health), instance state changes, and
Capacity Reservation interruption warnings (Karpenter docs, concepts/disruption.md "Interruption"). Built exactly as
Karpenter's own CloudFormation at the pinned version (aws/karpenter-provider-aws v1.14.1,
website/content/en/docs/getting-started/getting-started-with-karpenter/cloudformation.yaml:
KarpenterInterruptionQueue, KarpenterInterruptionQueuePolicy, the five rules, InterruptionPolicy):

- an SQS queue named after the cluster, messages kept 300 s, SQS-managed encryption (with a customer key the
  EventBridge service would need that key's policy as well; the reference uses SSE-SQS);
- a queue policy letting `events.amazonaws.com` and `sqs.amazonaws.com` send, and denying any call without TLS;
- one EventBridge rule per event kind, each with the queue as its one target;
- the controller's permission to receive and delete from it, and the chart's `settings.interruptionQueue`
  (infra/karpenter.py `chart_values`).
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.config import StackConfig
from infra.iam import policy_text

MESSAGE_RETENTION_SECONDS = 300
TARGET_ID = "KarpenterInterruptionQueueTarget"
# Rule name -> (source, detail-type), as the reference's ScheduledChangeRule ... CapacityReservationInterruptionRule.
RULES: dict[str, tuple[str, str]] = {
    "scheduled-change": ("aws.health", "AWS Health Event"),
    "spot-interruption": ("aws.ec2", "EC2 Spot Instance Interruption Warning"),
    "rebalance": ("aws.ec2", "EC2 Instance Rebalance Recommendation"),
    "instance-state-change": ("aws.ec2", "EC2 Instance State-change Notification"),
    "capacity-reservation-interruption": (
        "aws.ec2",
        "EC2 Capacity Reservation Instance Interruption Warning",
    ),
}
# What the controller does with the queue (the reference's InterruptionPolicy, AllowInterruptionQueueActions).
CONTROLLER_ACTIONS = ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"]


def queue_name(cfg: StackConfig) -> str:
    """The reference names the queue after the cluster (QueueName: ${ClusterName})."""
    return cfg.eks_cluster_name


def event_pattern(rule: str) -> dict[str, list[str]]:
    source, detail_type = RULES[rule]
    return {"source": [source], "detail-type": [detail_type]}


def queue_policy_statements(queue_arn: str) -> list[dict[str, Any]]:
    """KarpenterInterruptionQueuePolicy (Id EC2InterruptionPolicy): the services send; nothing without TLS."""
    return [
        {
            "Effect": "Allow",
            "Principal": {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]},
            "Action": "sqs:SendMessage",
            "Resource": queue_arn,
        },
        {
            "Sid": "DenyHTTP",
            "Effect": "Deny",
            "Action": "sqs:*",
            "Resource": queue_arn,
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            "Principal": "*",
        },
    ]


def controller_statements(queue_arn: str) -> list[dict[str, Any]]:
    return [
        {
            "Sid": "AllowInterruptionQueueActions",
            "Effect": "Allow",
            "Resource": queue_arn,
            "Action": list(CONTROLLER_ACTIONS),
        }
    ]


def interruption_queue(
    cfg: StackConfig, controller: aws.iam.Role, parent: pulumi.Resource
) -> list[pulumi.Resource]:
    """The queue, its policy, the rules and their targets, and the controller's inline policy on the queue; the
    controller's Pod Identity association depends on the returned grants."""
    child = pulumi.ResourceOptions(parent=parent)
    prefix = cfg.name_prefix
    queue = aws.sqs.Queue(
        f"{prefix}-karpenter-interruption",
        name=queue_name(cfg),
        message_retention_seconds=MESSAGE_RETENTION_SECONDS,
        sqs_managed_sse_enabled=True,
        opts=child,
    )
    aws.sqs.QueuePolicy(
        f"{prefix}-karpenter-interruption",
        queue_url=queue.id,
        policy=queue.arn.apply(
            lambda arn: json.dumps(
                {
                    "Version": "2012-10-17",
                    "Id": "EC2InterruptionPolicy",
                    "Statement": queue_policy_statements(arn),
                }
            )
        ),
        opts=child,
    )
    for rule in RULES:
        event_rule = aws.cloudwatch.EventRule(
            f"{prefix}-karpenter-{rule}", event_pattern=json.dumps(event_pattern(rule)), opts=child
        )
        aws.cloudwatch.EventTarget(
            f"{prefix}-karpenter-{rule}", rule=event_rule.name, target_id=TARGET_ID, arn=queue.arn, opts=child
        )
    grant = aws.iam.RolePolicy(
        f"{prefix}-karpenter-interruption",
        role=controller.id,
        policy=queue.arn.apply(lambda arn: policy_text(*controller_statements(arn))),
        opts=child,
    )
    return [grant]
