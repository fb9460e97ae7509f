"""What lets a JobSet pod take its own failed node out of service on EKS, and nothing more (trainer/preflight/
quarantine.py does it: taint, then delete a Karpenter node).

- a ClusterRole on nodes (get, patch, delete) bound to the job pods' service account, `trainer` in the stack's
  namespace and in each team's. RBAC cannot name "the node I run on" (resourceNames are fixed names), so
- a ValidatingAdmissionPolicy narrows it, for those service accounts only: the node must be the one the request's
  pod-bound token names (`authentication.kubernetes.io/node-name` in the user's extra, Kubernetes KEP-4193 "Bound
  service account token improvements", on by default since 1.30), and an update may only add the quarantine taint,
  changing no label, annotation or other taint. A team's pod therefore cannot touch another team's node, nor
  relabel its own.
"""

from __future__ import annotations

from typing import Any

from infra.config import StackConfig
from trainer.contract.gpu_nodes import QUARANTINE_TAINT
from trainer.contract.teams import TEAM_SERVICE_ACCOUNT, team_namespace

RBAC_API_VERSION = "rbac.authorization.k8s.io/v1"
ADMISSION_API_VERSION = "admissionregistration.k8s.io/v1"
NAME = "trainstack-node-quarantine"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


def job_service_accounts(cfg: StackConfig, stack_namespace: str) -> list[tuple[str, str]]:
    """(namespace, service account) of every job's pods: `trainer` in the stack's namespace and in each team's."""
    teams = (team_namespace(t.name) for t in cfg.teams)
    return [(namespace, TEAM_SERVICE_ACCOUNT) for namespace in (stack_namespace, *teams)]


def service_account_users(subjects: list[tuple[str, str]]) -> list[str]:
    return [f"system:serviceaccount:{namespace}:{name}" for namespace, name in subjects]


def cluster_role() -> dict[str, Any]:
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "ClusterRole",
        "metadata": {"name": NAME},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch", "delete"]}],
    }


def cluster_role_binding(subjects: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "ClusterRoleBinding",
        "metadata": {"name": NAME},
        "roleRef": {"apiGroup": RBAC_API_VERSION.split("/")[0], "kind": "ClusterRole", "name": NAME},
        "subjects": [
            {"kind": "ServiceAccount", "namespace": namespace, "name": name} for namespace, name in subjects
        ],
    }


def admission_policy(subjects: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The policy and its binding (Kubernetes docs, "Validating Admission Policy": matchConditions select the
    requests, `request.userInfo.extra`, `object` (null on DELETE) and `oldObject` (null on CREATE))."""
    users = ", ".join(f"'{user}'" for user in service_account_users(subjects))
    key, effect = QUARANTINE_TAINT["key"], QUARANTINE_TAINT["effect"]
    own_node = (
        f"has(request.userInfo.extra) && '{NODE_NAME_EXTRA}' in request.userInfo.extra && "
        f"request.userInfo.extra['{NODE_NAME_EXTRA}'][0] == oldObject.metadata.name"
    )
    only_the_taint = (
        "request.operation == 'DELETE' || ("
        "object.metadata.labels == oldObject.metadata.labels && "
        "object.metadata.annotations == oldObject.metadata.annotations && "
        f"object.spec.taints.exists(t, t.key == '{key}' && t.effect == '{effect}') && "
        f"object.spec.taints.filter(t, t.key != '{key}') == "
        f"(has(oldObject.spec.taints) ? oldObject.spec.taints.filter(t, t.key != '{key}') : []) && "
        "object.spec.unschedulable == oldObject.spec.unschedulable)"
    )
    return [
        {
            "apiVersion": ADMISSION_API_VERSION,
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": NAME},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["UPDATE", "DELETE"],
                            "resources": ["nodes"],
                        }
                    ]
                },
                "matchConditions": [
                    {"name": "job-pods-only", "expression": f"request.userInfo.username in [{users}]"}
                ],
                "validations": [
                    {
                        "expression": own_node,
                        "message": "a job's pod may quarantine only the node it runs on",
                    },
                    {
                        "expression": only_the_taint,
                        "message": f"a job's pod may only add the taint {key}:{effect} to its node",
                    },
                ],
            },
        },
        {
            "apiVersion": ADMISSION_API_VERSION,
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": NAME},
            "spec": {"policyName": NAME, "validationActions": ["Deny"]},
        },
    ]


def quarantine_objects(subjects: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [cluster_role(), cluster_role_binding(subjects), *admission_policy(subjects)]
