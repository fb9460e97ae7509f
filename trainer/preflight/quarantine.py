"""A node that fails its preflight takes itself out of service, so that the retry (Batch's, or a JobSet restart
on EKS) lands on fresh hosts.

The instance asks the instance metadata service (IMDSv2: PUT /latest/api/token, then GET /latest/meta-data/...) for
its id and region. A Batch managed compute environment runs its instances in Auto Scaling groups it creates (AWS
Batch User Guide, "Managed compute environments"); an instance in one is marked Unhealthy, which makes the group
terminate and replace it (EC2 Auto Scaling API SetInstanceHealth; ShouldRespectGracePeriod=False so that a fresh
instance is not spared). An instance outside any group is terminated. In a JobSet pod on EKS the node is left
through the API server instead (`quarantine_node`), as the pod's own service account: tainted, then deleted when
Karpenter made it.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.request
from pathlib import Path
from typing import Any

from trainer.aws.clients import client
from trainer.aws.imds import metadata
from trainer.contract.gpu_nodes import KARPENTER_NODEPOOL_LABEL, QUARANTINE_TAINT


def instance_identity(imds: str | None = None, timeout_s: float = 2.0) -> tuple[str, str]:
    """(instance id, region) of this instance, from IMDSv2; raises OSError where there is no IMDS."""
    instance_id, region = metadata("instance-id", "placement/region", endpoint=imds, timeout_s=timeout_s)
    return instance_id, region


def take_out_of_service(instance_id: str, region: str) -> str:
    """Mark the instance Unhealthy in its Auto Scaling group, or terminate it; says which was done."""
    autoscaling = client("autoscaling", region)
    found = autoscaling.describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
    if found:
        autoscaling.set_instance_health(
            InstanceId=instance_id, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False
        )
        return f"{instance_id} marked Unhealthy in Auto Scaling group {found[0]['AutoScalingGroupName']}"
    client("ec2", region).terminate_instances(InstanceIds=[instance_id])
    return f"{instance_id} terminated (in no Auto Scaling group)"


# What Kubernetes mounts in every pod with a service account token (Kubernetes docs, "Accessing the Kubernetes API
# from a Pod": the token, the cluster CA, KUBERNETES_SERVICE_HOST and _PORT).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def in_cluster_api() -> tuple[str, dict[str, str], ssl.SSLContext]:
    """The API server's base URL, the bearer header and a TLS context trusting the cluster's CA, from the pod."""
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    token = (SERVICE_ACCOUNT_DIR / "token").read_text().strip()
    context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT_DIR / "ca.crt"))
    return f"https://{host}:{port}", {"Authorization": f"Bearer {token}"}, context


def _call(base: str, headers: dict[str, str], context: ssl.SSLContext | None, method: str, path: str,
          body: dict[str, Any] | None = None, content_type: str = "application/json") -> dict[str, Any]:  # fmt: skip
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"{base}{path}", data=data, method=method, headers={**headers, "Content-Type": content_type}
    )
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        return json.loads(response.read() or b"{}")


def quarantine_node(
    node_name: str, api: tuple[str, dict[str, str], ssl.SSLContext | None] | None = None
) -> str:
    """Taint this pod's node so that nothing is scheduled there again, then, if Karpenter made it, delete the Node:
    Karpenter's finalizer cordons, drains and terminates the instance (Karpenter v1.14.1 concepts/disruption.md,
    "Manual Methods: Node Deletion"), which frees the NodePool's GPU limit for a replacement. A node of a managed
    node group (a Capacity Block) keeps its Node: deleting it would leave the instance running unregistered."""
    base, headers, context = api or in_cluster_api()
    path = f"/api/v1/nodes/{node_name}"
    node = _call(base, headers, context, "GET", path)
    taints = [t for t in node.get("spec", {}).get("taints") or [] if t.get("key") != QUARANTINE_TAINT["key"]]
    patch = {
        "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
        "spec": {"taints": [*taints, dict(QUARANTINE_TAINT)]},
    }
    _call(base, headers, context, "PATCH", path, patch, "application/merge-patch+json")
    if KARPENTER_NODEPOOL_LABEL not in node["metadata"].get("labels", {}):
        return (
            f"node {node_name} tainted {QUARANTINE_TAINT['key']} (not Karpenter's: left for node auto repair)"
        )
    _call(base, headers, context, "DELETE", path)
    return (
        f"node {node_name} tainted {QUARANTINE_TAINT['key']} and deleted (Karpenter terminates its instance)"
    )
