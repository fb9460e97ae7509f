"""The documented team workflow on an EKS stack (docs/eks.md#teams) run as the team role: every AWS call checked
against the team's IAM policies, every request to the API server against the team's RBAC grants.

The AWS side is the eks-dev stack as the Pulumi program plans it (its buckets, repository and cluster by their planned
names, in the moto server), and team vision's role assumed through moto's STS, as in test_team_workflow.py. The
cluster is the loopback API server of test_eks.py, which authenticates each request's token against STS as
aws-iam-authenticator does and records it. As that role, in this process: `trainer upload --team vision`,
`make train STACK=eks-dev TEAM=vision`, `make status` (the list, then the JobSet), `make logs`, `make cancel`,
`make smoke TEAM=vision NOWAIT=1`, `make finetune TEAM=vision` twice (the training JobSet, then, once it completed,
the stages JobSet) and `make sweep TEAM=vision PARALLEL=2`.

Each botocore call becomes the IAM requests it authorises (test_team_workflow.AUTHORISATIONS) and is decided against
the two policies the role holds: the stack's shared team policy (infra/teams.py) and its role's own
`eks:DescribeCluster` (infra/eks_teams.py). Each API-server request becomes the RBAC request the API server's
request-info resolver makes of it (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/endpoints/request/
requestinfo.go: POST -> create, GET of a collection -> list, of an object -> get, DELETE -> delete, a subresource
such as pods/log its own resource) and is decided against the planned Roles and RoleBindings (policy/rbac.py) for a
member of the team's group, which is what the team role's access entry maps it to.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

import boto3
import pytest

from infra.eks_teams import team_group, team_namespace
from infra.mocks import ACCOUNT_ID
from policy.offline import policy_resources
from policy.rbac import Request as RbacRequest
from policy.rbac import allows, rbac_objects
from tests.infra.conftest import Planned, planned
from tests.support.servers import serve_in_background

from .conftest import IMAGE_TAG
from .test_eks import ApiServer, handler_for, pod
from .test_team_workflow import (
    Call,
    World,
    _assume_team_role,
    _team_suite,
    as_role,
    buckets_and_image,
    denials,
    fresh_moto_as_admin,
    run_verb,
    team_inputs,
)

pytestmark = pytest.mark.slow  # a whole workflow, verb after verb (make test runs it)

REGION = "us-east-1"  # eks-dev's
TEAM = "vision"
NAMESPACE = team_namespace(TEAM)
RUN = "llama-v"
DATA = f"/fsx/datasets/teams/{TEAM}/corpus/corpus"
CONFIG = "trainer/configs/llama3-8b.yaml"
# The API paths the workflow's client uses (JobSet v1alpha2, the pinned CRD's version; core v1 pods).
API_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/[^/]+)/namespaces/(?P<namespace>[^/]+)/(?P<resource>[^/]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<subresource>[^/]+))?)?$"
)


def rbac_request(method: str, path: str) -> RbacRequest:
    """What the API server's request-info resolver makes of one request (requestinfo.go: the verb from the method,
    list for a GET of a collection, watch with ?watch=true)."""
    url = urlparse(path)
    match = API_PATH.match(url.path)
    assert match, f"{method} {path}: not a namespaced resource path"
    name = match["name"] or ""
    verb = {"POST": "create", "DELETE": "delete", "PUT": "update", "PATCH": "patch"}.get(method)
    if verb is None:
        verb = "watch" if "watch=true" in url.query else ("get" if name else "list")
    return RbacRequest(
        verb, match["namespace"], match["group"] or "", match["resource"], match["subresource"] or "", name
    )


@dataclass
class Workflow:
    plan: Planned
    calls: list[Call]
    world: World
    api: ApiServer
    out: dict[str, str]

    @property
    def policies(self) -> list[str]:
        """Every policy the team role holds: the shared team policy and its own RolePolicy (FindTheCluster)."""
        (shared,) = self.plan.all("iam.Policy")
        own = self.plan.one("iam.RolePolicy", f"-team-{TEAM}-eks")
        return [shared.inputs["policy"], own.inputs["policy"]]

    @property
    def role_tags(self) -> dict[str, str]:
        return dict(self.plan.one("iam.Role", f"-team-{TEAM}").inputs["tags"])


def _build_stack(plan: Planned, api: ApiServer) -> dict[str, Any]:
    """The planned eks-dev stack in moto, as `make up` and `make push` leave it, and its outputs."""

    buckets, url = buckets_and_image(plan, REGION)
    cluster = plan.one("eks.Cluster").outputs["name"]
    boto3.client("eks", region_name=REGION).create_cluster(
        name=cluster,
        roleArn=f"arn:aws:iam::{ACCOUNT_ID}:role/eks",
        resourcesVpcConfig={"subnetIds": [], "endpointPrivateAccess": True},
    )
    teams = plan.config.teams
    return {
        "region": REGION,
        "orchestrator": "eks",
        "eks_cluster_name": cluster,
        "eks_cluster_endpoint": api.endpoint,
        "eks_cluster_ca": base64.b64encode(api.ca).decode(),
        "k8s_namespace": "trainstack",
        "kueue_local_queue": "training",
        "fsx_claim": "fsx",
        "efa_devices_per_node": 32,
        "ecr_repository_url": url,
        "datasets_bucket": buckets["datasets"],
        "checkpoints_bucket": buckets["checkpoints"],
        "fsx_file_system_id": "fs-0123456789abcdef0",
        "fsx_dns_name": f"fs-0123456789abcdef0.fsx.{REGION}.amazonaws.com",
        "fsx_mount_name": "abcdefgh",
        "kms_key_arn": plan.key_arn,
        "log_group": plan.config.jobs_log_group,
        "instance_type": "p5.48xlarge",
        "node_count": 4,
        "gpus_per_node": 8,
        "teams": [t.name for t in teams],
        "team_gpu_quotas": {t.name: t.gpu_quota for t in teams},
        "team_namespaces": {t.name: team_namespace(t.name) for t in teams},
        "allowed_regions": [REGION],
    }


@pytest.fixture(scope="module")
def workflow(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workflow]:
    """The whole workflow, run once for the module's tests as team vision's role."""
    mp = fresh_moto_as_admin(moto_endpoint)
    tmp = tmp_path_factory.mktemp("team-workflow-eks")
    plan = planned("eks-dev")  # its teams: vision and language (Pulumi.eks-dev.yaml)
    api = ApiServer(plan.one("eks.Cluster").outputs["name"])
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(api))
    api.endpoint = f"http://127.0.0.1:{httpd.server_address[1]}"
    serve_in_background(httpd)
    outputs = _build_stack(plan, api)
    outputs_file, prefix = team_inputs(tmp, outputs)
    team_session = _assume_team_role(plan)
    out: dict[str, str] = {}
    stack = ["--stack", "eks-dev", "--outputs", str(outputs_file)]
    team = ["--team", TEAM]
    with as_role(team_session) as recorder:
        out["upload"] = run_verb(["upload", *stack, "--prefix", str(prefix), "--name", "corpus", *team])
        data = ["--set", f"data.prefixes=[{DATA}]", "--set", f"data.tokenizer_path={DATA}.tokenizer.json"]
        train = ["submit", *stack, "--config", CONFIG, "--image", IMAGE_TAG, "--nodes", "2", "--run", RUN]
        out["train"] = run_verb([*train, *team, *data])
        api.namespaces[NAMESPACE][RUN]["status"] = {"replicatedJobsStatus": [{"name": "node", "active": 2}]}
        api.pods = [pod(f"{RUN}-node-0-0-abc", RUN, 0, namespace=NAMESPACE)]
        api.logs[f"{RUN}-node-0-0-abc"] = "step 1 loss 9.5\n"
        out["list"] = run_verb(["job", "status", *stack, *team])
        out["status"] = run_verb(["job", "status", *stack, *team, "--job", RUN])
        out["logs"] = run_verb(["job", "logs", *stack, *team, "--job", RUN])
        out["models"] = run_verb(["models", "list", *stack, *team])
        out["cancel"] = run_verb(["job", "cancel", *stack, *team, "--job", RUN])
        out["smoke"] = run_verb(
            ["smoke", *stack, "--image", IMAGE_TAG, "--run", "smoke-v", "--no-wait", *team]
        )
        finetune = ["finetune", *stack, *team, "--image", IMAGE_TAG, "--nodes", "2", "--run", "sft-v"]
        finetune += ["--dataset", "chat", "--suite", str(_team_suite(tmp, mp))]
        out["finetune"] = run_verb(finetune)
        api.namespaces[NAMESPACE]["sft-v"]["status"] = {
            "conditions": [{"type": "Completed", "status": "True"}]
        }
        out["finetune-stages"] = run_verb(finetune)
        out["sweep"] = run_verb(
            ["sweep-stack", *stack, "--sweep", "trainer/configs/llama3-8b-sweep.yaml", "--parallel", "2",
             "--image", IMAGE_TAG, "--no-follow", *team]
        )  # fmt: skip
    world = World(REGION, ACCOUNT_ID, outputs["kms_key_arn"], lambda job: {})
    yield Workflow(plan, recorder.calls, world, api, out)
    httpd.shutdown()
    httpd.server_close()
    mp.undo()


def test_the_eks_team_workflow_runs_as_the_team_role_and_every_aws_call_is_allowed(workflow):
    out = workflow.out
    assert "uploaded 3 files to s3://trainstack-eks-dev-datasets/teams/vision/corpus/" in out["upload"]
    assert "in namespace team-vision" in out["train"]
    assert re.search(rf"^{RUN}\s", out["list"], re.M)
    assert "step 1 loss 9.5" in out["logs"]
    assert "no model versions in s3://trainstack-eks-dev-checkpoints/teams/vision" in out["models"]
    assert "report later: make smoke STACK=eks-dev TEAM=vision JOB=" in out["smoke"]
    assert out["finetune"].startswith("train: submitted (job sft-v)")
    assert "stages: submitted (job sft-v-stages)" in out["finetune-stages"]
    assert "teams/vision/sweeps/llama3-8b-sweep/" in out["sweep"]
    wanted = {
        "eks.DescribeCluster",
        "ecr.DescribeImages",
        "s3.HeadObject",
        "s3.PutObject",
        "s3.ListObjectsV2",
    }
    assert wanted <= {str(c) for c in workflow.calls}
    assert denials(workflow.calls, workflow.policies, workflow.role_tags, workflow.world) == []


def test_without_its_eks_grant_the_role_could_not_find_the_cluster(workflow):
    shared, _ = workflow.policies
    found = denials(workflow.calls, [shared], workflow.role_tags, workflow.world)
    assert found and all(line.startswith("eks.DescribeCluster: eks:DescribeCluster on ") for line in found)


def test_every_api_server_request_is_in_the_teams_namespace_and_allowed_by_its_rbac(workflow):
    objects = rbac_objects(policy_resources(workflow.plan.plan))  # the planned Roles and RoleBindings
    seen = [rbac_request(method, path) for method, path in workflow.api.requests]
    verbs = {(r.verb, r.resource, r.subresource) for r in seen}
    # What the workflow asks of the cluster: create, list, get and delete JobSets, list pods, read a pod's log.
    for wanted in (("create", "jobsets", ""), ("list", "jobsets", ""), ("get", "jobsets", ""),
                   ("delete", "jobsets", ""), ("list", "pods", ""), ("get", "pods", "log")):  # fmt: skip
        assert wanted in verbs, sorted(verbs)
    member = ("arn:aws:sts::123456789012:assumed-role/x/ana", [team_group(TEAM)])
    refused = [r for r in seen if not allows(objects, *member, r)]
    assert refused == []
    assert {r.namespace for r in seen} == {NAMESPACE}
    other = [
        RbacRequest(r.verb, team_namespace("language"), r.api_group, r.resource, r.subresource, r.name)
        for r in seen
    ]
    assert not any(allows(objects, *member, r) for r in other)
