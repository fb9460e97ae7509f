"""Kueue objects against Kueue's documented semantics (kubernetes-sigs/kueue v0.19.2), each rule with its source.

- A ClusterQueue's borrowing and lending limits need a cohort: "borrowingLimit must be null if spec.cohortName is
  empty", and the same for lendingLimit (apis/kueue/v1beta2/clusterqueue_types.go, ResourceQuota).
- A ClusterQueue's quota is whole nodes, the same number of them in every resource a pod asks for, nominal and with
  borrowing: Kueue admits a workload only when every resource it requests fits (concepts/cluster_queue.md,
  "Resources"), so GPUs for two nodes but EFA devices for one admit a one-node job at most, and a fraction of a node
  admits nothing ever. (The cohort's total against the nodes that can exist is `eks-efa-devices-agree`.)
- Kueue waits for a job's pods: `waitForPodsReady` in its configuration evicts and requeues a job whose pods are not
  all ready within the timeout (apis/config/v1beta2/configuration_types.go WaitForPodsReady), so a multi-node job
  whose nodes Karpenter could start only part of gives them back instead of holding them while the rest never come.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from pulumi_policy import (
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from infra.k8s_versions import KUEUE
from policy.eks import EFA_RESOURCE, GPU_RESOURCE, HELM_RELEASE
from trainer.contract.catalog import INSTANCE_TYPES

CLUSTER_QUEUE = "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue"
RESOURCE_FLAVOR = "kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


def quota_resources(queue: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(flavor name, resource quota) of every resource of every flavor of a ClusterQueue."""
    return [
        (str(flavor.get("name")), r)
        for group in (queue.get("spec") or {}).get("resourceGroups") or []
        for flavor in group.get("flavors") or []
        for r in flavor.get("resources") or []
    ]


def cohort_problems(queue: Mapping[str, Any]) -> list[str]:
    if (queue.get("spec") or {}).get("cohortName"):
        return []
    return [
        f"{r['name']} sets {limit} without a cohort (spec.cohortName): Kueue refuses it"
        for _, r in quota_resources(queue)
        for limit in ("borrowingLimit", "lendingLimit")
        if r.get(limit) is not None
    ]


def whole_node_problems(queue: Mapping[str, Any], per_node: Mapping[str, Mapping[str, float]]) -> list[str]:
    """`per_node`: flavor -> resource -> one node's amount (GPUs, EFA devices, vCPUs) of the flavor's instances."""
    problems = []
    by_flavor: dict[str, dict[str, dict[str, float]]] = {}
    for flavor, r in quota_resources(queue):
        amounts = per_node.get(flavor, {})
        if r.get("name") not in amounts or isinstance(r.get("nominalQuota"), str):
            continue
        nominal = float(r["nominalQuota"])
        borrow = float(r.get("borrowingLimit") or 0)
        by_flavor.setdefault(flavor, {})[str(r["name"])] = {
            "nominal": nominal / amounts[str(r["name"])],
            "with borrowing": (nominal + borrow) / amounts[str(r["name"])],
        }
    for flavor, nodes in by_flavor.items():
        for which in ("nominal", "with borrowing"):
            counts = {name: n[which] for name, n in nodes.items()}
            fractions = [f"{name} = {count:g} nodes" for name, count in counts.items() if count != int(count)]
            if fractions:
                problems.append(f"flavor {flavor}, {which}: {', '.join(fractions)}: quota for part of a node")
            elif len(set(counts.values())) > 1:
                listed = ", ".join(f"{name} {count:g}" for name, count in counts.items())
                problems.append(
                    f"flavor {flavor}, {which}: nodes' worth differs by resource ({listed}): a job is admitted "
                    "only up to the smallest"
                )
    return problems


def flavor_nodes(flavors: list[Any]) -> dict[str, dict[str, float]]:
    """flavor name -> one node's GPUs, EFA devices and vCPUs, from its instance-type label and the catalog."""
    found: dict[str, dict[str, float]] = {}
    for flavor in flavors:
        spec = flavor.props.get("spec") or {}
        name = str((flavor.props.get("metadata") or {}).get("name"))
        instance = INSTANCE_TYPES.get(str((spec.get("nodeLabels") or {}).get(INSTANCE_TYPE_LABEL)))
        if instance is not None:
            found[name] = {
                GPU_RESOURCE: instance.gpus,
                EFA_RESOURCE: instance.efa_interfaces,
                "cpu": instance.vcpus,
            }
    return found


def validate_queues(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    per_node = flavor_nodes([r for r in args.resources if r.resource_type == RESOURCE_FLAVOR])
    for queue in (r for r in args.resources if r.resource_type == CLUSTER_QUEUE):
        for problem in [*cohort_problems(queue.props), *whole_node_problems(queue.props, per_node)]:
            report_violation(
                f"ClusterQueue '{queue.name}': {problem} (kubernetes-sigs/kueue v0.19.2 clusterqueue_types.go; "
                "infra/eks_teams.py builds quotas in whole nodes).",
                queue.urn,
            )


def manager_config(values: Mapping[str, Any]) -> dict[str, Any]:
    text = ((values.get("managerConfig") or {}).get("controllerManagerConfigYaml")) or ""
    loaded = yaml.safe_load(text) if isinstance(text, str) and text else None
    return loaded if isinstance(loaded, dict) else {}


def validate_pods_ready(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type != HELM_RELEASE or not str(args.props.get("chart") or "").endswith(
        f"/{KUEUE.release}"
    ):
        return
    wait = manager_config(args.props.get("values") or {}).get("waitForPodsReady") or {}
    if not wait.get("timeout"):
        report_violation(
            f"Helm release '{args.name}' runs Kueue without waitForPodsReady: a multi-node job whose nodes only "
            "partly start keeps them while it waits for the rest; set managerConfig's waitForPodsReady.timeout "
            "(infra/cluster_software.py kueue_config).",
            None,
        )


queues_whole_nodes = StackValidationPolicy(
    name="kueue-queues-whole-nodes",
    description=(
        "Kueue ClusterQueues set borrowing and lending limits only in a cohort, and their quotas, nominal and with "
        "borrowing, are whole nodes in every resource (kubernetes-sigs/kueue v0.19.2 clusterqueue_types.go)."
    ),
    validate=validate_queues,
)

pods_ready = ResourceValidationPolicy(
    name="kueue-waits-for-pods-ready",
    description=(
        "Kueue's configuration sets waitForPodsReady, so a job whose pods do not all become ready is evicted and "
        "requeued, never left running on part of its nodes."
    ),
    validate=validate_pods_ready,
)
