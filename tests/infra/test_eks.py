"""The EKS stack (infra/eks.py) under the Pulumi mocks: control plane, access, node groups, launch template, add-ons,
capacity variants, alarms and outputs, asserted on the inputs the engine would receive."""

from __future__ import annotations

import json

import pytest

from infra.cluster import IMDS_HOP_LIMIT
from infra.config import read_stack_file
from infra.eks import GPU_NODE_LABELS, NODE_ROLE_POLICIES, efa_devices, eks_network_interfaces
from infra.k8s_versions import EKS_ADDONS, KUBERNETES_MINOR
from infra.preview import run_program
from trainer.contract.catalog import INSTANCE_TYPES
from trainer.contract.gpu_nodes import GPU_NODE_TAINT
from trainer.contract.outputs import BATCH_OUTPUTS, EKS_OUTPUTS, missing_outputs

RESERVATION = "cr-0123456789abcdef0"


BLOCK = {"trainstack:capacityReservationId": RESERVATION, "trainstack:capacityBlock": True}


def k8s_object(stack, kind: str) -> dict:
    (found,) = [
        r for r in stack.plan.resources if r.type.startswith("kubernetes:") and r.type.endswith(f":{kind}")
    ]
    return found.inputs


def node_class(stack) -> dict:
    return k8s_object(stack, "EC2NodeClass")["spec"]


def node_pool(stack) -> dict:
    return k8s_object(stack, "NodePool")["spec"]


def block_template(stack):
    return stack.one("ec2.LaunchTemplate", "-eks-gpu")


def block_nodes(stack):
    return stack.one("eks.NodeGroup", "-eks-gpu")


def test_p5_nodes_get_32_efa_interfaces(eks_stack):
    assert eks_stack.config.instance_type == "p5.48xlarge"
    assert (
        efa_devices(node_class(eks_stack)["networkInterfaces"])
        == 32
        == INSTANCE_TYPES["p5.48xlarge"].efa_interfaces
    )


def test_p4d_nodes_get_4_efa_interfaces(variant):
    p4d = variant("eks-dev", **{"trainstack:instanceType": "p4d.24xlarge"})
    assert (
        efa_devices(node_class(p4d)["networkInterfaces"])
        == 4
        == INSTANCE_TYPES["p4d.24xlarge"].efa_interfaces
    )


def test_interfaces_follow_the_ec2_guide_ena_primary_then_efa_only(eks_stack):
    primary, *efa = node_class(eks_stack)["networkInterfaces"]
    assert (primary["networkCardIndex"], primary["deviceIndex"], primary["interfaceType"]) == (
        0,
        0,
        "interface",
    )
    assert [(i["networkCardIndex"], i["deviceIndex"], i["interfaceType"]) for i in efa] == [
        (card, 1 if card == 0 else 0, "efa-only") for card in range(eks_stack.config.instance.efa_interfaces)
    ]


def test_gpu_nodes_carry_the_cluster_group_and_the_efa_group_in_the_first_zone(eks_stack):
    spec = node_class(eks_stack)
    cluster_group = eks_stack.one("eks.Cluster").outputs["vpcConfig"]["clusterSecurityGroupId"]
    assert spec["securityGroupSelectorTerms"] == [{"id": cluster_group}, {"id": eks_stack.efa_group.id}]
    ((subnet,),) = [[term["id"] for term in spec["subnetSelectorTerms"]]]
    zone = next(s for s in eks_stack.all("ec2.Subnet") if s.id == subnet).inputs["availabilityZone"]
    assert zone == eks_stack.config.cluster_availability_zone


def test_gpu_nodes_require_imdsv2_with_one_hop_and_encrypt_the_root_volume(eks_stack):
    spec = node_class(eks_stack)
    metadata = spec["metadataOptions"]
    assert (metadata["httpTokens"], metadata["httpPutResponseHopLimit"]) == ("required", IMDS_HOP_LIMIT)
    (root,) = spec["blockDeviceMappings"]
    assert root["rootVolume"] is True and root["ebs"]["encrypted"] is True
    assert root["ebs"]["kmsKeyID"] == eks_stack.key_arn
    for template in [eks_stack.one("ec2.LaunchTemplate", "-eks-system")]:
        metadata = template.inputs["metadataOptions"]
        assert (metadata["httpTokens"], metadata["httpPutResponseHopLimit"]) == ("required", IMDS_HOP_LIMIT)


def test_the_pool_holds_at_most_the_stacks_nodes_of_its_type_tainted_and_removed_when_empty(eks_stack):
    cfg, pool = eks_stack.config, node_pool(eks_stack)
    requirements = {r["key"]: r["values"] for r in pool["template"]["spec"]["requirements"]}
    assert requirements == {
        "node.kubernetes.io/instance-type": [cfg.instance_type],
        "karpenter.sh/capacity-type": ["on-demand"],
        "topology.kubernetes.io/zone": [cfg.cluster_availability_zone],
    }
    assert pool["limits"] == {"nvidia.com/gpu": cfg.node_count * cfg.instance.gpus}
    assert pool["template"]["spec"]["taints"] == [GPU_NODE_TAINT]
    assert pool["template"]["spec"]["expireAfter"] == "Never"
    assert pool["template"]["metadata"]["labels"] == GPU_NODE_LABELS
    disruption = pool["disruption"]
    assert (disruption["consolidationPolicy"], disruption["budgets"]) == (
        "WhenEmpty",
        [{"nodes": "0", "reasons": ["Drifted"]}],
    )


def test_no_gpu_node_exists_while_no_job_runs(eks_stack):
    # No managed GPU node group and no GPU launch template: Karpenter starts nodes for pending pods only.
    assert [g.name for g in eks_stack.all("eks.NodeGroup")] == [f"{eks_stack.config.name_prefix}-eks-system"]
    assert not [t for t in eks_stack.all("ec2.LaunchTemplate") if t.name.endswith("-eks-gpu")]


def test_every_gpu_node_lands_in_the_stacks_cluster_placement_group(eks_stack):
    group = eks_stack.one("ec2.PlacementGroup", "-eks-gpu")
    assert group.inputs["strategy"] == "cluster"
    assert node_class(eks_stack)["placementGroupSelector"] == {"name": group.name}


def test_the_pool_knows_the_hugepages_the_nodes_will_report(eks_stack):
    overlay = k8s_object(eks_stack, "NodeOverlay")["spec"]
    assert overlay["capacity"] == {"hugepages-2Mi": f"{5128 * 2}Mi"}
    assert overlay["requirements"] == [
        {
            "key": "node.kubernetes.io/instance-type",
            "operator": "In",
            "values": [eks_stack.config.instance_type],
        }
    ]


def test_an_on_demand_reservation_is_the_pools_only_capacity_in_its_own_placement_group(variant):
    odcr = variant(
        "eks-dev",
        **{
            "trainstack:capacityReservationId": RESERVATION,
            "trainstack:reservationPlacementGroup": "odcr-group",
        },
    )
    spec = node_class(odcr)
    assert spec["placementGroupSelector"] == {"name": "odcr-group"}
    assert spec["capacityReservationSelectorTerms"] == [{"id": RESERVATION}]
    requirements = {r["key"]: r["values"] for r in node_pool(odcr)["template"]["spec"]["requirements"]}
    assert requirements["karpenter.sh/capacity-type"] == ["reserved"] and odcr.all("ec2.PlacementGroup") == []


def test_a_capacity_block_is_a_node_group_whose_template_names_the_instance_type(variant):
    block = variant("eks-dev", **BLOCK)
    template = block_template(block).inputs
    assert template["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert (
        template["instanceType"] == "p5.48xlarge"
    )  # "Set InstanceType": EKS user guide, Capacity Blocks MNG
    assert template["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": RESERVATION}
    }
    assert "placement" not in template  # a Capacity Block places its instances itself
    group = block_nodes(block).inputs
    assert group["capacityType"] == "CAPACITY_BLOCK" and "instanceTypes" not in group
    assert group["launchTemplate"] == {"id": block_template(block).id, "version": "1"}
    assert group["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}]
    # No Karpenter on a block: its nodes are the block's.
    assert not [r for r in block.plan.resources if "karpenter" in r.type or r.name == "karpenter"]


def test_a_block_template_has_no_subnet_no_shutdown_behaviour_and_the_cluster_group(variant):
    block = variant("eks-dev", **BLOCK)
    template = block_template(block).inputs
    assert not [i for i in template["networkInterfaces"] if "subnetId" in i]
    assert "instanceInitiatedShutdownBehavior" not in template and "iamInstanceProfile" not in template
    cluster_group = block.one("eks.Cluster").outputs["vpcConfig"]["clusterSecurityGroupId"]
    for interface in template["networkInterfaces"]:
        assert interface["securityGroups"] == [cluster_group, block.efa_group.id]


def depends_on(stack, resource, suffixes) -> bool:
    urns = set(resource.dependencies)
    return all(any(u.endswith(f"::{stack.config.name_prefix}-{s}") for u in urns) for s in suffixes)


def test_the_cluster_and_node_groups_wait_for_their_roles_grants(variant, eks_stack):
    assert depends_on(
        eks_stack, eks_stack.one("eks.Cluster"), ["eks-cluster-AmazonEKSClusterPolicy", "eks-control-plane"]
    )
    block = variant("eks-dev", **BLOCK)
    node_grants = [f"eks-node-{arn.rsplit('/', 1)[1]}" for arn in NODE_ROLE_POLICIES]
    for group in block.all("eks.NodeGroup"):
        assert depends_on(block, group, node_grants), group.name


def test_the_control_plane_sends_audit_and_authenticator_logs_under_the_stack_key(eks_stack):
    cluster = eks_stack.one("eks.Cluster").inputs
    assert cluster["enabledClusterLogTypes"] == ["audit", "authenticator"]
    group = eks_stack.one("cloudwatch.LogGroup", "-eks-control-plane").inputs
    assert group["name"] == f"/aws/eks/{eks_stack.config.eks_cluster_name}/cluster"
    assert (group["retentionInDays"], group["kmsKeyId"]) == (
        eks_stack.config.log_retention_days,
        eks_stack.key_arn,
    )


def test_karpenter_runs_as_its_pod_identity_and_may_pass_only_its_node_role(eks_stack):
    prefix = eks_stack.config.name_prefix
    association = eks_stack.one("eks.PodIdentityAssociation", "-karpenter").inputs
    assert (association["namespace"], association["serviceAccount"]) == ("kube-system", "karpenter")
    roles = {r.outputs["arn"]: r for r in eks_stack.all("iam.Role")}
    trust = json.loads(roles[association["roleArn"]].inputs["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    (policy,) = [r for r in eks_stack.all("iam.RolePolicy") if r.name == f"{prefix}-karpenter"]
    statements = {s["Sid"]: s for s in json.loads(policy.inputs["policy"])["Statement"]}
    node_role = eks_stack.one("iam.Role", "-karpenter-node")
    assert statements["AllowPassingInstanceRole"]["Resource"] == [node_role.outputs["arn"]]
    entry = eks_stack.one("eks.AccessEntry", "-karpenter-node").inputs
    assert (entry["principalArn"], entry["type"]) == (node_role.outputs["arn"], "EC2_LINUX")
    assert node_class(eks_stack)["role"] == node_role.outputs["name"]


def test_cluster_uses_access_entries_the_stack_key_and_a_private_endpoint(eks_stack):
    cluster = eks_stack.one("eks.Cluster").inputs
    assert cluster["version"] == KUBERNETES_MINOR and cluster["name"] == eks_stack.config.eks_cluster_name
    assert cluster["accessConfig"] == {
        "authenticationMode": "API",
        "bootstrapClusterCreatorAdminPermissions": False,
    }
    assert cluster["encryptionConfig"] == {
        "provider": {"keyArn": eks_stack.key_arn},
        "resources": ["secrets"],
    }
    assert cluster["vpcConfig"]["endpointPrivateAccess"] is True
    assert cluster["vpcConfig"]["endpointPublicAccess"] is False
    assert len(cluster["vpcConfig"]["subnetIds"]) == len(eks_stack.config.availability_zones) >= 2


def test_a_public_endpoint_is_open_only_to_the_named_ranges():
    values = {**read_stack_file("eks-dev"), "trainstack:eksPublicAccessCidrs": ["203.0.113.0/24"]}
    (cluster,) = [r for r in run_program("eks-dev", values).resources if r.type == "aws:eks/cluster:Cluster"]
    vpc = cluster.inputs["vpcConfig"]
    assert (vpc["endpointPublicAccess"], vpc["publicAccessCidrs"]) == (True, ["203.0.113.0/24"])


def test_each_admin_gets_an_access_entry_with_cluster_admin(eks_stack):
    entries = [e for e in eks_stack.all("eks.AccessEntry") if "-eks-admin-" in e.name]
    assert [e.inputs["principalArn"] for e in entries] == eks_stack.config.eks_admin_arns
    for association in eks_stack.all("eks.AccessPolicyAssociation"):
        assert association.inputs["policyArn"].endswith("cluster-access-policy/AmazonEKSClusterAdminPolicy")
        assert association.inputs["accessScope"] == {"type": "cluster"}


def test_addons_are_the_pinned_list_and_fsx_and_cloudwatch_get_pod_identities(eks_stack):
    addons = {a.inputs["addonName"]: a.inputs for a in eks_stack.all("eks.Addon")}
    assert set(addons) == {a.name for a in EKS_ADDONS}
    identities = {
        name: a.get("podIdentityAssociations")
        for name, a in addons.items()
        if a.get("podIdentityAssociations")
    }
    assert {name: [i["serviceAccount"] for i in v] for name, v in identities.items()} == {
        "aws-fsx-csi-driver": ["fsx-csi-controller-sa"],
        "amazon-cloudwatch-observability": ["cloudwatch-agent"],
    }
    roles = {r.outputs["arn"]: r for r in eks_stack.all("iam.Role")}
    for (association,) in identities.values():
        trust = json.loads(roles[association["roleArn"]].inputs["assumeRolePolicy"])
        assert trust["Statement"][0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}


def test_the_fsx_driver_may_only_describe_the_stacks_file_system(eks_stack):
    (policy,) = [r for r in eks_stack.all("iam.RolePolicy") if r.name.endswith("-aws-fsx-csi-driver")]
    (statement,) = json.loads(policy.inputs["policy"])["Statement"]
    assert statement["Action"] == ["fsx:DescribeFileSystems"]
    assert statement["Resource"] == [eks_stack.one("fsx.LustreFileSystem").outputs["arn"]]


def test_a_failed_jobset_pages_and_the_stall_alarm_watches_the_local_queue(eks_stack):
    alarms = {a.name: a.inputs for a in eks_stack.all("cloudwatch.MetricAlarm")}
    prefix = eks_stack.config.name_prefix
    failed = alarms[f"{prefix}-job-failed"]
    assert (failed["namespace"], failed["metricName"]) == ("ContainerInsights", "pod_status_failed")
    assert failed["dimensions"] == {"ClusterName": eks_stack.config.eks_cluster_name}
    assert failed["alarmActions"] == [eks_stack.one("sns.Topic").outputs["arn"]]
    assert alarms[f"{prefix}-training-stalled"]["dimensions"] == {
        "JobQueue": eks_stack.plan.outputs["kueue_local_queue"]
    }
    assert eks_stack.all("cloudwatch.EventRule") == [
        r for r in eks_stack.all("cloudwatch.EventRule") if "job-failed" not in r.name
    ]


def test_outputs_are_the_eks_set_without_batchs(eks_stack):
    outputs = eks_stack.plan.outputs
    assert missing_outputs(outputs) == [] and not set(BATCH_OUTPUTS) & set(outputs)
    assert set(EKS_OUTPUTS) <= set(outputs) and outputs["orchestrator"] == "eks"
    assert outputs["efa_devices_per_node"] == efa_devices(node_class(eks_stack)["networkInterfaces"])
    assert outputs["eks_cluster_ca"] == eks_stack.one("eks.Cluster").outputs["certificateAuthority"]["data"]
    assert outputs["eks_cluster_endpoint"].startswith("https://")


def test_batch_on_an_eks_stack_is_the_cpu_data_queue_alone(eks_stack):
    # Data preparation stays a Batch array job on every stack (infra/data_prep.py); training runs on EKS.
    batch = [r for r in eks_stack.plan.resources if r.type.startswith("aws:batch/")]
    assert sorted(r.type.split(":")[-1] for r in batch) == ["ComputeEnvironment", "JobDefinition", "JobQueue"]
    assert all(r.name.endswith("-data") for r in batch), [r.name for r in batch]


@pytest.mark.parametrize("name", ["p4d.24xlarge", "p5.48xlarge", "p5en.48xlarge"])
def test_efa_devices_come_from_the_catalog(name):
    assert (
        efa_devices(eks_network_interfaces(INSTANCE_TYPES[name], [])) == INSTANCE_TYPES[name].efa_interfaces
    )
