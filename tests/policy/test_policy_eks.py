"""policy/eks.py: each rule fails on the mistake it exists for and passes the checked-in EKS stack."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.eks import NODE_ROLE_POLICIES, eks_network_interfaces
from policy import eks
from policy.resources import referenced
from trainer.contract.catalog import INSTANCE_TYPES

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "k8s"
P5 = INSTANCE_TYPES["p5.48xlarge"]
JOBSET_TYPE = "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet"
QUEUE_TYPE = "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue"


def camel(interfaces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Interfaces as the engine hands them over: camelCase keys."""

    def key(name: str) -> str:
        head, *rest = name.split("_")
        return head + "".join(part.title() for part in rest)

    return [{key(k): v for k, v in i.items()} for i in interfaces]


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


def node_group_on(resource, template_props: dict[str, Any], fed_by_cluster: bool):
    control_plane = resource(eks.EKS_CLUSTER, {"name": "c"}, name="cluster")
    template = resource(
        "aws:ec2/launchTemplate:LaunchTemplate",
        template_props,
        name="gpu-template",
        fed_by={"networkInterfaces": [control_plane] if fed_by_cluster else []},
    )
    group = resource(
        eks.NODE_GROUP,
        {"instanceTypes": ["p5.48xlarge"]},
        name="gpu-nodes",
        fed_by={"launchTemplate": [template]},
    )
    return [control_plane, template, group]


def test_a_node_template_with_a_shutdown_behaviour_fails(resource, violations):
    interfaces = camel(eks_network_interfaces(P5, ["sg-cluster", "sg-efa"]))
    bad = node_group_on(
        resource, {"networkInterfaces": interfaces, "instanceInitiatedShutdownBehavior": "terminate"}, True
    )
    ((name, message),) = violations(eks.node_templates, *bad)
    assert name == "gpu-template" and "sets instanceInitiatedShutdownBehavior" in message
    assert (
        violations(eks.node_templates, *node_group_on(resource, {"networkInterfaces": interfaces}, True))
        == []
    )


def test_a_node_template_without_the_cluster_group_fails(resource, violations):
    interfaces = camel(eks_network_interfaces(P5, ["sg-efa"]))
    ((_, message),) = violations(
        eks.node_templates, *node_group_on(resource, {"networkInterfaces": interfaces}, False)
    )
    assert "but not the cluster security group" in message


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
        # Chart v0.5.12 runs plugin v0.5.7, before the plugin's 0.5.10 fix: the floor is the chart's v0.5.18
        # (aws/eks-charts stable/aws-efa-k8s-device-plugin/Chart.yaml, version vs appVersion).
        ({"chart": "aws-efa-k8s-device-plugin", "version": "v0.5.12"}, True),
        ({"chart": "aws-efa-k8s-device-plugin", "version": "v0.5.18"}, False),
        ({"chart": "oci://public.ecr.aws/karpenter/karpenter", "version": "1.10.0"}, True),
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


NEW_POLICIES = (eks.capacity_block_groups, eks.grants_before_use, eks.audit_logs)
BLOCK = {"trainstack:capacityReservationId": "cr-0123456789abcdef0", "trainstack:capacityBlock": True}


def test_the_eks_stack_passes_and_the_rule_sees_its_node_pool_and_queues(planned, violations):
    resources = planned("eks-dev")
    (source,) = eks.gpu_node_sources(resources)
    assert (source.kind, source.devices, source.nodes) == ("NodePool", 32, 2.0)
    assert len([r for r in resources if r.resource_type == QUEUE_TYPE]) == 2  # one per team, in a cohort
    for policy in (eks.efa_agree, eks.node_templates, eks.jobset_grace, eks.fixed_versions, *NEW_POLICIES):
        assert violations(policy, *resources) == []


def test_the_capacity_block_stack_passes_and_the_rules_see_its_node_group(planned, violations):
    resources = planned("eks-dev", **BLOCK)
    (source,) = eks.gpu_node_sources(resources)
    assert (source.kind, source.instance_types) == ("node group", ["p5.48xlarge"])
    groups = [r for r in resources if r.resource_type == eks.NODE_GROUP]
    assert [g for g in groups if referenced(g, "launchTemplate", ["aws:ec2/launchTemplate:LaunchTemplate"])]
    for policy in (eks.efa_agree, eks.node_templates, *NEW_POLICIES):
        assert violations(policy, *resources) == []


def karpenter_pool(resource, gpus_limit: int = 16, devices: int = 32):
    interfaces = [
        {
            "networkCardIndex": i["network_card_index"],
            "deviceIndex": i["device_index"],
            "interfaceType": i["interface_type"],
        }
        for i in eks_network_interfaces(P5, [])
    ][: devices + 1]
    node_class = resource(
        eks.NODE_CLASS, {"metadata": {"name": "gpu"}, "spec": {"networkInterfaces": interfaces}}, name="class"
    )
    pool = resource(
        eks.NODE_POOL,
        {
            "metadata": {"name": "gpu"},
            "spec": {
                "template": {
                    "spec": {
                        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"},
                        "requirements": [
                            {
                                "key": "node.kubernetes.io/instance-type",
                                "operator": "In",
                                "values": ["p5.48xlarge"],
                            }
                        ],
                    }
                },
                "limits": {"nvidia.com/gpu": gpus_limit},
            },
        },
        name="pool",
    )
    return [node_class, pool]


def test_team_queues_whose_quotas_sum_past_the_pool_fail(resource, violations):
    # Two teams each holding both nodes: Kueue admits a 2-node job in each, the pool can start 2 nodes in all, and
    # the second job gets part of its nodes (the half-admitted job of kubernetes-sigs/kueue issue 2796).
    queues = [resource(QUEUE_TYPE, queue_props(16, 64), name=f"team-{n}") for n in ("a", "b")]
    found = violations(eks.efa_agree, *karpenter_pool(resource), *queues)
    assert found and all("8 per node x 2 nodes" in m or "32 per node x 2 nodes" in m for _, m in found)
    halves = [resource(QUEUE_TYPE, queue_props(8, 32), name=f"team-{n}") for n in ("a", "b")]
    assert violations(eks.efa_agree, *karpenter_pool(resource), *halves) == []


def test_a_node_class_short_of_the_catalogs_efa_cards_fails(resource, violations):
    found = violations(
        eks.efa_agree,
        *karpenter_pool(resource, devices=16),
        resource(QUEUE_TYPE, queue_props(16, 32), name="q"),
    )
    assert any(
        "NodePool 'pool' runs p5.48xlarge, which has 32 EFA cards" in m and "attaches 16" in m
        for _, m in found
    )


def block_group(resource, template_props: dict[str, Any], group_props: dict[str, Any]):
    template = resource("aws:ec2/launchTemplate:LaunchTemplate", template_props, name="block-template")
    group = resource(
        eks.NODE_GROUP,
        {"capacityType": "CAPACITY_BLOCK", **group_props},
        name="block-nodes",
        fed_by={"launchTemplate": [template]},
    )
    return [template, group]


def test_a_capacity_block_template_without_its_instance_type_fails(resource, violations):
    # EKS user guide, "Create a managed node group with Capacity Blocks for ML": the template sets InstanceType.
    found = violations(
        eks.capacity_block_groups, *block_group(resource, {}, {"instanceTypes": ["p5.48xlarge"]})
    )
    assert sorted(name for name, _ in found) == ["block-nodes", "block-template"]
    assert (
        violations(eks.capacity_block_groups, *block_group(resource, {"instanceType": "p5.48xlarge"}, {}))
        == []
    )


def test_a_node_group_that_does_not_wait_for_its_roles_grants_fails(resource, violations):
    role = resource(eks.ROLE, {}, name="node-role")
    grant = resource(
        eks.ROLE_GRANTS[0],
        {"policyArn": NODE_ROLE_POLICIES[0]},
        name="grant",
        fed_by={"role": [role]},
    )
    group = resource(eks.NODE_GROUP, {}, name="nodes", fed_by={"nodeRoleArn": [role]})
    ((name, message),) = violations(eks.grants_before_use, role, grant, group)
    assert name == "nodes" and "does not depend on its grants ['grant']" in message
    group.dependencies = [grant]
    assert violations(eks.grants_before_use, role, grant, group) == []


def test_a_cluster_without_the_audit_log_fails(resource, violations):
    ((_, message),) = violations(
        eks.audit_logs, resource(eks.EKS_CLUSTER, {"enabledClusterLogTypes": ["api"]}, name="c")
    )
    assert "EKS.8" in message
    assert (
        violations(eks.audit_logs, resource(eks.EKS_CLUSTER, {"enabledClusterLogTypes": ["audit"]}, name="c"))
        == []
    )


def test_make_compliance_counts_eks8_on_the_eks_stack():
    from policy.compliance import statuses

    rows = {row.control: row for row in statuses("eks-dev")}
    assert rows["EKS.8"].status == "pass" and rows["EKS.8"].resources == ["trainstack-eks-dev-eks"]
    assert rows["trainstack.eks-teams"].status == "pass"
