"""A JobSet pod whose node failed its preflight takes the node out of service through the API server
(trainer/preflight/quarantine.py): against a loopback server that answers as the API server does, and the stack's
RBAC and admission policy that allow exactly that (infra/node_quarantine.py)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from infra.cluster_software import NAMESPACE
from infra.node_quarantine import NAME, NODE_NAME_EXTRA, job_service_accounts, quarantine_objects
from tests.infra.conftest import planned
from tests.support.servers import serve_in_background
from trainer.contract.gpu_nodes import (
    GPU_NODE_TAINT,
    KARPENTER_NODEPOOL_LABEL,
    NODE_NAME_ENV,
    QUARANTINE_TAINT,
)
from trainer.contract.teams import TEAM_SERVICE_ACCOUNT
from trainer.preflight.quarantine import quarantine_node

from ..jobs.test_jobset import pod_spec, render

NODE = "ip-10-0-1-17.ec2.internal"


class ApiServer(BaseHTTPRequestHandler):
    """GET, PATCH (merge patch) and DELETE of one Node, recorded; 404 for any other path."""

    node: ClassVar[dict] = {}
    seen: ClassVar[list] = []

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.seen.append((self.command, self.path, self.headers.get("Content-Type"), body))
        if self.path != f"/api/v1/nodes/{self.node['metadata']['name']}":
            return self._answer(404, {"kind": "Status", "code": 404})
        if self.command == "PATCH":
            assert body["metadata"]["resourceVersion"] == self.node["metadata"]["resourceVersion"]
            self.node["spec"].update(body["spec"])
        self._answer(200, self.node)

    do_GET = do_PATCH = do_DELETE = _handle

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def api_server():
    ApiServer.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), ApiServer)
    serve_in_background(server)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def node(labels: dict) -> dict:
    return {
        "metadata": {"name": NODE, "resourceVersion": "4711", "labels": labels},
        "spec": {"taints": [dict(GPU_NODE_TAINT)]},
    }


def test_a_karpenter_node_is_tainted_then_deleted(api_server):
    ApiServer.node = node({KARPENTER_NODEPOOL_LABEL: "gpu"})
    said = quarantine_node(NODE, (api_server, {"Authorization": "Bearer t"}, None))
    assert [(method, ctype) for method, _, ctype, _ in ApiServer.seen] == [
        ("GET", "application/json"),
        ("PATCH", "application/merge-patch+json"),
        ("DELETE", "application/json"),
    ]
    # The GPU taint stays, the quarantine taint is added: no pod of the restart tolerates it.
    assert ApiServer.node["spec"]["taints"] == [GPU_NODE_TAINT, QUARANTINE_TAINT]
    assert "deleted" in said


def test_a_node_group_node_is_only_tainted(api_server):
    ApiServer.node = node({"eks.amazonaws.com/nodegroup": "gpu"})
    said = quarantine_node(NODE, (api_server, {}, None))
    assert [method for method, *_ in ApiServer.seen] == ["GET", "PATCH"]
    assert QUARANTINE_TAINT in ApiServer.node["spec"]["taints"] and "deleted" not in said


def tolerated(tolerations: list[dict], taint: dict) -> bool:
    """Kubernetes "Taints and Tolerations": a toleration matches a taint with the same key and effect (or none),
    operator Exists, or Equal with the same value."""
    return any(
        t.get("key") in (None, taint["key"])
        and t.get("effect") in (None, "", taint["effect"])
        and (t.get("operator") == "Exists" or t.get("value") == taint["value"])
        for t in tolerations
    )


def test_the_restarted_pods_tolerate_the_gpu_taint_but_not_the_quarantine_and_know_their_node():
    pod = pod_spec(render())
    assert tolerated(pod["tolerations"], GPU_NODE_TAINT)
    assert not tolerated(pod["tolerations"], QUARANTINE_TAINT)
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env[NODE_NAME_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_only_the_job_pods_accounts_may_quarantine_and_only_their_own_node_with_only_the_taint():
    config = planned("eks-dev").config
    accounts = job_service_accounts(config, NAMESPACE)
    # `trainer` everywhere, never a namespace's `default` (checkov CKV_K8S_42).
    assert accounts == [
        (ns, TEAM_SERVICE_ACCOUNT) for ns in (NAMESPACE, *(f"team-{t.name}" for t in config.teams))
    ]
    role, binding, policy, policy_binding = quarantine_objects(accounts)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch", "delete"]}]
    assert [(s["namespace"], s["name"]) for s in binding["subjects"]] == accounts
    (condition,) = policy["spec"]["matchConditions"]
    assert all(f"'system:serviceaccount:{ns}:{sa}'" in condition["expression"] for ns, sa in accounts)
    own, only_taint = policy["spec"]["validations"]
    assert f"request.userInfo.extra['{NODE_NAME_EXTRA}'][0] == oldObject.metadata.name" in own["expression"]
    assert QUARANTINE_TAINT["key"] in only_taint["expression"]
    assert "object.metadata.labels == oldObject.metadata.labels" in only_taint["expression"]
    assert (policy_binding["spec"]["policyName"], policy_binding["spec"]["validationActions"]) == (
        NAME,
        ["Deny"],
    )


def test_the_stack_creates_the_quarantine_objects():
    eks_stack = planned("eks-dev")
    kinds = {
        r.inputs["kind"]
        for r in eks_stack.plan.resources
        if r.type.startswith("kubernetes:") and r.inputs.get("metadata", {}).get("name") == NAME
    }
    assert kinds == {
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
