"""Kubernetes RBAC as the API server decides it, and the rule that a team reaches only its own namespace.

`allows` is the RBAC authorizer's decision for one request: some binding whose subjects include the user or one of
its groups grants a rule that matches the verb, API group, resource (with subresource) and name, in the request's
namespace for a RoleBinding, anywhere for a ClusterRoleBinding (kubernetes/kubernetes pkg/apis/rbac/v1/
evaluation_helpers.go `VerbMatches`, `APIGroupMatches`, `ResourceMatches`, `ResourceNameMatches`, and
plugin/pkg/auth/authorizer/rbac/rbac.go `RuleAllows`; Kubernetes docs, "Using RBAC Authorization": a RoleBinding
grants a ClusterRole's rules only in its own namespace). RBAC only adds: no rule denies.

What it does not model: the cluster's own default bindings (system:basic-user, system:discovery: no resource verbs
on namespaced objects) and EKS access policies, which the team access entries do not associate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pulumi_policy import ReportViolation, StackValidationArgs, StackValidationPolicy

from infra.eks_teams import TEAM_LABEL, team_group, team_namespace

RBAC_PREFIX = "kubernetes:rbac.authorization.k8s.io/v1:"
NAMESPACE_TYPE = "kubernetes:core/v1:Namespace"
ALL = "*"  # rbacv1.VerbAll, APIGroupAll, ResourceAll
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


@dataclass(frozen=True)
class Request:
    """One API request's attributes, as the authorizer sees them ("" namespace: cluster-scoped)."""

    verb: str
    namespace: str
    api_group: str
    resource: str
    subresource: str = ""
    name: str = ""


def rule_allows(rule: Mapping[str, Any], request: Request) -> bool:
    verbs, groups = rule.get("verbs") or [], rule.get("apiGroups") or []
    resources, names = rule.get("resources") or [], rule.get("resourceNames") or []
    combined = f"{request.resource}/{request.subresource}" if request.subresource else request.resource
    resource_ok = any(
        r in (ALL, combined)
        or (
            request.subresource
            and len(r) == len(request.subresource) + 2
            and r.startswith("*/")
            and r.endswith(request.subresource)
        )
        for r in resources
    )
    return (
        any(v in (ALL, request.verb) for v in verbs)
        and any(g in (ALL, request.api_group) for g in groups)
        and resource_ok
        and (not names or request.name in names)
    )


def _subject_matches(subject: Mapping[str, Any], user: str, groups: Iterable[str]) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    return (kind == "Group" and name in set(groups)) or (kind == "User" and name == user)


def allows(objects: Sequence[Mapping[str, Any]], user: str, groups: Iterable[str], request: Request) -> bool:
    """Whether the RBAC objects (Roles, ClusterRoles and their bindings) let the user do the request."""
    groups = list(groups)
    roles = {
        (
            o.get("kind"),
            (o.get("metadata") or {}).get("namespace", ""),
            (o.get("metadata") or {}).get("name"),
        ): o
        for o in objects
        if o.get("kind") in ("Role", "ClusterRole")
    }
    for binding in objects:
        kind = binding.get("kind")
        if kind not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(_subject_matches(s, user, groups) for s in binding.get("subjects") or []):
            continue
        where = (binding.get("metadata") or {}).get("namespace", "")
        if kind == "RoleBinding" and where != request.namespace:
            continue  # a RoleBinding grants only in its own namespace
        ref = binding.get("roleRef") or {}
        role_namespace = where if ref.get("kind") == "Role" else ""
        role = roles.get((ref.get("kind"), role_namespace, ref.get("name")))
        if role is not None and any(rule_allows(rule, request) for rule in role.get("rules") or []):
            return True
    return False


# What a team may do in its own namespace, and nowhere else: (api group, resource, subresource) -> verbs.
TEAM_GRANTS: dict[tuple[str, str, str], frozenset[str]] = {
    ("jobset.x-k8s.io", "jobsets", ""): frozenset({"create", "delete", "get", "list", "watch"}),
    ("", "pods", ""): frozenset({"get", "list", "watch"}),
    ("", "pods", "log"): frozenset({"get"}),
    ("", "events", ""): frozenset({"get", "list", "watch"}),
    ("kueue.x-k8s.io", "workloads", ""): frozenset({"get", "list", "watch"}),
    ("kueue.x-k8s.io", "localqueues", ""): frozenset({"get", "list", "watch"}),
}
# What no team may do in any namespace, and things it must not reach around Kueue with.
PROBED: tuple[tuple[str, str, str], ...] = (
    *TEAM_GRANTS,
    ("", "pods", "exec"),
    ("", "secrets", ""),
    ("", "serviceaccounts", ""),
    ("batch", "jobs", ""),
    ("kueue.x-k8s.io", "clusterqueues", ""),
    ("rbac.authorization.k8s.io", "rolebindings", ""),
)


def team_problems(
    objects: Sequence[Mapping[str, Any]], teams: Iterable[str], namespaces: Iterable[str]
) -> list[str]:
    """Every request a team's group is allowed that it should not be, or denied that its workflow needs."""
    problems = []
    namespaces = sorted({*namespaces, ""})
    for team in teams:
        own, group = team_namespace(team), team_group(team)
        for namespace in namespaces:
            for api_group, resource, subresource in PROBED:
                for verb in VERBS:
                    request = Request(verb, namespace, api_group, resource, subresource)
                    wanted = namespace == own and verb in TEAM_GRANTS.get(
                        (api_group, resource, subresource), ()
                    )
                    if allows(objects, f"team-{team}-member", [group], request) != wanted:
                        what = f"{verb} {api_group or 'core'}/{resource}{'/' + subresource if subresource else ''}"
                        problems.append(
                            f"team {team!r} (group {group}) {'may' if not wanted else 'may not'} {what} in "
                            f"{namespace or 'the cluster scope'}"
                        )
    return problems


def rbac_objects(resources: Iterable[Any]) -> list[dict[str, Any]]:
    return [
        {"kind": r.resource_type.rsplit(":", 1)[1], **dict(r.props)}
        for r in resources
        if r.resource_type.startswith(RBAC_PREFIX)
    ]


def validate_team_rbac(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    namespaces = [r for r in args.resources if r.resource_type == NAMESPACE_TYPE]
    teams = [
        str(((n.props.get("metadata") or {}).get("labels") or {}).get(TEAM_LABEL))
        for n in namespaces
        if TEAM_LABEL in ((n.props.get("metadata") or {}).get("labels") or {})
    ]
    if not teams:
        return
    names = [str((n.props.get("metadata") or {}).get("name")) for n in namespaces]
    for problem in team_problems(rbac_objects(args.resources), teams, [*names, "kube-system", "default"]):
        report_violation(
            f"{problem}: a team creates and reads only its own JobSets and what they run, in its own namespace "
            "(docs/eks.md#teams); fix the Roles and bindings (infra/eks_teams.py).",
            None,
        )


team_rbac = StackValidationPolicy(
    name="eks-team-rbac-own-namespace",
    description=(
        "Each team's Kubernetes group may create, read and delete JobSets and read their pods, logs, events and "
        "Kueue workloads in its own namespace, and nothing else anywhere (RBAC decided as the API server does)."
    ),
    validate=validate_team_rbac,
)
