"""policy/kueue.py: Kueue objects against kubernetes-sigs/kueue v0.19.2's documented semantics, failing cases from
those sources."""

from __future__ import annotations

import yaml

from infra.cluster_software import chart_values, kueue_config
from infra.config import load_stack_config
from infra.k8s_versions import KUEUE
from policy import kueue
from policy.eks import HELM_RELEASE

FLAVOR = {
    "metadata": {"name": "p5-48xlarge"},
    "spec": {"nodeLabels": {"node.kubernetes.io/instance-type": "p5.48xlarge"}},
}


def queue(resources: list[dict], cohort: str | None = "stack") -> dict:
    spec = {
        "resourceGroups": [
            {"coveredResources": [], "flavors": [{"name": "p5-48xlarge", "resources": resources}]}
        ]
    }
    if cohort:
        spec["cohortName"] = cohort
    return {"metadata": {"name": "q"}, "spec": spec}


def gpu_efa(gpus, efa, borrow_gpus=None, borrow_efa=None) -> list[dict]:
    def one(name, nominal, borrow):
        return {
            "name": name,
            "nominalQuota": nominal,
            **({"borrowingLimit": borrow} if borrow is not None else {}),
        }

    return [one("nvidia.com/gpu", gpus, borrow_gpus), one("vpc.amazonaws.com/efa", efa, borrow_efa)]


def check(resource, violations, props):
    return violations(
        kueue.queues_whole_nodes,
        resource(kueue.RESOURCE_FLAVOR, FLAVOR, name="flavor"),
        resource(kueue.CLUSTER_QUEUE, props, name="team-a"),
    )


def test_whole_nodes_in_every_resource_with_borrowing_pass(resource, violations):
    assert check(resource, violations, queue(gpu_efa(8, 32, borrow_gpus=8, borrow_efa=32))) == []


def test_a_borrowing_limit_without_a_cohort_fails(resource, violations):
    # clusterqueue_types.go: "borrowingLimit must be null if spec.cohortName is empty".
    ((_, message),) = check(resource, violations, queue(gpu_efa(16, 64, borrow_gpus=0), cohort=None))
    assert "nvidia.com/gpu sets borrowingLimit without a cohort" in message


def test_a_borrowing_limit_of_half_a_node_fails(resource, violations):
    # 8 GPUs nominal + 4 borrowed: a 1.5-node ceiling that no whole-node job can ever use past 1.
    found = check(resource, violations, queue(gpu_efa(8, 32, borrow_gpus=4, borrow_efa=16)))
    assert any("with borrowing: nvidia.com/gpu = 1.5 nodes" in message for _, message in found)


def test_gpus_for_two_nodes_but_efa_devices_for_one_fail(resource, violations):
    found = check(resource, violations, queue(gpu_efa(16, 32)))
    assert any(
        "nominal: nodes' worth differs by resource (nvidia.com/gpu 2, vpc.amazonaws.com/efa 1)" in m
        for _, m in found
    )


def test_the_eks_stack_passes(planned, violations):
    resources = planned("eks-dev")
    assert violations(kueue.queues_whole_nodes, *resources) == []
    assert violations(kueue.pods_ready, *resources) == []


def test_kueue_without_wait_for_pods_ready_fails(resource, violations):
    cfg = load_stack_config("eks-dev")
    config = kueue_config(cfg)
    del config["waitForPodsReady"]
    values = {"managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(config)}}
    release = resource(
        HELM_RELEASE, {"chart": KUEUE.chart, "version": KUEUE.version, "values": values}, name="kueue"
    )
    ((_, message),) = violations(kueue.pods_ready, release)
    assert "without waitForPodsReady" in message
    good = resource(
        HELM_RELEASE,
        {"chart": KUEUE.chart, "version": KUEUE.version, "values": chart_values(KUEUE, cfg)},
        name="kueue",
    )
    assert violations(kueue.pods_ready, good) == []
