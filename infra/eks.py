"""The GPU cluster on EKS (`trainstack:orchestrator: eks`): control plane, access, nodes on the stack's EFA template.

Plain pulumi-aws `aws.eks.*` resources, so every input is visible under the project's mocks (pulumi-eks components
are not; docs/eks.md). What differs from the Batch launch template, and why:

- interfaces: the layout the EC2 and EKS guides prescribe for EFA nodes: an ENA primary on card 0 (an `efa-only`
  interface cannot be primary), `efa-only` at device 1 of card 0 and device 0 of every other card; as many EFA
  devices as the catalog's `efa_interfaces` (32 on p5, 4 on p4d), the VPC CNI keeps pod IPs on card 0;
- no subnet on the interfaces and no instance-initiated shutdown behaviour: a managed node group refuses both
  ("Customize managed nodes with launch templates", EKS user guide); no user data: the AL2023 EKS AMI joins by
  itself (nodeadm) and pods mount FSx through the CSI driver, not the host;
- the interfaces carry the cluster security group beside the EFA group: EKS adds it only when the template names
  no groups, and nodes without it cannot reach the control plane (same guide);
- GPU nodes on demand or from an On-Demand Capacity Reservation come from Karpenter (infra/karpenter.py): none while
  no job runs; this component gives its controller and nodes their IAM roles and the nodes their access entry;
- a Capacity Block, paid for its whole window whatever runs, gets a managed node group on the launch template the
  EKS user guide prescribes ("Create a managed node group with Capacity Blocks for ML": market type
  `capacity-block`, the reservation, and `InstanceType` in the template, so none on the node group), capacity type
  CAPACITY_BLOCK; placement group and reservation exactly as the Batch path validates them (infra/config.py);
- a small system node group for the controllers (CoreDNS, Kueue, JobSet, Karpenter), so that the queue takes jobs
  while no GPU node exists;
- the control plane's `audit` and `authenticator` logs to CloudWatch Logs under the stack key and retention
  (Security Hub control EKS.8);
- each role's policy attachments exist before the cluster and node groups that use them and go after them (pulumi-aws
  `eks.Cluster` / `eks.NodeGroup` docs: "Ensure that the IAM Role permissions are created before and deleted
  after", or EKS cannot delete the instances and network interfaces it made).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_aws as aws

from infra import eks_access, karpenter, karpenter_interruption
from infra.cluster import IMDS_HOP_LIMIT, efa_security_group, main_purchase_option, root_volume
from infra.config import StackConfig
from infra.iam import allow, policy_document, policy_text
from infra.k8s_versions import EKS_ADDONS, KUBERNETES_MINOR, OBSERVABILITY
from infra.keys import EKS_CLUSTER_ROLE_KEY_ACTIONS
from trainer.contract.catalog import InstanceType
from trainer.contract.gpu_nodes import GPU_NODE_TAINT

if TYPE_CHECKING:
    from infra.keys import Keys
    from infra.lustre import Lustre
    from infra.network import Network

# EKS-optimized Amazon Linux 2023 AMIs: the NVIDIA one for GPU nodes (drivers and the EFA host components in it,
# "Use EKS-optimized accelerated AMIs for GPU instances"), the standard one for the system nodes.
GPU_AMI_TYPE = "AL2023_x86_64_NVIDIA"
SYSTEM_AMI_TYPE = "AL2023_x86_64_STANDARD"
# Two small nodes for the controllers: a CoreDNS and webhook replica each survive one node's loss.
SYSTEM_INSTANCE_TYPE = "m7i.large"
SYSTEM_NODE_COUNT = 2
# Labels the device plugins select the GPU nodes by (infra/cluster_software.py): the EFA plugin's chart examples use
# the first (aws/eks-charts stable/aws-efa-k8s-device-plugin README, `nodeSelector`), NVIDIA's feature discovery
# the second.
GPU_NODE_LABELS = {"vpc.amazonaws.com/efa.present": "true", "nvidia.com/gpu.present": "true"}
# The AWS-managed policies the EKS user guide prescribes for the cluster role ("Amazon EKS cluster IAM role") and the
# node role ("Amazon EKS node IAM role"), and the CloudWatch agent's ("Install the CloudWatch agent with the Amazon
# CloudWatch Observability EKS add-on").
AWS_MANAGED_POLICIES = "arn:aws:iam::aws:policy"
CLUSTER_ROLE_POLICIES = (f"{AWS_MANAGED_POLICIES}/AmazonEKSClusterPolicy",)
NODE_ROLE_POLICIES = (
    f"{AWS_MANAGED_POLICIES}/AmazonEKSWorkerNodePolicy",
    f"{AWS_MANAGED_POLICIES}/AmazonEKS_CNI_Policy",
    f"{AWS_MANAGED_POLICIES}/AmazonEC2ContainerRegistryReadOnly",
)
CLOUDWATCH_AGENT_POLICY = f"{AWS_MANAGED_POLICIES}/CloudWatchAgentServerPolicy"
OBSERVABILITY_ADDON = OBSERVABILITY.name
# Service accounts the add-ons run as (their pod identities): the FSx CSI controller (kubernetes-sigs/aws-fsx-csi-driver
# charts/aws-fsx-csi-driver values.yaml `controller.serviceAccount.name`) and the CloudWatch agent.
POD_IDENTITIES = {
    "aws-fsx-csi-driver": ("kube-system", "fsx-csi-controller-sa"),
    OBSERVABILITY_ADDON: ("amazon-cloudwatch", "cloudwatch-agent"),
}
# Pod Identity's trust: the EKS Pod Identity service principal assumes and tags (EKS user guide, "Create IAM role
# with trust policy required by EKS Pod Identity").
POD_IDENTITY_PRINCIPAL = "pods.eks.amazonaws.com"
# The control plane logs the stack sends to CloudWatch: the API server's audit log (Security Hub EKS.8, "EKS clusters
# should have audit logging enabled") and the IAM authenticator's, which maps AWS principals to Kubernetes users
# (EKS user guide, "Send control plane logs to CloudWatch Logs": api, audit, authenticator, controllerManager,
# scheduler; all off by default).
CONTROL_PLANE_LOG_TYPES = ("audit", "authenticator")
# Karpenter's nodes join through an access entry of this type on their role (EKS user guide, "Create access entries":
# EC2_LINUX for self-managed and Karpenter nodes; managed node groups get theirs from EKS).
NODE_ACCESS_ENTRY_TYPE = "EC2_LINUX"
# The Karpenter node role's AWS-managed policies (its CloudFormation at v1.14.1, KarpenterNodeRole, without SSM).
KARPENTER_NODE_POLICIES = (
    f"{AWS_MANAGED_POLICIES}/AmazonEKSWorkerNodePolicy",
    f"{AWS_MANAGED_POLICIES}/AmazonEKS_CNI_Policy",
    f"{AWS_MANAGED_POLICIES}/AmazonEC2ContainerRegistryPullOnly",
)


def eks_network_interfaces(
    instance: InstanceType, security_group_ids: list[Any]
) -> list[aws.ec2.LaunchTemplateNetworkInterfaceArgsDict]:
    """ENA primary on card 0, then one `efa-only` interface per EFA card: device 1 on card 0, device 0 elsewhere.

    The layout of the EC2 user guide ("Maximize network bandwidth on accelerated instances": an EFA-only interface
    cannot be the primary) that the EKS guide's EFA node groups use ("Run machine learning training on Amazon EKS with
    Elastic Fabric Adapter"); one EFA device per card as in the catalog. No subnet (node groups refuse one)."""
    common: aws.ec2.LaunchTemplateNetworkInterfaceArgsDict = {
        "security_groups": security_group_ids,
        "delete_on_termination": "true",
    }
    primary: aws.ec2.LaunchTemplateNetworkInterfaceArgsDict = {
        **common,
        "network_card_index": 0,
        "device_index": 0,
        "interface_type": "interface",
        "associate_public_ip_address": "false",
    }
    efa_only: list[aws.ec2.LaunchTemplateNetworkInterfaceArgsDict] = [
        {
            **common,
            "network_card_index": card,
            "device_index": 1 if card == 0 else 0,
            "interface_type": "efa-only",
        }
        for card in range(instance.efa_interfaces)
    ]
    return [primary, *efa_only]


def efa_devices(interfaces: Sequence[Mapping[str, Any]]) -> int:
    """EFA devices a node gets from a template's interfaces (camelCase or snake_case keys): `efa` and `efa-only`."""
    return sum(
        1 for i in interfaces if (i.get("interfaceType") or i.get("interface_type")) in ("efa", "efa-only")
    )


@dataclass
class EksArgs:
    config: StackConfig
    account_id: pulumi.Input[str]
    network: Network
    keys: Keys
    lustre: Lustre


class Eks(pulumi.ComponentResource):
    """EKS control plane (API access entries, secrets under the stack key), GPU and system node groups, add-ons."""

    def __init__(self, name: str, args: EksArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainstack:eks:Eks", name, None, opts)
        cfg, child = args.config, pulumi.ResourceOptions(parent=self)
        prefix = cfg.name_prefix
        # Each role's attachments, which whatever uses the role depends on (created before, deleted after).
        self._grants: dict[int, list[pulumi.Resource]] = {}

        # The control plane's log group, before the cluster writes to it (else EKS creates it with no key and no
        # retention).
        self.control_plane_logs = aws.cloudwatch.LogGroup(
            f"{prefix}-eks-control-plane",
            name=cfg.eks_log_group,
            retention_in_days=cfg.log_retention_days,
            kms_key_id=args.keys.key.arn,
            opts=child,
        )
        cluster_role = self._service_role(
            cfg.eks_cluster_role,
            "eks.amazonaws.com",
            "EKS control plane",
            CLUSTER_ROLE_POLICIES,
            # Envelope encryption of Secrets with the stack key (EKS user guide, "Encrypt Kubernetes secrets with
            # KMS on existing clusters": the cluster role needs these on the key); the key policy allows the same
            # to this role by name (infra/keys.py EKS_CLUSTER_ROLE_KEY_ACTIONS), since the role calls KMS itself.
            allow("EncryptSecretsWithStackKey", list(EKS_CLUSTER_ROLE_KEY_ACTIONS), [args.keys.key.arn]),
        )
        public = bool(cfg.eks_public_access_cidrs)
        self.cluster = aws.eks.Cluster(
            f"{prefix}-eks",
            name=cfg.eks_cluster_name,
            version=KUBERNETES_MINOR,
            role_arn=cluster_role.arn,
            vpc_config={
                "subnet_ids": [s.id for s in args.network.private_subnets],
                "endpoint_private_access": True,
                # Private unless the stack names the ranges that may reach the API (docs/eks.md#endpoint).
                "endpoint_public_access": public,
                "public_access_cidrs": cfg.eks_public_access_cidrs if public else None,
            },
            # Access entries only (no aws-auth ConfigMap), and no silent admin for whoever runs `pulumi up`.
            access_config={
                "authentication_mode": "API",
                "bootstrap_cluster_creator_admin_permissions": False,
            },
            encryption_config={"provider": {"key_arn": args.keys.key.arn}, "resources": ["secrets"]},
            enabled_cluster_log_types=list(CONTROL_PLANE_LOG_TYPES),
            # The networking add-ons come as EKS add-ons below, not as unmanaged manifests.
            bootstrap_self_managed_addons=False,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[self.control_plane_logs, *self._granted(cluster_role)]
            ),
        )
        # The admins' access, which the Kubernetes provider depends on, and the deployer checked to be an admin.
        self.admin_access = eks_access.admin_access(cfg, self.cluster, self)
        self.deployer = eks_access.deployer(cfg, self)

        node_role = self._service_role(
            f"{prefix}-eks-node", "ec2.amazonaws.com", "EKS nodes", NODE_ROLE_POLICIES
        )
        node_grants = self._granted(node_role)
        self.security_group = efa_security_group(cfg, args.network, args.lustre, child)
        cluster_group = self.cluster.vpc_config.cluster_security_group_id
        self.gpu_security_groups = [cluster_group, self.security_group.id]
        self.placement_group = (
            aws.ec2.PlacementGroup(f"{prefix}-eks-gpu", strategy="cluster", opts=child)
            if cfg.creates_placement_group
            else None
        )
        network_addons = [
            self._addon(cfg, name) for name in ("vpc-cni", "kube-proxy", "eks-pod-identity-agent")
        ]
        self.system_nodes = aws.eks.NodeGroup(
            f"{prefix}-eks-system",
            cluster_name=self.cluster.name,
            node_role_arn=node_role.arn,
            subnet_ids=[s.id for s in args.network.private_subnets],
            ami_type=SYSTEM_AMI_TYPE,
            capacity_type="ON_DEMAND",
            instance_types=[SYSTEM_INSTANCE_TYPE],
            scaling_config={"min_size": SYSTEM_NODE_COUNT, "desired_size": SYSTEM_NODE_COUNT, "max_size": 3},
            launch_template=self._template_version(self._system_launch_template(cfg, args)),
            node_repair_config={"enabled": True},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*network_addons, *node_grants]),
        )
        self.launch_template: aws.ec2.LaunchTemplate | None = None
        self.gpu_nodes: aws.eks.NodeGroup | None = None
        if cfg.capacity_block:
            # The EKS API spells NoSchedule NO_SCHEDULE (CreateNodegroup Taint.effect).
            gpu_taint: aws.eks.NodeGroupTaintArgsDict = {
                "key": GPU_NODE_TAINT["key"],
                "value": GPU_NODE_TAINT["value"],
                "effect": "NO_SCHEDULE",
            }
            self.launch_template = self._gpu_launch_template(cfg, args, self.gpu_security_groups)
            self.gpu_nodes = aws.eks.NodeGroup(
                f"{prefix}-eks-gpu",
                cluster_name=self.cluster.name,
                node_role_arn=node_role.arn,
                subnet_ids=[
                    args.network.cluster_subnet.id
                ],  # one zone: the placement group's and the file system's
                ami_type=GPU_AMI_TYPE,
                capacity_type="CAPACITY_BLOCK",
                # No instance types: the template names the block's (same guide; a node group takes them from
                # one place only, "Customize managed nodes with launch templates").
                # The block is paid for its whole window; EKS scales the group down before it ends.
                scaling_config={"min_size": 0, "desired_size": cfg.node_count, "max_size": cfg.node_count},
                launch_template=self._template_version(self.launch_template),
                labels=GPU_NODE_LABELS,
                taints=[gpu_taint],
                # Node auto repair acts on the node monitoring agent's conditions (EKS user guide, "Enable node auto
                # repair and investigate node health issues").
                node_repair_config={"enabled": True},
                update_config={"max_unavailable": 1},
                opts=pulumi.ResourceOptions(parent=self, depends_on=[*network_addons, *node_grants]),
            )
        else:
            self._karpenter_identity(cfg, args)
        on_nodes: list[pulumi.Resource] = [self.system_nodes]
        self.addons: dict[str, aws.eks.Addon] = dict(
            zip(("vpc-cni", "kube-proxy", "eks-pod-identity-agent"), network_addons, strict=True)
        )
        for name in ("coredns", "eks-node-monitoring-agent"):
            self.addons[name] = self._addon(cfg, name, depends_on=on_nodes)
        self.addons["aws-fsx-csi-driver"] = self._addon(
            cfg,
            "aws-fsx-csi-driver",
            # Static volumes only: the controller looks up the stack's file system and creates none.
            role=self._pod_role(
                cfg,
                "aws-fsx-csi-driver",
                allow("DescribeStackFileSystem", ["fsx:DescribeFileSystems"], [args.lustre.file_system.arn]),
            ),
            depends_on=on_nodes,
        )
        self.addons[OBSERVABILITY_ADDON] = self._addon(
            cfg, OBSERVABILITY_ADDON, role=self._pod_role(cfg, OBSERVABILITY_ADDON), depends_on=on_nodes
        )
        assert set(self.addons) == {addon.name for addon in EKS_ADDONS}, (
            "infra/k8s_versions.py lists the add-ons"
        )
        # Container Insights writes here (CloudWatch user guide, "Send logs to CloudWatch Logs" for the add-on's
        # Fluent Bit: /aws/containerinsights/<cluster>/application and /performance); created first so that the
        # stack's key and retention apply, not the agent's defaults.
        self.log_groups = {
            kind: aws.cloudwatch.LogGroup(
                f"{prefix}-containerinsights-{kind}",
                name=container_insights_log_group(cfg, kind),
                retention_in_days=cfg.log_retention_days,
                kms_key_id=args.keys.key.arn,
                opts=child,
            )
            for kind in ("application", "performance")
        }
        self.outputs = {
            "eks_cluster_name": self.cluster.name,
            "eks_cluster_endpoint": self.cluster.endpoint,
            "eks_cluster_ca": self.cluster.certificate_authority.apply(lambda ca: ca["data"] if ca else None),
            "efa_devices_per_node": efa_devices(eks_network_interfaces(cfg.instance, [])),
            "log_group": self.log_groups["application"].name,
            "purchase_option": main_purchase_option(cfg),  # EKS_PRICING_OUTPUTS: for the JobSets' ledgers
        }
        # What the cluster's software needs to make GPU nodes (infra/cluster_software.py), not stack outputs.
        self.gpu_subnet_id = args.network.cluster_subnet.id
        self.key_arn = args.keys.key.arn
        self.register_outputs(self.outputs)

    def _service_role(
        self,
        name: str,
        service: str,
        description: str,
        managed: tuple[str, ...],
        *statements: dict[str, Any],
    ) -> aws.iam.Role:
        """A role an AWS service assumes, with the AWS-managed policies EKS prescribes and our inline statements."""
        child = pulumi.ResourceOptions(parent=self)
        trust = policy_document(
            {
                "Effect": "Allow",
                "Principal": {"Service": service},
                "Action": ["sts:AssumeRole", "sts:TagSession"]
                if service != "ec2.amazonaws.com"
                else "sts:AssumeRole",
            }
        )
        role = aws.iam.Role(name, assume_role_policy=trust, description=description, opts=child)
        grants: list[pulumi.Resource] = [
            aws.iam.RolePolicyAttachment(
                f"{name}-{policy_arn.rsplit('/', 1)[1]}", role=role.name, policy_arn=policy_arn, opts=child
            )
            for policy_arn in managed
        ]
        if statements:
            grants.append(
                aws.iam.RolePolicy(name, role=role.id, policy=policy_document(*statements), opts=child)
            )
        self._grants[id(role)] = grants
        return role

    def _granted(self, role: aws.iam.Role) -> list[pulumi.Resource]:
        """The attachments and inline policy of a role this component made."""
        return self._grants[id(role)]

    def _karpenter_identity(self, cfg: StackConfig, args: EksArgs) -> None:
        """Karpenter's controller role (Pod Identity, its CloudFormation's permissions) and its nodes' role, which
        joins the cluster through an EC2_LINUX access entry."""
        prefix = cfg.name_prefix
        self.karpenter_node_role = self._service_role(
            f"{prefix}-karpenter-node",
            "ec2.amazonaws.com",
            "EKS GPU nodes (Karpenter)",
            KARPENTER_NODE_POLICIES,
        )
        self.karpenter_node_access = aws.eks.AccessEntry(
            f"{prefix}-karpenter-node",
            cluster_name=self.cluster.name,
            principal_arn=self.karpenter_node_role.arn,
            type=NODE_ACCESS_ENTRY_TYPE,
            opts=pulumi.ResourceOptions(parent=self, depends_on=self._granted(self.karpenter_node_role)),
        )
        statements = pulumi.Output.all(
            args.account_id, self.karpenter_node_role.arn, args.keys.key.arn
        ).apply(
            lambda values: karpenter.controller_statements(
                cfg.eks_cluster_name, cfg.region, values[0], values[1], values[2]
            )
        )
        controller = self._service_role(
            f"{prefix}-karpenter", POD_IDENTITY_PRINCIPAL, "Karpenter controller", ()
        )
        policy = aws.iam.RolePolicy(
            f"{prefix}-karpenter",
            role=controller.id,
            policy=statements.apply(lambda s: policy_text(*s)),
            opts=pulumi.ResourceOptions(parent=self),
        )
        # Its interruption queue and the controller's grant on it (infra/karpenter_interruption.py).
        interruption = karpenter_interruption.interruption_queue(cfg, controller, self)
        namespace, service_account = karpenter.SERVICE_ACCOUNT
        self.karpenter_identity = aws.eks.PodIdentityAssociation(
            f"{prefix}-karpenter",
            cluster_name=self.cluster.name,
            namespace=namespace,
            service_account=service_account,
            role_arn=controller.arn,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[policy, *interruption]),
        )

    def _pod_role(self, cfg: StackConfig, addon: str, *statements: dict[str, Any]) -> aws.iam.Role:
        managed = (CLOUDWATCH_AGENT_POLICY,) if addon == OBSERVABILITY_ADDON else ()
        return self._service_role(
            f"{cfg.name_prefix}-{addon}", POD_IDENTITY_PRINCIPAL, f"EKS add-on {addon}", managed, *statements
        )

    def _addon(
        self,
        cfg: StackConfig,
        name: str,
        role: aws.iam.Role | None = None,
        depends_on: list[pulumi.Resource] | None = None,
    ) -> aws.eks.Addon:
        """An AWS-managed add-on at EKS's default version for the cluster's minor (policy/eks.py checks floors)."""
        identity: list[aws.eks.AddonPodIdentityAssociationArgsDict] | None = None
        if role is not None:
            _, service_account = POD_IDENTITIES[name]  # the add-on creates it in its own namespace
            identity = [{"role_arn": role.arn, "service_account": service_account}]
        return aws.eks.Addon(
            f"{cfg.name_prefix}-{name}",
            cluster_name=self.cluster.name,
            addon_name=name,
            pod_identity_associations=identity,
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            opts=pulumi.ResourceOptions(parent=self, depends_on=depends_on or []),
        )

    @staticmethod
    def _template_version(template: aws.ec2.LaunchTemplate) -> aws.eks.NodeGroupLaunchTemplateArgsDict:
        # A pinned version: a changed template rolls the nodes instead of drifting silently.
        return {"id": template.id, "version": template.latest_version.apply(str)}

    @staticmethod
    def _common_template(cfg: StackConfig, args: EksArgs) -> dict[str, Any]:
        return {
            "update_default_version": True,
            "metadata_options": {
                "http_endpoint": "enabled",
                "http_tokens": "required",  # IMDSv2 only
                # One hop: pods (a hop further, in their own network namespace) cannot reach the node's IMDS
                # (EKS best practices guide, "Restrict access to the instance profile assigned to the worker node").
                "http_put_response_hop_limit": IMDS_HOP_LIMIT,
            },
            "block_device_mappings": [root_volume(cfg, args.keys.key.arn)],
            "tag_specifications": [
                {"resource_type": kind, "tags": cfg.tags}
                for kind in ("instance", "volume", "network-interface")
            ],
        }

    def _system_launch_template(self, cfg: StackConfig, args: EksArgs) -> aws.ec2.LaunchTemplate:
        # No interfaces and no groups: EKS puts the cluster security group on the nodes.
        return aws.ec2.LaunchTemplate(
            f"{cfg.name_prefix}-eks-system",
            **self._common_template(cfg, args),
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _gpu_launch_template(
        self, cfg: StackConfig, args: EksArgs, security_group_ids: list[Any]
    ) -> aws.ec2.LaunchTemplate:
        extra: dict[str, Any] = {}
        if self.placement_group is not None:
            extra["placement"] = {"group_name": self.placement_group.name}
        elif cfg.reservation_placement_group is not None:
            # An ODCR made in a cluster placement group launches only into that group (EC2 user guide, "Capacity
            # Reservations for cluster placement groups"); a Capacity Block places its instances itself.
            extra["placement"] = {"group_name": cfg.reservation_placement_group}
        if cfg.capacity_reservation_id is not None:
            extra["capacity_reservation_specification"] = {
                "capacity_reservation_target": {"capacity_reservation_id": cfg.capacity_reservation_id}
            }
        if cfg.capacity_block:
            extra["instance_market_options"] = {"market_type": "capacity-block"}
            # "Set InstanceType to an instance type that supports Capacity Blocks" (EKS user guide, "Create a
            # managed node group with Capacity Blocks for ML", the launch template's required contents).
            extra["instance_type"] = cfg.instance_type
        return aws.ec2.LaunchTemplate(
            f"{cfg.name_prefix}-eks-gpu",
            network_interfaces=eks_network_interfaces(cfg.instance, security_group_ids),
            **self._common_template(cfg, args),
            **extra,
            opts=pulumi.ResourceOptions(parent=self),
        )


def container_insights_log_group(cfg: StackConfig, kind: str) -> str:
    """Where Container Insights puts a cluster's `application` logs and `performance` events."""
    return f"/aws/containerinsights/{cfg.eks_cluster_name}/{kind}"
