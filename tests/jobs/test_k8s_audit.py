"""`make audit` on an EKS stack: the control plane's audit log read from moto's CloudWatch Logs.

The events follow Kubernetes' audit Event (audit.k8s.io/v1: verb, user, objectRef, responseStatus,
requestReceivedTimestamp; Kubernetes docs, "Auditing"), in the stream prefix EKS writes them to
(`kube-apiserver-audit-*` of `/aws/eks/<cluster>/cluster`, EKS user guide "Send control plane logs to CloudWatch Logs").
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import boto3
from moto import mock_aws

from trainer.jobs import audit, k8s_audit

REGION = "us-east-1"
CLUSTER = "trainstack-eks-dev"
SINCE = datetime(2026, 12, 3, tzinfo=UTC)
NOW = datetime(2026, 12, 4, 12, tzinfo=UTC)
ANA = "arn:aws:sts::111122223333:assumed-role/trainstack-eks-dev-team-vision/ana"


def event(verb: str, name: str, code: int, user: str = ANA, resource: str = "jobsets") -> dict:
    return {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "stage": "ResponseComplete",
        "verb": verb,
        "user": {"username": f"arn:aws:sts::111122223333:assumed-role/x/{name}", "extra": {"arn": [user]}},
        "objectRef": {
            "resource": resource,
            "namespace": "team-vision",
            "name": name,
            "apiGroup": "jobset.x-k8s.io",
        },
        "responseStatus": {"code": code},
        "requestReceivedTimestamp": "2026-12-04T10:00:00.000000Z",
    }


@mock_aws
def test_writes_in_the_cluster_are_listed_with_the_iam_principal_and_reads_are_not():
    logs = boto3.client("logs", region_name=REGION)
    group = k8s_audit.log_group(CLUSTER)
    logs.create_log_group(logGroupName=group)
    for stream in ("kube-apiserver-audit-1a2b", "authenticator-1a2b"):
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
    stamp = int(datetime(2026, 12, 4, 10, tzinfo=UTC).timestamp() * 1000)
    audit_events = [
        event("create", "run1", 201),
        event("get", "run1", 200),
        event("delete", "run2", 403),
        event("create", "other", 201, resource="rolebindings"),
    ]
    logs.put_log_events(
        logGroupName=group,
        logStreamName="kube-apiserver-audit-1a2b",
        logEvents=[{"timestamp": stamp + i, "message": json.dumps(e)} for i, e in enumerate(audit_events)],
    )
    logs.put_log_events(
        logGroupName=group,
        logStreamName="authenticator-1a2b",
        logEvents=[{"timestamp": stamp, "message": json.dumps(event("create", "not-audit", 201))}],
    )
    found = audit.cluster_events(logs, CLUSTER, SINCE, NOW)
    assert [(e.action, e.target, e.error, e.kind) for e in found] == [
        ("k8s:create", "jobset.x-k8s.io/jobsets team-vision/run1", "", "kubernetes"),
        ("k8s:delete", "jobset.x-k8s.io/jobsets team-vision/run2", "403", "kubernetes"),
        ("k8s:create", "jobset.x-k8s.io/rolebindings team-vision/other", "", "kubernetes"),
    ]
    assert found[0].who == ANA
    assert [e.target for e in audit.cluster_events(logs, CLUSTER, SINCE, NOW, run="run1")] == [
        "jobset.x-k8s.io/jobsets team-vision/run1"
    ]
