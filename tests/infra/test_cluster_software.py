"""What an EKS stack puts in its cluster (infra/cluster_software.py): every object it sends passes the offline validator
(infra/k8s_validate.py), the releases are the pinned charts with their required values, the queue holds whole nodes."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from infra.cluster_software import (
    EFA_RESOURCE,
    FSX_CLAIM,
    GPU_RESOURCE,
    NAMESPACE,
    PODS_READY_TIMEOUT,
    chart_values,
    charts,
    kueue_config,
    node_quota,
    values_as_pod,
)
from infra.config import load_stack_config
from infra.eks import GPU_NODE_LABELS
from infra.k8s_validate import K8sValidationError, validate
from infra.k8s_versions import (
    EFA_DEVICE_PLUGIN,
    HELM_CHARTS,
    KARPENTER,
    KUEUE,
    KUEUE_API_VERSION,
    NVIDIA_DEVICE_PLUGIN,
)
from infra.mocks import PlannedResource
from trainer.contract.gpu_nodes import GPU_TOLERATION

NO_TEAMS = {"trainstack:teams": "[]"}  # config values as the CLI passes them: JSON text


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
        for key in ("apiVersion", "kind", "metadata", "spec", "rules", "roleRef", "subjects")
        if key in resource.inputs
    }


def test_the_stack_creates_the_namespace_volume_claim_queue_and_node_objects(variant):
    kinds = sorted(as_object(r)["kind"] for r in kubernetes_objects(variant("eks-dev", **NO_TEAMS)))
    assert kinds == [
        "ClusterQueue",
        "ClusterRole",  # these four: the quarantine of a failed node (infra/node_quarantine.py)
        "ClusterRoleBinding",
        "EC2NodeClass",
        "LocalQueue",
        "Namespace",
        "NodeOverlay",
        "NodePool",
        "PersistentVolume",
        "PersistentVolumeClaim",
        "ResourceFlavor",
        "ServiceAccount",  # `trainer`, which the stack's own jobs run as
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]


def test_every_kubernetes_object_the_stack_creates_passes_offline_validation(eks_stack):
    for resource in kubernetes_objects(eks_stack):
        validate(as_object(resource))


def test_the_plugins_scheduling_values_are_valid_pod_fields():
    for chart in (NVIDIA_DEVICE_PLUGIN, EFA_DEVICE_PLUGIN):
        validate(values_as_pod(chart, load_stack_config("eks-dev")))


def test_a_misspelt_value_in_a_plugins_affinity_would_be_caught():
    pod = values_as_pod(NVIDIA_DEVICE_PLUGIN, load_stack_config("eks-dev"))
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringScheduling"] = {}
    with pytest.raises(K8sValidationError, match=r"spec\.affinity\.nodeAffinity"):
        validate(pod)


def test_releases_are_the_pinned_charts(eks_stack):
    releases = {
        r.name: r.inputs for r in eks_stack.plan.resources if r.type == "kubernetes:helm.sh/v3:Release"
    }
    assert set(releases) == {c.release for c in charts(eks_stack.config)} == {c.release for c in HELM_CHARTS}
    for chart in HELM_CHARTS:
        release = releases[chart.release]
        assert (release["chart"], release["version"], release["namespace"]) == (
            chart.chart,
            chart.version,
            chart.namespace,
        )
        assert release.get("repositoryOpts", {}).get("repo") == chart.repository
        assert release["values"] == chart_values(chart, eks_stack.config)


def test_a_capacity_block_stack_installs_no_karpenter(variant):
    block = variant(
        "eks-dev",
        **{"trainstack:capacityReservationId": "cr-0123456789abcdef0", "trainstack:capacityBlock": True},
    )
    assert KARPENTER not in charts(block.config)
    assert not [r for r in block.plan.resources if r.type.startswith("kubernetes:karpenter")]


def test_device_plugins_run_on_the_gpu_nodes_only_and_tolerate_their_taint(eks_stack):
    (pool,) = [r for r in eks_stack.plan.resources if r.type.endswith(":NodePool")]
    labels = pool.inputs["spec"]["template"]["metadata"]["labels"]
    cfg = eks_stack.config
    assert chart_values(EFA_DEVICE_PLUGIN, cfg)["nodeSelector"] == labels == GPU_NODE_LABELS
    for chart in (EFA_DEVICE_PLUGIN, NVIDIA_DEVICE_PLUGIN):
        assert chart_values(chart, cfg)["tolerations"] == [GPU_TOLERATION]
    (term,) = chart_values(NVIDIA_DEVICE_PLUGIN, cfg)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert {e["key"]: e["values"] for e in term["matchExpressions"]} == {k: [v] for k, v in labels.items()}


def test_the_volume_is_the_stacks_file_system_and_the_claim_binds_it(variant):
    eks_stack = variant("eks-dev", **NO_TEAMS)
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


def test_kueue_evicts_a_job_whose_pods_are_not_all_ready_and_shares_fairly_with_teams(eks_stack, variant):
    values = chart_values(KUEUE, eks_stack.config)["managerConfig"]["controllerManagerConfigYaml"]
    config = yaml.safe_load(values)
    assert config == kueue_config(eks_stack.config)
    assert config["waitForPodsReady"]["timeout"] == PODS_READY_TIMEOUT
    assert config["waitForPodsReady"]["blockAdmission"] is True
    assert "jobset.x-k8s.io/jobset" in config["integrations"]["frameworks"]
    assert config["fairSharing"]["preemptionStrategies"][0] == "LessThanOrEqualToFinalShare"
    assert "fairSharing" not in kueue_config(variant("eks-dev", **NO_TEAMS).config)


def test_the_cluster_queue_holds_whole_nodes_of_gpus_and_efa_devices(variant):
    eks_stack = variant("eks-dev", **NO_TEAMS)
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
