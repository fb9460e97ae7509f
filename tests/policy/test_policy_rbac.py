"""policy/rbac.py: the RBAC decision as the API server makes it, and each team confined to its own namespace.

The evaluator's cases come from kubernetes/kubernetes pkg/apis/rbac/v1/evaluation_helpers.go (`*` verbs, groups and
resources; `*/subresource`; an empty resourceNames list matching every name) and the RBAC docs (a RoleBinding grants
only in its namespace, also when it names a ClusterRole; a ClusterRoleBinding grants everywhere).
"""

from __future__ import annotations

import copy

import pytest

from infra.eks_teams import team_group, team_namespace
from policy import rbac
from policy.rbac import Request, allows, rbac_objects, team_problems

GROUP = "g"


def role(kind: str, rules: list[dict], namespace: str = "ns") -> dict:
    meta = {"name": "r", **({"namespace": namespace} if kind == "Role" else {})}
    return {"kind": kind, "metadata": meta, "rules": rules}


def binding(kind: str, role_kind: str, namespace: str = "ns", subject: str = GROUP) -> dict:
    meta = {"name": "b", **({"namespace": namespace} if kind == "RoleBinding" else {})}
    return {
        "kind": kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": "r"},
        "subjects": [{"kind": "Group", "name": subject}],
    }


def decide(objects, verb="get", namespace="ns", group="", resource="pods", sub="", name="") -> bool:
    return allows(objects, "u", [GROUP], Request(verb, namespace, group, resource, sub, name))


def test_a_verb_group_and_resource_must_all_match_and_star_matches_any():
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}
    objects = [role("Role", [rule]), binding("RoleBinding", "Role")]
    assert decide(objects)
    assert not decide(objects, verb="delete")
    assert not decide(objects, group="batch")
    assert not decide(objects, resource="secrets")
    star = [
        role("Role", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
        binding("RoleBinding", "Role"),
    ]
    assert decide(star, verb="delete", group="batch", resource="jobs")


def test_a_subresource_matches_only_its_own_name_or_star_slash_it():
    pods = [
        role("Role", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
        binding("RoleBinding", "Role"),
    ]
    assert not decide(pods, sub="log")  # `pods` does not cover pods/log
    logs = [
        role("Role", [{"apiGroups": [""], "resources": ["*/log"], "verbs": ["get"]}]),
        binding("RoleBinding", "Role"),
    ]
    assert decide(logs, sub="log") and not decide(logs, sub="exec") and not decide(logs)


def test_resource_names_restrict_and_an_empty_list_allows_every_name():
    named = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": ["a"]}
    objects = [role("Role", [named]), binding("RoleBinding", "Role")]
    assert decide(objects, name="a") and not decide(objects, name="b")


def test_a_role_binding_grants_only_in_its_namespace_even_for_a_cluster_role():
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}
    objects = [role("ClusterRole", [rule]), binding("RoleBinding", "ClusterRole", namespace="ns")]
    assert decide(objects, namespace="ns") and not decide(objects, namespace="other")
    cluster_wide = [role("ClusterRole", [rule]), binding("ClusterRoleBinding", "ClusterRole")]
    assert decide(cluster_wide, namespace="other") and decide(cluster_wide, namespace="")


def test_a_binding_for_another_group_grants_nothing():
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}
    assert not decide([role("Role", [rule]), binding("RoleBinding", "Role", subject="someone-else")])


@pytest.fixture(scope="module")
def stack_rbac(planned):
    return rbac_objects(planned("eks-dev"))


NAMESPACES = ["team-vision", "team-language", "trainstack", "kube-system"]


def test_each_team_creates_and_sees_only_its_own_jobsets(stack_rbac):
    for team, other in (("vision", "language"), ("language", "vision")):
        member = ("u", [team_group(team)])
        for verb in ("create", "get", "list", "watch", "delete"):
            assert allows(
                stack_rbac, *member, Request(verb, team_namespace(team), "jobset.x-k8s.io", "jobsets")
            )
            for namespace in (team_namespace(other), "trainstack", "kube-system", ""):
                assert not allows(stack_rbac, *member, Request(verb, namespace, "jobset.x-k8s.io", "jobsets"))
        own = team_namespace(team)
        assert allows(stack_rbac, *member, Request("get", own, "", "pods", "log"))
        assert not allows(stack_rbac, *member, Request("get", team_namespace(other), "", "pods", "log"))
        for verb in ("create", "update", "patch", "delete"):  # nothing that bypasses Kueue or edits a run
            assert not allows(stack_rbac, *member, Request(verb, own, "", "pods"))
            assert not allows(stack_rbac, *member, Request(verb, own, "batch", "jobs"))
        assert not allows(stack_rbac, *member, Request("update", own, "jobset.x-k8s.io", "jobsets"))
        assert not allows(stack_rbac, *member, Request("get", own, "", "secrets"))


def test_the_whole_matrix_of_verbs_and_namespaces_matches_the_teams_grants(stack_rbac):
    assert team_problems(stack_rbac, ["vision", "language"], NAMESPACES) == []


def test_a_cluster_role_binding_for_a_team_fails_the_policy(planned, resource, violations):
    resources = list(planned("eks-dev"))
    assert violations(rbac.team_rbac, *resources) == []
    wide = [
        resource(
            "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole",
            {
                "metadata": {"name": "jobs"},
                "rules": [{"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["list"]}],
            },
            name="jobs",
        ),
        resource(
            "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding",
            {
                "metadata": {"name": "jobs"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "jobs"},
                "subjects": [{"kind": "Group", "name": team_group("vision")}],
            },
            name="jobs-binding",
        ),
    ]
    found = violations(rbac.team_rbac, *resources, *wide)
    assert found and all("team 'vision'" in message for _, message in found)
    assert any("may list jobset.x-k8s.io/jobsets in team-language" in message for _, message in found)


def test_a_role_missing_the_log_grant_fails_the_policy(stack_rbac):
    broken = copy.deepcopy(stack_rbac)
    for obj in broken:
        if obj["kind"] == "Role":
            obj["rules"] = [r for r in obj["rules"] if list(r["resources"]) != ["pods/log"]]
    problems = team_problems(broken, ["vision"], NAMESPACES)
    assert problems == [
        "team 'vision' (group trainstack-team-vision) may not get core/pods/log in team-vision"
    ]
