"""policy/eks.py: each rule fails on the mistake it exists for and passes the checked-in EKS stack."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.eks import eks_network_interfaces
from policy import eks
from policy.resources import referenced
from trainer.contract.catalog import INSTANCE_TYPES

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "k8s"
P5 = INSTANCE_TYPES["p5.48xlarge"]
JOBSET_TYPE = "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet"
QUEUE_TYPE = "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue"


def camel(interfaces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = {
        "network_card_index": "networkCardIndex",
        "device_index": "deviceIndex",
        "interface_type": "interfaceType",
    }
    return [{names.get(k, k): v for k, v in i.items()} for i in interfaces]


def queue_props(gpus: int, efa: int) -> dict[str, Any]:
    resources = [
        {"name": "nvidia.com/gpu", "nominalQuota": gpus},
        {"name": "vpc.amazonaws.com/efa", "nominalQuota": efa},
    ]
    return {
        "spec": {
            "resourceGroups": [{"coveredResources": [], "flavors": [{"name": "p5", "resources": resources}]}]
        }
    }


def cluster(resource, devices: int = 32, gpus: int = 16, efa: int = 64, nodes: int = 2):
    template = resource(
        "aws:ec2/launchTemplate:LaunchTemplate",
        {"networkInterfaces": camel(eks_network_interfaces(P5, ["sg-1"]))[: devices + 1]},
        name="gpu-template",
    )
    group = resource(
        eks.NODE_GROUP,
        {"instanceTypes": ["p5.48xlarge"], "scalingConfig": {"maxSize": nodes}},
        name="gpu-nodes",
        fed_by={"launchTemplate": [template]},
    )
    return [template, group, resource(QUEUE_TYPE, queue_props(gpus, efa), name="queue")]


def jobset(grace: int | None, stop_grace: str = "120", efa: int = 32) -> dict[str, Any]:
    """The upstream example (tests/fixtures/k8s) with a training container's grace, stop grace and EFA request."""
    obj = copy.deepcopy(yaml.safe_load((FIXTURES / "jobset_host_maintenance.yaml").read_text()))
    pod = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    if grace is not None:
        pod["terminationGracePeriodSeconds"] = grace
    container = pod["containers"][0]
    container["env"] = [{"name": "TRAINSTACK_STOP_GRACE_SECONDS", "value": stop_grace}]
    container["resources"] = {"limits": {"vpc.amazonaws.com/efa": efa, "nvidia.com/gpu": 8}}
    return obj


def test_matching_template_quota_and_catalog_pass(resource, violations):
    assert violations(eks.efa_agree, *cluster(resource)) == []


def test_a_template_short_of_the_catalogs_efa_cards_fails(resource, violations):
    found = violations(eks.efa_agree, *cluster(resource, devices=31, efa=62))
    assert any("has 32 EFA cards" in message and "attaches 31" in message for _, message in found)


def test_a_quota_short_of_whole_nodes_fails(resource, violations):
    ((name, message),) = violations(eks.efa_agree, *cluster(resource, efa=32))
    assert (
        name == "queue"
        and "holds 32.0 vpc.amazonaws.com/efa" in message
        and "32 per node x 2 nodes" in message
    )


def test_a_jobset_asking_for_fewer_devices_than_a_node_has_fails(resource, violations):
    resources = [*cluster(resource), resource(JOBSET_TYPE, jobset(grace=180, efa=16), name="train")]
    ((name, message),) = violations(eks.efa_agree, *resources)
    assert name == "train" and "vpc.amazonaws.com/efa = 16, but one node has 32" in message


def test_termination_grace_at_or_under_the_stop_grace_fails(resource, violations):
    for grace in (None, 120):  # None: Kubernetes' default of 30 s
        ((_, message),) = violations(
            eks.jobset_grace, resource(JOBSET_TYPE, jobset(grace=grace), name="train")
        )
        assert "does not exceed the trainer's TRAINSTACK_STOP_GRACE_SECONDS = 120" in message
    assert violations(eks.jobset_grace, resource(JOBSET_TYPE, jobset(grace=180), name="train")) == []


@pytest.mark.parametrize(
    ("props", "bad"),
    [
        ({"chart": "nvidia-device-plugin", "version": "0.19.0"}, True),
        ({"chart": "nvidia-device-plugin", "version": "0.19.3"}, False),
        ({"chart": "aws-efa-k8s-device-plugin", "version": "v0.5.9"}, True),
        ({"chart": "aws-efa-k8s-device-plugin"}, True),  # unpinned: whatever is newest that day
        ({"chart": "oci://registry.k8s.io/kueue/charts/kueue", "version": "0.19.2"}, False),
    ],
)
def test_charts_before_their_fix_fail(resource, violations, props, bad):
    found = violations(eks.fixed_versions, resource(eks.HELM_RELEASE, props, name="release"))
    assert bool(found) is bad, found


def test_a_vpc_cni_before_efa_only_support_fails(resource, violations):
    old = resource(eks.ADDON, {"addonName": "vpc-cni", "addonVersion": "v1.18.3-eksbuild.1"}, name="cni")
    ((_, message),) = violations(eks.fixed_versions, old)
    assert "before 1.18.5" in message
    new = resource(eks.ADDON, {"addonName": "vpc-cni", "addonVersion": "v1.20.4-eksbuild.2"}, name="cni")
    default = resource(eks.ADDON, {"addonName": "vpc-cni"}, name="cni")
    assert violations(eks.fixed_versions, new, default) == []


def test_the_eks_stack_passes_and_the_rule_sees_its_node_group_and_queue(planned, violations):
    resources = planned("eks-dev")
    groups = [r for r in resources if r.resource_type == eks.NODE_GROUP]
    assert [g for g in groups if referenced(g, "launchTemplate", ["aws:ec2/launchTemplate:LaunchTemplate"])]
    assert [r for r in resources if r.resource_type == QUEUE_TYPE]
    for policy in (eks.efa_agree, eks.jobset_grace, eks.fixed_versions):
        assert violations(policy, *resources) == []
