"""GPU nodes that follow admitted work on EKS: Karpenter's EC2NodeClass, NodePool and NodeOverlay, and its IAM.

Pure functions of the stack config (and the ids Pulumi resolves), so tests, the policy pack and
`infra.k8s_validate` check exactly what the stack sends (the Karpenter 1.14.1 CRDs are pinned in infra/crds/):

- EC2NodeClass: the EFA layout of the EC2 and EKS guides (infra/eks.py `eks_network_interfaces`: ENA primary, one
  `efa-only` per EFA card), the stack's cluster placement group (or the reservation's), the reservation itself, the
  cluster and EFA security groups, the first zone's subnet, IMDSv2 with hop limit 1, the root volume under the stack
  key (Karpenter concepts/nodeclasses.md: `networkInterfaces`, `placementGroupSelector`,
  `capacityReservationSelectorTerms`, `metadataOptions`, `blockDeviceMappings`);
- NodePool: the stack's instance type in the first zone, at most `nodeCount` nodes (`limits` on GPUs), tainted for
  GPU pods only, never expired, removed once empty (`WhenEmpty`), never replaced for drift while it runs a job;
- NodeOverlay: the 2 MiB hugepages the EFA driver pre-allocates, which Karpenter's instance data lacks, so that it
  launches a node for a pod that asks for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infra.config import StackConfig
from infra.iam import KARPENTER_DISCOVERY_ACTIONS
from infra.k8s_versions import (
    KARPENTER_API_VERSION,
    KARPENTER_AWS_API_VERSION,
    KARPENTER_OVERLAY_API_VERSION,
)
from trainer.contract.gpu_nodes import GPU_NODE_TAINT

NODE_CLASS = "gpu"
NODE_POOL = "gpu"
# The controller's service account (the chart's default name, in the namespace the getting-started guide installs
# it to): its Pod Identity association names it.
SERVICE_ACCOUNT = ("kube-system", "karpenter")
# Well-known labels (Karpenter concepts/scheduling.md; Kubernetes well-known labels).
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
GPU_RESOURCE = "nvidia.com/gpu"
HUGEPAGES_RESOURCE = "hugepages-2Mi"
# "Amazon EC2 instances with the EFA driver installed pre-allocate 5128 2MiB Huge Pages" (EKS user guide,
# ml/node-efa.adoc); the EKS-optimized AL2023 accelerated AMIs carry the EFA driver (EKS user guide,
# "Manage EFA devices on Amazon EKS"), so their nodes report this much `hugepages-2Mi`.
HUGEPAGES_PER_NODE_MIB = 5128 * 2
# Removed this long after its last pod leaves: long enough for the next run of a sweep to reuse it.
CONSOLIDATE_AFTER = "5m"
# The AL2023 EKS-optimized AMI family; for GPU instance types Karpenter picks its NVIDIA variant (Karpenter
# concepts/nodeclasses.md, `amiSelectorTerms` alias).
AMI_ALIAS = "al2023@latest"
ROOT_DEVICE = "/dev/xvda"


def node_interfaces(interfaces: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The launch template's interface layout (infra/eks.py) in the EC2NodeClass's terms."""
    return [
        {
            "networkCardIndex": i["network_card_index"],
            "deviceIndex": i["device_index"],
            "interfaceType": i["interface_type"],
        }
        for i in interfaces
    ]


def ec2_node_class(
    cfg: StackConfig,
    interfaces: Sequence[Mapping[str, Any]],
    *,
    role: str,
    subnet_id: str,
    security_group_ids: list[str],
    placement_group: str | None,
    key_arn: str,
) -> dict[str, Any]:
    """How Karpenter launches a GPU node: the stack's EFA template, placement, reservation, groups, key."""
    spec: dict[str, Any] = {
        "role": role,
        "amiSelectorTerms": [{"alias": AMI_ALIAS}],
        "subnetSelectorTerms": [{"id": subnet_id}],
        "securityGroupSelectorTerms": [{"id": group} for group in security_group_ids],
        # Static interfaces (Karpenter >= 1.11): exactly the catalog's EFA devices, one pod IP on card 0.
        "networkInterfaces": node_interfaces(interfaces),
        "metadataOptions": {
            "httpEndpoint": "enabled",
            "httpTokens": "required",
            # One hop: pods cannot reach the node's credentials (as the node groups' templates, infra/eks.py).
            "httpPutResponseHopLimit": 1,
        },
        "blockDeviceMappings": [
            {
                "deviceName": ROOT_DEVICE,
                "rootVolume": True,
                "ebs": {
                    "volumeSize": f"{cfg.root_volume_gib}Gi",
                    "volumeType": "gp3",
                    "encrypted": True,
                    "kmsKeyID": key_arn,
                    "deleteOnTermination": True,
                },
            }
        ],
        "tags": dict(cfg.tags),
    }
    # One placement group per node class: every node of every job lands in it (Karpenter concepts/nodeclasses.md,
    # spec.placementGroupSelector: "all instances launched from that EC2NodeClass are placed into the resolved
    # placement group"). An ODCR made in a cluster placement group launches only into that group.
    group = cfg.reservation_placement_group or placement_group
    if group is not None:
        spec["placementGroupSelector"] = {"name": group}
    if cfg.capacity_reservation_id is not None:
        # Every reservation Karpenter may use must be selected (Karpenter tasks/odcrs.md).
        spec["capacityReservationSelectorTerms"] = [{"id": cfg.capacity_reservation_id}]
    return {
        "apiVersion": KARPENTER_AWS_API_VERSION,
        "kind": "EC2NodeClass",
        "metadata": {"name": NODE_CLASS},
        "spec": spec,
    }


def capacity_types(cfg: StackConfig) -> list[str]:
    """`reserved` for a stack on an On-Demand Capacity Reservation (only its instances), else `on-demand`."""
    return ["reserved"] if cfg.capacity_reservation_id is not None else ["on-demand"]


def node_pool(cfg: StackConfig, labels: dict[str, str]) -> dict[str, Any]:
    """The stack's GPU nodes, made for pending pods that fit them and removed when empty."""
    return {
        "apiVersion": KARPENTER_API_VERSION,
        "kind": "NodePool",
        "metadata": {"name": NODE_POOL},
        "spec": {
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "nodeClassRef": {
                        "group": KARPENTER_AWS_API_VERSION.split("/")[0],
                        "kind": "EC2NodeClass",
                        "name": NODE_CLASS,
                    },
                    "requirements": [
                        {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": [cfg.instance_type]},
                        {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": capacity_types(cfg)},
                        # The placement group's and the file system's zone.
                        {"key": ZONE_LABEL, "operator": "In", "values": [cfg.cluster_availability_zone]},
                    ],
                    "taints": [dict(GPU_NODE_TAINT)],
                    # A node is never expired under a running job (the default is 720h: Karpenter
                    # concepts/nodepools.md, spec.template.spec.expireAfter).
                    "expireAfter": "Never",
                },
            },
            # The most GPUs the pool may hold: `nodeCount` nodes, what the Kueue quota admits at once.
            "limits": {GPU_RESOURCE: cfg.node_count * cfg.instance.gpus},
            "disruption": {
                "consolidationPolicy": "WhenEmpty",
                "consolidateAfter": CONSOLIDATE_AFTER,
                # No node replaced for drift (an AMI release) while it runs a job: a budget of 0 nodes for the
                # reason Drifted (Karpenter concepts/disruption.md, budgets `reasons`); empty nodes still go.
                "budgets": [{"nodes": "0", "reasons": ["Drifted"]}],
            },
        },
    }


def node_overlay(cfg: StackConfig) -> dict[str, Any]:
    """The hugepages the stack's GPU nodes will report, added to Karpenter's view of the instance type
    (Karpenter concepts/nodeoverlays.md, spec.capacity: extended resources added to matching instance types;
    alpha, behind the NodeOverlay feature gate)."""
    return {
        "apiVersion": KARPENTER_OVERLAY_API_VERSION,
        "kind": "NodeOverlay",
        "metadata": {"name": f"{NODE_POOL}-hugepages"},
        "spec": {
            "requirements": [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": [cfg.instance_type]}],
            "capacity": {HUGEPAGES_RESOURCE: f"{HUGEPAGES_PER_NODE_MIB}Mi"},
        },
    }


def chart_values(cluster_name: str, region: str, interruption_queue: str) -> dict[str, Any]:
    """The Karpenter release's values (charts/karpenter/values.yaml at v1.14.1): the cluster, its interruption queue
    (`settings.interruptionQueue`: "Interruption handling is disabled if not specified"), the feature gates, and the
    Region. The controller takes its Region from AWS_REGION, else from IMDS, and exits when neither answers
    (v1.14.1 pkg/operator/operator.go); IMDS is out of a pod's reach at hop limit 1, and the AWS_REGION Pod Identity
    sets comes only with a pod created after the association (EKS API, CreatePodIdentityAssociation: "Amazon EKS
    sets environment variables in the containers of the pod"), so the Region is set here (`controller.env`, the
    chart's own example is AWS_REGION) and the release also waits for the association (infra/cluster_software.py)."""
    return {
        "settings": {
            "clusterName": cluster_name,
            "interruptionQueue": interruption_queue,
            "featureGates": {"nodeOverlay": True, "reservedCapacity": True},
        },
        "controller": {"env": [{"name": "AWS_REGION", "value": region}]},
    }


# What EBS does with the key of an encrypted root volume for the principal that launches the instance: with
# CreateFleet (type instant) that is Karpenter's controller, not a service-linked role (Karpenter troubleshooting,
# "Node terminates before ready on failed encrypted EBS volume", website/content/en/v1.14/troubleshooting.md: the
# key used through EC2, `kms:ViaService` ec2.<region>; EBS User Guide, "How EBS encryption works": EBS sends
# GenerateDataKeyWithoutPlaintext and CreateGrant, Decrypt when the volume is attached, ReEncrypt* for a snapshot
# under another key). The key policy delegates these to IAM (infra/keys.py UseThroughStackServices).
ROOT_VOLUME_KEY_ACTIONS = (
    "kms:DescribeKey",
    "kms:Decrypt",
    "kms:GenerateDataKeyWithoutPlaintext",
    "kms:ReEncrypt*",
)


def controller_statements(
    cluster_name: str, region: str, account: str, node_role_arn: str, key_arn: str
) -> list[dict[str, Any]]:
    """The controller's permissions, as Karpenter's own CloudFormation at v1.14.1 grants them
    (website/content/en/docs/getting-started/getting-started-with-karpenter/cloudformation.yaml: NodeLifecycle,
    IAMIntegration, EKSIntegration and ResourceDiscovery policies; no interruption queue, no zonal shift), and the
    stack key for the GPU nodes' encrypted root volumes, only through EC2."""
    through_ec2 = {"kms:ViaService": f"ec2.{region}.amazonaws.com", "kms:CallerAccount": account}
    ec2 = f"arn:aws:ec2:{region}"
    owned = {f"aws:ResourceTag/kubernetes.io/cluster/{cluster_name}": "owned"}
    request_owned = {
        f"aws:RequestTag/kubernetes.io/cluster/{cluster_name}": "owned",
        "aws:RequestTag/eks:eks-cluster-name": cluster_name,
    }
    launched = [
        f"{ec2}:*:{kind}/*"
        for kind in (
            "fleet",
            "instance",
            "volume",
            "network-interface",
            "launch-template",
            "spot-instances-request",
        )
    ]
    profile = f"arn:aws:iam::{account}:instance-profile/*"
    return [
        {
            "Sid": "AllowScopedEC2InstanceAccessActions",
            "Effect": "Allow",
            "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
            "Resource": [
                f"{ec2}::image/*",
                f"{ec2}::snapshot/*",
                f"{ec2}:*:security-group/*",
                f"{ec2}:*:subnet/*",
                f"{ec2}:*:capacity-reservation/*",
                f"{ec2}:*:placement-group/*",
            ],
        },
        {
            "Sid": "AllowScopedEC2LaunchTemplateAccessActions",
            "Effect": "Allow",
            "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
            "Resource": [f"{ec2}:*:launch-template/*"],
            "Condition": {
                "StringEquals": owned,
                "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
            },
        },
        {
            "Sid": "AllowScopedEC2InstanceActionsWithTags",
            "Effect": "Allow",
            "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"],
            "Resource": launched,
            "Condition": {
                "StringEquals": request_owned,
                "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"},
            },
        },
        {
            "Sid": "AllowScopedResourceCreationTagging",
            "Effect": "Allow",
            "Action": ["ec2:CreateTags"],
            "Resource": launched,
            "Condition": {
                "StringEquals": {
                    **request_owned,
                    "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"],
                },
                "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"},
            },
        },
        {
            "Sid": "AllowScopedResourceTagging",
            "Effect": "Allow",
            "Action": ["ec2:CreateTags"],
            "Resource": [f"{ec2}:*:instance/*"],
            "Condition": {
                "StringEquals": owned,
                "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
                "StringEqualsIfExists": {"aws:RequestTag/eks:eks-cluster-name": cluster_name},
                "ForAllValues:StringEquals": {
                    "aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim", "Name"]
                },
            },
        },
        {
            "Sid": "AllowScopedDeletion",
            "Effect": "Allow",
            "Action": ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
            "Resource": [f"{ec2}:*:instance/*", f"{ec2}:*:launch-template/*"],
            "Condition": {
                "StringEquals": owned,
                "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
            },
        },
        {
            "Sid": "AllowPassingInstanceRole",
            "Effect": "Allow",
            "Action": ["iam:PassRole"],
            "Resource": [node_role_arn],
            "Condition": {"StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com"]}},
        },
        {
            "Sid": "AllowScopedInstanceProfileCreationActions",
            "Effect": "Allow",
            "Action": ["iam:CreateInstanceProfile"],
            "Resource": [profile],
            "Condition": {
                "StringEquals": {**request_owned, "aws:RequestTag/topology.kubernetes.io/region": region},
                "StringLike": {"aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"},
            },
        },
        {
            "Sid": "AllowScopedInstanceProfileTagActions",
            "Effect": "Allow",
            "Action": ["iam:TagInstanceProfile"],
            "Resource": [profile],
            "Condition": {
                "StringEquals": {
                    **owned,
                    "aws:ResourceTag/topology.kubernetes.io/region": region,
                    **request_owned,
                    "aws:RequestTag/topology.kubernetes.io/region": region,
                },
                "StringLike": {
                    "aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*",
                    "aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*",
                },
            },
        },
        {
            "Sid": "AllowScopedInstanceProfileActions",
            "Effect": "Allow",
            "Action": [
                "iam:AddRoleToInstanceProfile",
                "iam:RemoveRoleFromInstanceProfile",
                "iam:DeleteInstanceProfile",
            ],
            "Resource": [profile],
            "Condition": {
                "StringEquals": {**owned, "aws:ResourceTag/topology.kubernetes.io/region": region},
                "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*"},
            },
        },
        {
            "Sid": "AllowAPIServerEndpointDiscovery",
            "Effect": "Allow",
            "Action": ["eks:DescribeCluster"],
            "Resource": [f"arn:aws:eks:{region}:{account}:cluster/{cluster_name}"],
        },
        {
            "Sid": "AllowRegionalReadActions",
            "Effect": "Allow",
            "Action": list(KARPENTER_DISCOVERY_ACTIONS),
            "Resource": ["*"],
            "Condition": {"StringEquals": {"aws:RequestedRegion": region}},
        },
        {
            "Sid": "AllowSSMReadActions",
            "Effect": "Allow",
            "Action": ["ssm:GetParameter"],
            "Resource": [f"arn:aws:ssm:{region}::parameter/aws/service/*"],
        },
        {
            "Sid": "AllowPricingReadActions",
            "Effect": "Allow",
            "Action": ["pricing:GetProducts"],
            "Resource": ["*"],
        },
        {
            "Sid": "AllowUnscopedInstanceProfileListAction",
            "Effect": "Allow",
            "Action": ["iam:ListInstanceProfiles"],
            "Resource": ["*"],
        },
        {
            "Sid": "AllowInstanceProfileReadActions",
            "Effect": "Allow",
            "Action": ["iam:GetInstanceProfile"],
            "Resource": [profile],
        },
        {
            "Sid": "AllowRootVolumeKeyThroughEC2",
            "Effect": "Allow",
            "Action": list(ROOT_VOLUME_KEY_ACTIONS),
            "Resource": [key_arn],
            "Condition": {"StringEquals": through_ec2},
        },
        # The volume's grant, only for an AWS resource (AWS KMS developer guide, "kms:GrantIsForAWSResource").
        {
            "Sid": "AllowRootVolumeGrantThroughEC2",
            "Effect": "Allow",
            "Action": ["kms:CreateGrant"],
            "Resource": [key_arn],
            "Condition": {"StringEquals": through_ec2, "Bool": {"kms:GrantIsForAWSResource": "true"}},
        },
    ]
