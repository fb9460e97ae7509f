"""The EKS stack (infra/eks.py) under the Pulumi mocks: control plane, access, node groups, launch template, add-ons,
capacity variants, alarms and outputs, asserted on the inputs the engine would receive."""

from __future__ import annotations

import json

import pytest

from infra.cluster import IMDS_HOP_LIMIT
from infra.config import read_stack_file
from infra.eks import GPU_AMI_TYPE, GPU_NODE_LABELS, efa_devices, eks_network_interfaces
from infra.k8s_versions import EKS_ADDONS, KUBERNETES_MINOR
from infra.preview import run_program
from trainer.contract.catalog import INSTANCE_TYPES
from trainer.contract.outputs import BATCH_OUTPUTS, EKS_OUTPUTS, missing_outputs

RESERVATION = "cr-0123456789abcdef0"


def gpu_template(stack):
    return stack.one("ec2.LaunchTemplate", "-eks-gpu")


def gpu_nodes(stack):
    return stack.one("eks.NodeGroup", "-eks-gpu")


def test_p5_launch_template_has_32_efa_interfaces(eks_stack):
    assert eks_stack.config.instance_type == "p5.48xlarge"
    interfaces = gpu_template(eks_stack).inputs["networkInterfaces"]
    assert efa_devices(interfaces) == 32 == INSTANCE_TYPES["p5.48xlarge"].efa_interfaces


def test_p4d_launch_template_has_4_efa_interfaces(variant):
    p4d = variant("eks-dev", **{"trainstack:instanceType": "p4d.24xlarge"})
    assert (
        efa_devices(gpu_template(p4d).inputs["networkInterfaces"])
        == 4
        == INSTANCE_TYPES["p4d.24xlarge"].efa_interfaces
    )


def test_interfaces_follow_the_ec2_guide_ena_primary_then_efa_only(eks_stack):
    interfaces = gpu_template(eks_stack).inputs["networkInterfaces"]
    primary, *efa = interfaces
    assert (primary["networkCardIndex"], primary["deviceIndex"], primary["interfaceType"]) == (
        0,
        0,
        "interface",
    )
    assert primary["associatePublicIpAddress"] == "false"
    assert [(i["networkCardIndex"], i["deviceIndex"], i["interfaceType"]) for i in efa] == [
        (card, 1 if card == 0 else 0, "efa-only") for card in range(eks_stack.config.instance.efa_interfaces)
    ]


def test_node_group_template_has_no_subnet_no_shutdown_behaviour_and_no_user_data(eks_stack):
    template = gpu_template(eks_stack).inputs
    assert not [i for i in template["networkInterfaces"] if "subnetId" in i]
    assert "instanceInitiatedShutdownBehavior" not in template
    assert "userData" not in template and "iamInstanceProfile" not in template


def test_every_interface_carries_the_cluster_group_and_the_efa_group(eks_stack):
    cluster_group = eks_stack.one("eks.Cluster").outputs["vpcConfig"]["clusterSecurityGroupId"]
    for interface in gpu_template(eks_stack).inputs["networkInterfaces"]:
        assert interface["securityGroups"] == [cluster_group, eks_stack.efa_group.id]


def test_templates_require_imdsv2_with_the_one_hop_limit_and_encrypt_the_root_volume(eks_stack):
    for template in eks_stack.all("ec2.LaunchTemplate"):
        metadata = template.inputs["metadataOptions"]
        assert (metadata["httpTokens"], metadata["httpPutResponseHopLimit"]) == ("required", IMDS_HOP_LIMIT)
        (root,) = template.inputs["blockDeviceMappings"]
        assert root["ebs"]["encrypted"] == "true" and root["ebs"]["kmsKeyId"] == eks_stack.key_arn


def test_gpu_node_group_runs_the_stacks_nodes_on_its_template_in_one_zone(eks_stack):
    group = gpu_nodes(eks_stack).inputs
    template = gpu_template(eks_stack)
    assert group["amiType"] == GPU_AMI_TYPE and group["instanceTypes"] == [eks_stack.config.instance_type]
    assert group["launchTemplate"] == {"id": template.id, "version": "1"}
    assert group["scalingConfig"] == {
        "minSize": 0,
        "desiredSize": eks_stack.config.node_count,
        "maxSize": eks_stack.config.node_count,
    }
    (subnet,) = group["subnetIds"]
    zone = next(s for s in eks_stack.all("ec2.Subnet") if s.id == subnet).inputs["availabilityZone"]
    assert zone == eks_stack.config.cluster_availability_zone
    assert group["capacityType"] == "ON_DEMAND" and group["labels"] == GPU_NODE_LABELS
    assert group["nodeRepairConfig"] == {"enabled": True}


def test_the_stack_places_its_nodes_in_its_own_cluster_placement_group(eks_stack):
    group = eks_stack.one("ec2.PlacementGroup", "-eks-gpu")
    assert group.inputs["strategy"] == "cluster"
    assert gpu_template(eks_stack).inputs["placement"] == {"groupName": group.name}


def test_an_on_demand_reservation_launches_into_its_own_placement_group(variant):
    odcr = variant(
        "eks-dev",
        **{
            "trainstack:capacityReservationId": RESERVATION,
            "trainstack:reservationPlacementGroup": "odcr-group",
        },
    )
    template = gpu_template(odcr).inputs
    assert template["placement"] == {"groupName": "odcr-group"}
    assert template["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": RESERVATION}
    }
    assert odcr.all("ec2.PlacementGroup") == [] and gpu_nodes(odcr).inputs["capacityType"] == "ON_DEMAND"


def test_a_capacity_block_needs_the_capacity_block_type_and_market(variant):
    block = variant(
        "eks-dev", **{"trainstack:capacityReservationId": RESERVATION, "trainstack:capacityBlock": True}
    )
    template = gpu_template(block).inputs
    assert template["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert "placement" not in template  # a Capacity Block places its instances itself
    assert gpu_nodes(block).inputs["capacityType"] == "CAPACITY_BLOCK"


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
    entries = eks_stack.all("eks.AccessEntry")
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
    assert outputs["efa_devices_per_node"] == efa_devices(gpu_template(eks_stack).inputs["networkInterfaces"])
    assert outputs["eks_cluster_ca"] == eks_stack.one("eks.Cluster").outputs["certificateAuthority"]["data"]
    assert outputs["eks_cluster_endpoint"].startswith("https://")


def test_no_batch_resources_on_an_eks_stack(eks_stack):
    assert [r.type for r in eks_stack.plan.resources if r.type.startswith("aws:batch/")] == []


@pytest.mark.parametrize("name", ["p4d.24xlarge", "p5.48xlarge", "p5en.48xlarge"])
def test_efa_devices_come_from_the_catalog(name):
    assert (
        efa_devices(eks_network_interfaces(INSTANCE_TYPES[name], [])) == INSTANCE_TYPES[name].efa_interfaces
    )
