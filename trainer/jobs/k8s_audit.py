"""The EKS control plane's audit log for `make audit` on an EKS stack: who created, changed or deleted what in the
cluster (JobSets, RBAC, queues), beside the trail's AWS events.

EKS writes the API server's audit events, one JSON `audit.k8s.io/v1` Event per log event, to the streams
`kube-apiserver-audit-*` of `/aws/eks/<cluster>/cluster` (EKS user guide, "Send control plane logs to CloudWatch
Logs"; the stack enables the `audit` type: infra/eks.py). An Event names the verb, the user, the object
(`objectRef`: apiGroup, resource, namespace, name), the response code and when it was received (Kubernetes docs,
"Auditing"; k8s.io/apiserver pkg/apis/audit/v1 types.go). Reads (get, list, watch) are left out, as the trail's are.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

STREAM_PREFIX = "kube-apiserver-audit"
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")


def log_group(cluster_name: str) -> str:
    return f"/aws/eks/{cluster_name}/cluster"


def records(logs: Any, cluster_name: str, since: datetime, until: datetime) -> Iterator[dict[str, Any]]:
    """Write events of the cluster's audit log between `since` and `until` (CloudWatch Logs FilterLogEvents)."""
    pages = logs.get_paginator("filter_log_events").paginate(
        logGroupName=log_group(cluster_name),
        logStreamNamePrefix=STREAM_PREFIX,
        startTime=int(since.timestamp() * 1000),
        endTime=int(until.timestamp() * 1000),
    )
    for page in pages:
        for event in page.get("events", []):
            # The prefix again here: the request's filter is the API's, this one the stream names it answers with.
            if not str(event.get("logStreamName", "")).startswith(STREAM_PREFIX):
                continue
            try:
                record = json.loads(event["message"])
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("verb") in WRITE_VERBS:
                yield record


def for_run(record: dict[str, Any], run: str) -> bool:
    """The run's JobSet: created, changed or deleted under its name."""
    ref = record.get("objectRef") or {}
    return ref.get("resource") == "jobsets" and ref.get("name") == run


def fields(record: dict[str, Any]) -> dict[str, str]:
    """An audit Event as `make audit` shows one: time, who, action, target, error."""
    ref = record.get("objectRef") or {}
    user = record.get("user") or {}
    # The IAM principal the authenticator mapped, where EKS records it (user.extra), else the Kubernetes user.
    arn = ((user.get("extra") or {}).get("arn") or [None])[0]
    group = f"{ref.get('apiGroup')}/" if ref.get("apiGroup") else ""
    where = f"{ref.get('namespace')}/" if ref.get("namespace") else ""
    code = int((record.get("responseStatus") or {}).get("code") or 0)
    return {
        "time": str(record.get("requestReceivedTimestamp") or record.get("stageTimestamp") or ""),
        "who": str(arn or user.get("username") or "unknown"),
        "action": f"k8s:{record.get('verb', '')}",
        "target": f"{group}{ref.get('resource', '')} {where}{ref.get('name', '')}".strip(),
        "error": str(code) if code >= 400 else "",
    }
