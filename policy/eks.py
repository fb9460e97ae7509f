"""EKS stacks: the cross-checks no anchor makes, between the catalog, the nodes, the queue and the job.

- EFA devices agree: a GPU node group's launch template attaches as many EFA devices as the catalog gives its
  instance type (one per network card: EC2 user guide, "Maximize network bandwidth on accelerated instances"), the
  Kueue ClusterQueue's quota holds whole nodes of them (a quota short of a whole job admits part of it and
  deadlocks: kubernetes-sigs/kueue issue 2796), and a JobSet's pod asks for exactly one node's devices.
- A JobSet's pods get more termination grace than the trainer's own stop grace: the kubelet sends SIGKILL when
  terminationGracePeriodSeconds ends (Kubernetes docs, "Pod Lifecycle", termination of pods), and the trainer's
  checkpoint-on-SIGTERM needs `TRAINSTACK_STOP_GRACE_SECONDS` of it.
- Charts and add-ons at or past the versions that fixed the known EFA bugs (infra/k8s_versions.py names each fix).

The JobSet rules judge JobSets wherever a stack holds one, and `jobset_problems` is the same check for a JobSet the
job tools render (no Pulumi resource).
"""

from __future__ import annotations

from collections.abc import Mapping
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


def validate_efa_agree(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    queues = [
        r
        for r in args.resources
        if r.resource_type.startswith(CLUSTER_QUEUE_PREFIX) and "ClusterQueue" in r.resource_type
    ]
    jobsets = [r for r in args.resources if r.resource_type.startswith(JOBSET_PREFIX)]
    for group in of_type(args.resources, [NODE_GROUP]):
        templates = [
            t
            for t in referenced(group, "launchTemplate", [aws_types.LAUNCH_TEMPLATE])
            if template_efa_devices(t.props)
        ]
        for template in templates:
            devices = template_efa_devices(template.props)
            instance_types = group.props.get("instanceTypes") or []
            for name in instance_types:
                catalog = INSTANCE_TYPES.get(name)
                if catalog is not None and catalog.efa_interfaces != devices:
                    report_violation(
                        f"Node group '{group.name}' runs {name}, which has {catalog.efa_interfaces} EFA cards "
                        f"(trainer/contract/catalog.py), but its launch template '{template.name}' attaches {devices} "
                        "EFA devices: build the interfaces from the catalog (infra/eks.py eks_network_interfaces).",
                        group.urn,
                    )
            nodes = (group.props.get("scalingConfig") or {}).get("maxSize")
            gpus = (
                INSTANCE_TYPES[instance_types[0]].gpus
                if instance_types and instance_types[0] in INSTANCE_TYPES
                else None
            )
            for queue in queues:
                for resource, per_node in ((EFA_RESOURCE, devices), (GPU_RESOURCE, gpus)):
                    held = quota(queue.props, resource)
                    if per_node is None or nodes is None:
                        continue
                    if held is None or held != per_node * float(nodes):
                        report_violation(
                            f"ClusterQueue '{queue.name}' holds {held} {resource}, but node group '{group.name}' "
                            f"offers {per_node} per node x {nodes} nodes: a quota short of whole nodes admits part "
                            "of a job (kubernetes-sigs/kueue issue 2796); set nominalQuota to nodes x per node.",
                            queue.urn,
                        )
            for jobset in jobsets:
                for problem in jobset_problems(
                    jobset.props, efa_devices_per_node=devices, gpus_per_node=gpus
                ):
                    report_violation(f"JobSet '{jobset.name}': {problem}", jobset.urn)


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
