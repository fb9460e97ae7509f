"""EKS stacks: the cross-checks no anchor makes, between the catalog, the nodes, the queue and the job.

- EFA devices agree: a GPU node group's launch template attaches as many EFA devices as the catalog gives its
  instance type (one per network card: EC2 user guide, "Maximize network bandwidth on accelerated instances"), the
  Kueue ClusterQueue's quota holds whole nodes of them (a quota short of a whole job admits part of it and
  deadlocks: kubernetes-sigs/kueue issue 2796), and a JobSet's pod asks for exactly one node's devices.
- A JobSet's pods get more termination grace than the trainer's own stop grace: the kubelet sends SIGKILL when
  terminationGracePeriodSeconds ends (Kubernetes docs, "Pod Lifecycle", termination of pods), and the trainer's
  checkpoint-on-SIGTERM needs `TRAINSTACK_STOP_GRACE_SECONDS` of it.
- Charts and add-ons at or past the versions that fixed the known EFA bugs (infra/k8s_versions.py names each fix).
- GPU nodes from Karpenter follow the same agreement: the EC2NodeClass's EFA devices, the NodePool's limit in whole
  nodes, the Kueue quota (summed over a cohort) no larger than what the pool may start, so Kueue never admits a job
  Karpenter can start only part of.
- A Capacity Block node group names its instance type in the launch template and none itself (EKS user guide,
  "Create a managed node group with Capacity Blocks for ML").
- A cluster and its node groups depend on their roles' policy attachments (pulumi-aws `eks.Cluster` /
  `eks.NodeGroup` docs: permissions created before and deleted after, or EKS cannot delete what it made).
- The control plane's audit log goes to CloudWatch (Security Hub EKS.8).

The JobSet rules judge JobSets wherever a stack holds one, and `jobset_problems` is the same check for a JobSet the
job tools render (no Pulumi resource).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pulumi_policy import (
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from infra.k8s_versions import EKS_ADDONS, HELM_CHARTS, version_tuple
from policy import aws_types
from policy.resources import of_type, referenced
from trainer.contract.catalog import INSTANCE_TYPES

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
EKS_CLUSTER = "aws:eks/cluster:Cluster"
NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
NODE_CLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
ROLE = "aws:iam/role:Role"
ROLE_GRANTS = ("aws:iam/rolePolicyAttachment:RolePolicyAttachment", "aws:iam/rolePolicy:RolePolicy")
# The role input of each: the cluster's and the node group's (pulumi-aws eks.Cluster role_arn, eks.NodeGroup
# node_role_arn).
ROLE_INPUTS = {EKS_CLUSTER: "roleArn", NODE_GROUP: "nodeRoleArn"}
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# Security Hub EKS.8: "EKS clusters should have audit logging enabled" (the `audit` control plane log type).
AUDIT_LOG_TYPE = "audit"
# What a managed node group's launch template may not set (EKS user guide, "Customize managed nodes with launch
# templates": "Amazon EKS must control the instance lifecycle"; IAM instance profile and SubnetId are prohibited).
PROHIBITED_IN_NODE_TEMPLATES = ("instanceInitiatedShutdownBehavior", "iamInstanceProfile")
ADDON = "aws:eks/addon:Addon"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
CLUSTER_QUEUE_PREFIX = "kubernetes:kueue.x-k8s.io/"
JOBSET_PREFIX = "kubernetes:jobset.x-k8s.io/"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
GPU_RESOURCE = "nvidia.com/gpu"
STOP_GRACE_ENV = "TRAINSTACK_STOP_GRACE_SECONDS"


def template_efa_devices(template: Mapping[str, Any]) -> int:
    """EFA devices a launch template attaches: its `efa` and `efa-only` interfaces."""
    return sum(
        1 for i in template.get("networkInterfaces") or [] if i.get("interfaceType") in ("efa", "efa-only")
    )


def quota(queue: Mapping[str, Any], resource: str) -> float | None:
    """A ClusterQueue's nominal quota for `resource`, summed over its flavors; None when it covers none."""
    found = [
        float(r["nominalQuota"])
        for group in (queue.get("spec") or {}).get("resourceGroups") or []
        for flavor in group.get("flavors") or []
        for r in flavor.get("resources") or []
        if r.get("name") == resource and not isinstance(r.get("nominalQuota"), str)
    ]
    return sum(found) if found else None


def pod_specs(jobset: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(replicated job name, pod spec) of every replicated job of a JobSet."""
    return [
        (
            str(job.get("name")),
            ((job.get("template") or {}).get("spec") or {}).get("template", {}).get("spec") or {},
        )
        for job in (jobset.get("spec") or {}).get("replicatedJobs") or []
    ]


def jobset_problems(
    jobset: Mapping[str, Any], efa_devices_per_node: int | None = None, gpus_per_node: int | None = None
) -> list[str]:
    """What is wrong with a JobSet for this project: pods' EFA and GPU requests against one node's devices, and
    their termination grace against the trainer's stop grace."""
    problems = []
    for job, spec in pod_specs(jobset):
        grace = spec.get("terminationGracePeriodSeconds", 30)  # the Kubernetes default (PodSpec)
        for container in spec.get("containers") or []:
            env = {e.get("name"): e.get("value") for e in container.get("env") or []}
            limits = (container.get("resources") or {}).get("limits") or {}
            if STOP_GRACE_ENV in env and not float(grace) > float(env[STOP_GRACE_ENV]):
                problems.append(
                    f"replicated job {job!r}: terminationGracePeriodSeconds = {grace} does not exceed the trainer's "
                    f"{STOP_GRACE_ENV} = {env[STOP_GRACE_ENV]}: the kubelet kills the pod before the trainer's "
                    "checkpoint on SIGTERM is written; give the pod the stop grace + 60 s"
                )
            for resource, expected in ((EFA_RESOURCE, efa_devices_per_node), (GPU_RESOURCE, gpus_per_node)):
                if expected is not None and resource in limits and int(limits[resource]) != expected:
                    problems.append(
                        f"replicated job {job!r}, container {container.get('name')!r}: {resource} = "
                        f"{limits[resource]}, but one node has {expected} (a pod per node takes all of them)"
                    )
    return problems


@dataclass(frozen=True)
class GpuNodes:
    """One source of GPU nodes: a managed node group on a launch template, or a Karpenter pool on its node class."""

    kind: str  # "node group" or "NodePool"
    name: str
    urn: str
    interfaces_from: str  # the launch template or EC2NodeClass that attaches the interfaces
    instance_types: list[str]
    devices: int
    nodes: float | None  # the most nodes it may hold at once


def pool_instance_types(pool: Mapping[str, Any]) -> list[str]:
    """The instance types a NodePool's requirements allow (operator In on node.kubernetes.io/instance-type)."""
    requirements = ((pool.get("spec") or {}).get("template") or {}).get("spec", {}).get("requirements") or []
    return [
        str(value)
        for r in requirements
        if r.get("key") == INSTANCE_TYPE_LABEL and r.get("operator") == "In"
        for value in r.get("values") or []
    ]


def pool_nodes(pool: Mapping[str, Any], gpus_per_node: int | None) -> float | None:
    """The most nodes a NodePool may start: its GPU limit over one node's GPUs (Karpenter concepts/nodepools.md,
    spec.limits: no new node once the pool's nodes reach a limit); None without a GPU limit."""
    limit = ((pool.get("spec") or {}).get("limits") or {}).get(GPU_RESOURCE)
    if limit is None or not gpus_per_node:
        return None
    return float(limit) / gpus_per_node


def gpu_node_sources(resources: list[Any]) -> list[GpuNodes]:
    found = []
    for group in of_type(resources, [NODE_GROUP]):
        for template in referenced(group, "launchTemplate", [aws_types.LAUNCH_TEMPLATE]):
            devices = template_efa_devices(template.props)
            if not devices:
                continue
            instance_types = list(group.props.get("instanceTypes") or []) or (
                [str(template.props["instanceType"])] if template.props.get("instanceType") else []
            )
            nodes = (group.props.get("scalingConfig") or {}).get("maxSize")
            found.append(
                GpuNodes(
                    "node group",
                    group.name,
                    group.urn,
                    f"launch template '{template.name}'",
                    instance_types,
                    devices,
                    None if nodes is None else float(nodes),
                )
            )
    classes = {str((c.props.get("metadata") or {}).get("name")): c for c in of_type(resources, [NODE_CLASS])}
    for pool in of_type(resources, [NODE_POOL]):
        ref = ((pool.props.get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeClassRef") or {}
        node_class = classes.get(str(ref.get("name")))
        if node_class is None:
            continue
        devices = template_efa_devices(node_class.props.get("spec") or {})
        instance_types = pool_instance_types(pool.props)
        gpus = (
            INSTANCE_TYPES[instance_types[0]].gpus
            if instance_types[:1] and instance_types[0] in INSTANCE_TYPES
            else None
        )
        found.append(
            GpuNodes(
                "NodePool",
                pool.name,
                pool.urn,
                f"EC2NodeClass '{node_class.name}'",
                instance_types,
                devices,
                pool_nodes(pool.props, gpus),
            )
        )
    return found


def validate_efa_agree(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    queues = [
        r
        for r in args.resources
        if r.resource_type.startswith(CLUSTER_QUEUE_PREFIX) and "ClusterQueue" in r.resource_type
    ]
    jobsets = [r for r in args.resources if r.resource_type.startswith(JOBSET_PREFIX)]
    for source in gpu_node_sources(list(args.resources)):
        devices, instance_types, nodes = source.devices, source.instance_types, source.nodes
        for name in instance_types:
            catalog = INSTANCE_TYPES.get(name)
            if catalog is not None and catalog.efa_interfaces != devices:
                report_violation(
                    f"{source.kind} '{source.name}' runs {name}, which has {catalog.efa_interfaces} EFA cards "
                    f"(trainer/contract/catalog.py), but its {source.interfaces_from} attaches {devices} "
                    "EFA devices: build the interfaces from the catalog (infra/eks.py eks_network_interfaces).",
                    source.urn,
                )
        gpus = (
            INSTANCE_TYPES[instance_types[0]].gpus
            if instance_types and instance_types[0] in INSTANCE_TYPES
            else None
        )
        # Kueue admits against each ClusterQueue's quota; queues in one cohort lend theirs to each other, so at
        # most the sum of their nominal quotas runs at once (kueue v0.19.2 apis/kueue/v1beta2/clusterqueue_types.go,
        # borrowingLimit/lendingLimit). More than the nodes can hold admits a job that only part of gets nodes.
        for resource, per_node in ((EFA_RESOURCE, devices), (GPU_RESOURCE, gpus)):
            if per_node is None or nodes is None or not queues:
                continue
            held = [quota(queue.props, resource) for queue in queues]
            total = sum(h for h in held if h is not None)
            if any(h is None for h in held) or total != per_node * nodes:
                where = queues[0] if len(queues) == 1 else queues[-1]
                names = ", ".join(f"'{q.name}'" for q in queues)
                report_violation(
                    f"ClusterQueue {names} hold{'s' if len(queues) == 1 else ''} {total if not any(h is None for h in held) else None} "
                    f"{resource}, but {source.kind} '{source.name}' offers {per_node} per node x {nodes:g} nodes: a quota "
                    "short of whole nodes admits part of a job (kubernetes-sigs/kueue issue 2796), and one beyond "
                    "them admits a job whose nodes cannot all start; set the nominal quotas to sum to nodes x per node.",
                    where.urn,
                )
        for jobset in jobsets:
            for problem in jobset_problems(jobset.props, efa_devices_per_node=devices, gpus_per_node=gpus):
                report_violation(f"JobSet '{jobset.name}': {problem}", jobset.urn)


def validate_capacity_block_groups(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    for group in of_type(args.resources, [NODE_GROUP]):
        if group.props.get("capacityType") != "CAPACITY_BLOCK":
            continue
        for template in referenced(group, "launchTemplate", [aws_types.LAUNCH_TEMPLATE]):
            if not template.props.get("instanceType"):
                report_violation(
                    f"Capacity Block node group '{group.name}': its launch template '{template.name}' sets no "
                    "instanceType; EKS requires the block's instance type in the template (EKS user guide, \"Create a "
                    'managed node group with Capacity Blocks for ML"); set instance_type on the template.',
                    template.urn,
                )
        if group.props.get("instanceTypes"):
            report_violation(
                f"Capacity Block node group '{group.name}' lists instanceTypes: the instance type comes from its "
                "launch template alone (same guide); remove instance_types from the node group.",
                group.urn,
            )


def validate_grants_before_use(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    resources = list(args.resources)
    for user in of_type(resources, list(ROLE_INPUTS)):
        depends = {d.urn for d in user.dependencies}
        for role in referenced(user, ROLE_INPUTS[user.resource_type], [ROLE]):
            grants = [
                g
                for g in of_type(resources, ROLE_GRANTS)
                if any(r.urn == role.urn for r in g.property_dependencies.get("role", []))
            ]
            missing = [g.name for g in grants if g.urn not in depends]
            if missing:
                report_violation(
                    f"'{user.name}' uses role '{role.name}' but does not depend on its grants {missing}: EKS may "
                    "start before the permissions exist and `pulumi destroy` may remove them first, leaving "
                    "instances and network interfaces EKS can no longer delete (pulumi-aws eks.Cluster / "
                    "eks.NodeGroup docs); add them to depends_on.",
                    user.urn,
                )


def validate_audit_logs(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type != EKS_CLUSTER:
        return
    types = list(args.props.get("enabledClusterLogTypes") or [])
    if AUDIT_LOG_TYPE not in types:
        report_violation(
            f"EKS cluster '{args.name}' sends the control plane logs {types or 'none'}: without `audit` nobody can "
            "tell who did what in the cluster (Security Hub EKS.8); set enabled_cluster_log_types to include "
            "audit (infra/eks.py CONTROL_PLANE_LOG_TYPES).",
            None,
        )


def validate_node_templates(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    for group in of_type(args.resources, [NODE_GROUP]):
        for template in referenced(group, "launchTemplate", [aws_types.LAUNCH_TEMPLATE]):
            for key in PROHIBITED_IN_NODE_TEMPLATES:
                if key in template.props:
                    report_violation(
                        f"Launch template '{template.name}' of node group '{group.name}' sets {key}: EKS refuses it in a "
                        "managed node group's template (EKS user guide, \"Customize managed nodes with launch "
                        'templates"); remove it (infra/eks.py builds the node template without it).',
                        template.urn,
                    )
            interfaces = template.props.get("networkInterfaces") or []
            grouped = [i for i in interfaces if i.get("securityGroups")]
            if grouped and not referenced(template, "networkInterfaces", [EKS_CLUSTER]):
                report_violation(
                    f"Launch template '{template.name}' of node group '{group.name}' puts security groups on its "
                    "interfaces but not the cluster security group: EKS then does not add it and the nodes cannot "
                    "reach the control plane (same guide); add cluster.vpc_config.cluster_security_group_id.",
                    template.urn,
                )


def validate_jobset_grace(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if not args.resource_type.startswith(JOBSET_PREFIX):
        return
    for problem in jobset_problems(args.props):
        report_violation(f"JobSet '{args.name}': {problem}", None)


def validate_versions(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type == HELM_RELEASE:
        chart = str(args.props.get("chart") or "")
        for pin in HELM_CHARTS:
            if chart == pin.chart or chart.endswith(f"/{pin.release}"):
                version = str(args.props.get("version") or "")
                if not version or version_tuple(version) < version_tuple(pin.fixed):
                    report_violation(
                        f"Helm release '{args.name}' installs {chart} {version or '(latest, unpinned)'}: versions "
                        f"before {pin.fixed} carry a known EFA bug (infra/k8s_versions.py says which); pin "
                        f"{pin.version}.",
                        None,
                    )
    elif args.resource_type == ADDON:
        addon, addon_version = args.props.get("addonName"), args.props.get("addonVersion")
        floor = {a.name: a.fixed for a in EKS_ADDONS}.get(str(addon))
        if floor is not None and addon_version and version_tuple(str(addon_version)) < version_tuple(floor):
            report_violation(
                f"EKS add-on '{args.name}' ({addon}) is at {addon_version}, before {floor}, the first version that supports "
                "what EFA nodes need (infra/k8s_versions.py); leave addon_version unset for EKS's default or pin a "
                "newer one.",
                None,
            )


efa_agree = StackValidationPolicy(
    name="eks-efa-devices-agree",
    description=(
        "EKS: a GPU node group's launch template attaches the catalog's EFA devices, the Kueue ClusterQueue holds "
        "whole nodes of them (kubernetes-sigs/kueue issue 2796), and a JobSet's pod asks for one node's devices."
    ),
    validate=validate_efa_agree,
)

node_templates = StackValidationPolicy(
    name="eks-node-template-as-eks-requires",
    description=(
        "A managed node group's launch template sets no shutdown behaviour or instance profile, and interfaces that "
        'name security groups include the cluster\'s (EKS user guide, "Customize managed nodes with launch templates").'
    ),
    validate=validate_node_templates,
)

jobset_grace = ResourceValidationPolicy(
    name="jobset-termination-grace-above-stop-grace",
    description=(
        "A JobSet's pods get more terminationGracePeriodSeconds than the trainer's TRAINSTACK_STOP_GRACE_SECONDS "
        '(the kubelet kills at the end of the grace: Kubernetes docs, "Pod Lifecycle").'
    ),
    validate=validate_jobset_grace,
)

fixed_versions = ResourceValidationPolicy(
    name="eks-charts-and-addons-past-known-bugs",
    description=(
        "Helm releases of the pinned charts and EKS add-ons are at or past the versions that fixed known EFA bugs "
        "(infra/k8s_versions.py)."
    ),
    validate=validate_versions,
)

capacity_block_groups = StackValidationPolicy(
    name="eks-capacity-block-instance-type-in-template",
    description=(
        "A Capacity Block node group's launch template names the instance type and the node group none (EKS user "
        'guide, "Create a managed node group with Capacity Blocks for ML").'
    ),
    validate=validate_capacity_block_groups,
)

grants_before_use = StackValidationPolicy(
    name="eks-role-grants-before-use",
    description=(
        "An EKS cluster and its node groups depend on their roles' policy attachments (pulumi-aws eks.Cluster and "
        "eks.NodeGroup: IAM permissions created before and deleted after)."
    ),
    validate=validate_grants_before_use,
)

audit_logs = ResourceValidationPolicy(
    name="eks-audit-logs-enabled",
    description="An EKS cluster sends its control plane's audit log to CloudWatch Logs (Security Hub EKS.8).",
    validate=validate_audit_logs,
)
