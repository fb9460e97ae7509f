"""What an EKS stack puts in its cluster (infra/cluster_software.py): every object it sends passes the offline validator
(infra/k8s_validate.py), the releases are the pinned charts with their required values, the queue holds whole nodes."""

from __future__ import annotations

from typing import Any

import pytest

from infra.cluster_software import (
    EFA_RESOURCE,
    FSX_CLAIM,
    GPU_RESOURCE,
    NAMESPACE,
    chart_values,
    node_quota,
    values_as_pod,
)
from infra.eks import GPU_NODE_LABELS
from infra.k8s_validate import K8sValidationError, validate
from infra.k8s_versions import EFA_DEVICE_PLUGIN, HELM_CHARTS, KUEUE_API_VERSION, NVIDIA_DEVICE_PLUGIN
from infra.mocks import PlannedResource


def kubernetes_objects(stack) -> list[PlannedResource]:
    """Every Kubernetes object the stack creates (not the Helm releases, which are charts, nor the provider)."""
    return [
        r
        for r in stack.plan.resources
        if r.type.startswith("kubernetes:") and not r.type.startswith("kubernetes:helm.sh/")
    ]


def as_object(resource: PlannedResource) -> dict[str, Any]:
    """The object as the provider sends it: the recorded inputs (the mocks keep numbers as floats, as the engine)."""
    return {
        key: resource.inputs[key]
        for key in ("apiVersion", "kind", "metadata", "spec")
        if key in resource.inputs
    }


def test_the_stack_creates_the_namespace_volume_claim_and_queue_objects(eks_stack):
    kinds = sorted(as_object(r)["kind"] for r in kubernetes_objects(eks_stack))
    assert kinds == [
        "ClusterQueue",
        "LocalQueue",
        "Namespace",
        "PersistentVolume",
        "PersistentVolumeClaim",
        "ResourceFlavor",
    ]


def test_every_kubernetes_object_the_stack_creates_passes_offline_validation(eks_stack):
    for resource in kubernetes_objects(eks_stack):
        validate(as_object(resource))


def test_the_plugins_scheduling_values_are_valid_pod_fields():
    for chart in (NVIDIA_DEVICE_PLUGIN, EFA_DEVICE_PLUGIN):
        validate(values_as_pod(chart))


def test_a_misspelt_value_in_a_plugins_affinity_would_be_caught():
    pod = values_as_pod(NVIDIA_DEVICE_PLUGIN)
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringScheduling"] = {}
    with pytest.raises(K8sValidationError, match=r"spec\.affinity\.nodeAffinity"):
        validate(pod)


def test_releases_are_the_pinned_charts(eks_stack):
    releases = {
        r.name: r.inputs for r in eks_stack.plan.resources if r.type == "kubernetes:helm.sh/v3:Release"
    }
    assert set(releases) == {c.release for c in HELM_CHARTS}
    for chart in HELM_CHARTS:
        release = releases[chart.release]
        assert (release["chart"], release["version"], release["namespace"]) == (
            chart.chart,
            chart.version,
            chart.namespace,
        )
        assert release.get("repositoryOpts", {}).get("repo") == chart.repository
        assert release["values"] == chart_values(chart)


def test_device_plugins_run_on_the_gpu_nodes_only(eks_stack):
    (nodes,) = [r for r in eks_stack.all("eks.NodeGroup") if r.name.endswith("-eks-gpu")]
    labels = nodes.inputs["labels"]
    assert chart_values(EFA_DEVICE_PLUGIN)["nodeSelector"] == labels == GPU_NODE_LABELS
    (term,) = chart_values(NVIDIA_DEVICE_PLUGIN)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert {e["key"]: e["values"] for e in term["matchExpressions"]} == {k: [v] for k, v in labels.items()}


def test_the_volume_is_the_stacks_file_system_and_the_claim_binds_it(eks_stack):
    objects = {as_object(r)["kind"]: as_object(r) for r in kubernetes_objects(eks_stack)}
    fsx = eks_stack.one("fsx.LustreFileSystem")
    csi = objects["PersistentVolume"]["spec"]["csi"]
    assert (csi["driver"], csi["volumeHandle"]) == ("fsx.csi.aws.com", fsx.id)
    assert csi["volumeAttributes"] == {
        "dnsname": fsx.outputs["dnsName"],
        "mountname": fsx.outputs["mountName"],
    }
    assert objects["PersistentVolume"]["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    claim = objects["PersistentVolumeClaim"]
    assert (claim["metadata"]["name"], claim["metadata"]["namespace"]) == (FSX_CLAIM, NAMESPACE)
    assert claim["spec"]["volumeName"] == objects["PersistentVolume"]["metadata"]["name"]
    assert eks_stack.plan.outputs["fsx_claim"] == FSX_CLAIM


def test_the_cluster_queue_holds_whole_nodes_of_gpus_and_efa_devices(eks_stack):
    objects = {as_object(r)["kind"]: as_object(r) for r in kubernetes_objects(eks_stack)}
    queue = objects["ClusterQueue"]
    assert queue["apiVersion"] == KUEUE_API_VERSION
    (group,) = queue["spec"]["resourceGroups"]
    (flavor,) = group["flavors"]
    held = {r["name"]: r["nominalQuota"] for r in flavor["resources"]}
    nodes, instance = eks_stack.config.node_count, eks_stack.config.instance
    assert held[GPU_RESOURCE] == nodes * instance.gpus
    assert held[EFA_RESOURCE] == nodes * eks_stack.plan.outputs["efa_devices_per_node"] == nodes * 32
    assert set(group["coveredResources"]) == set(held) == set(node_quota(eks_stack.config))
    assert flavor["name"] == objects["ResourceFlavor"]["metadata"]["name"]
    assert objects["LocalQueue"]["spec"]["clusterQueue"] == queue["metadata"]["name"]
    assert objects["LocalQueue"]["metadata"]["name"] == eks_stack.plan.outputs["kueue_local_queue"]
