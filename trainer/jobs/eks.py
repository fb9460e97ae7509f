"""An EKS stack's API server, reached with the `kubernetes` client and the token `aws eks get-token` would print.

token    `k8s-aws-v1.` + base64url(an STS GetCallerIdentity URL presigned with the cluster's name in the signed
         `x-k8s-aws-id` header), unpadded: the scheme of aws/aws-cli 1.45.55
         awscli/customizations/eks/get_token.py (TokenGenerator, STSClientFactory); no kubectl or AWS CLI needed.
         Valid 15 minutes from its signing, so a long `make logs FOLLOW=1` gets a fresh one before each request
         once the last is 13 minutes old (`BearerToken`).
JobSets  create, read, list and delete in the stack's namespace, or a team's (trainer/jobs/teams.py job_namespace);
         the logs of the pod of node rank 0.
"""

from __future__ import annotations

import atexit
import base64
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from trainer.aws.clients import client
from trainer.aws.outputs import StackOutputs
from trainer.contract.jobset import JOBSET_NAME_KEY
from trainer.jobs.jobset import CONTAINER, JOBSET_API_VERSION
from trainer.jobs.teams import job_namespace

# aws/aws-cli 1.45.55 awscli/customizations/eks/get_token.py: TOKEN_PREFIX, K8S_AWS_ID_HEADER, URL_TIMEOUT (the
# X-Amz-Expires it signs, 60: STS ignores it) and TOKEN_EXPIRATION_MINS (14: the expirationTimestamp it reports).
TOKEN_PREFIX = "k8s-aws-v1."
K8S_AWS_ID_HEADER = "x-k8s-aws-id"
URL_TIMEOUT_SECONDS = 60
# The token's real life: kubernetes-sigs/aws-iam-authenticator pkg/token/token.go presignedURLExpiration ("presigned
# STS urls are valid for 15 minutes after timestamp in x-amz-date"; the authenticator refuses older ones whatever
# X-Amz-Expires says). A new one is made 14 minutes after signing, as the AWS CLI's expirationTimestamp tells
# client-go to, less a minute for this machine's clock and the request's time on the wire.
TOKEN_VALID_SECONDS = 15 * 60
TOKEN_REFRESH_SECONDS = 14 * 60 - 60
JOBSET_GROUP, JOBSET_VERSION = JOBSET_API_VERSION.split("/")
JOBSET_PLURAL = "jobsets"
# Labels on every pod of a JobSet: its name and restart count (jobset v0.12.0 jobset_controller.go
# labelAndAnnotateObject; pkg/constants RestartsKey), and the Indexed Job's index (Kubernetes
# batch.kubernetes.io/job-completion-index pod label).
RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


class ClusterError(RuntimeError):
    """The cluster cannot be reached or refused a request; the message says which and what to do."""


def eks_token(cluster_name: str, region: str) -> str:
    """The bearer token for `cluster_name`: valid for TOKEN_VALID_SECONDS from now (whatever X-Amz-Expires says)."""
    sts = client("sts", region)

    def keep_cluster_id(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if K8S_AWS_ID_HEADER in params:
            context[K8S_AWS_ID_HEADER] = params.pop(K8S_AWS_ID_HEADER)

    def sign_cluster_id(request: Any, **_: Any) -> None:
        if K8S_AWS_ID_HEADER in request.context:
            request.headers[K8S_AWS_ID_HEADER] = request.context[K8S_AWS_ID_HEADER]

    # The header is not a GetCallerIdentity parameter: it is moved aside before validation, added before signing.
    sts.meta.events.register("provide-client-params.sts.GetCallerIdentity", keep_cluster_id)
    sts.meta.events.register("before-sign.sts.GetCallerIdentity", sign_cluster_id)
    url = sts.generate_presigned_url(
        "get_caller_identity",
        Params={K8S_AWS_ID_HEADER: cluster_name},
        ExpiresIn=URL_TIMEOUT_SECONDS,
        HttpMethod="GET",
    )
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


@dataclass
class BearerToken:
    """The API client's `refresh_api_key_hook` (kubernetes client Configuration: called before every request): a new
    token once the one in use is TOKEN_REFRESH_SECONDS old, so polling and following outlive one token."""

    cluster_name: str
    region: str
    clock: Callable[[], float] = time.monotonic
    made_at: float | None = field(default=None, init=False)

    def __call__(self, configuration: k8s.Configuration) -> None:
        now = self.clock()
        if self.made_at is None or now - self.made_at >= TOKEN_REFRESH_SECONDS:
            configuration.api_key = {"authorization": eks_token(self.cluster_name, self.region)}
            self.made_at = now


def cluster_problems(outputs: StackOutputs) -> list[str]:
    """The EKS counterpart of the Batch queue check: the stack's cluster exists and is ACTIVE."""
    eks = client("eks", outputs.region)
    name = outputs["eks_cluster_name"]
    try:
        status = eks.describe_cluster(name=name)["cluster"]["status"]
    except eks.exceptions.ResourceNotFoundException:
        return [f"EKS cluster {name!r} does not exist in {outputs.region}; run make up STACK={outputs.stack}"]
    if status != "ACTIVE":
        return [
            f"EKS cluster {name!r} is {status}; wait until it is ACTIVE (aws eks describe-cluster --name {name})"
        ]
    return []


@dataclass
class Cluster:
    """The stack's API server and the namespace of the jobs at hand, through the `kubernetes` client."""

    outputs: StackOutputs
    api: k8s.ApiClient
    namespace: str

    def create_jobset(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return self._call(
            k8s.CustomObjectsApi(self.api).create_namespaced_custom_object,
            JOBSET_GROUP,
            JOBSET_VERSION,
            self.namespace,
            JOBSET_PLURAL,
            manifest,
            what=f"create JobSet {manifest['metadata']['name']}",
        )

    def jobset(self, name: str) -> dict[str, Any]:
        return self._call(
            k8s.CustomObjectsApi(self.api).get_namespaced_custom_object,
            JOBSET_GROUP,
            JOBSET_VERSION,
            self.namespace,
            JOBSET_PLURAL,
            name,
            what=f"read JobSet {name}",
        )

    def jobsets(self) -> list[dict[str, Any]]:
        listed = self._call(
            k8s.CustomObjectsApi(self.api).list_namespaced_custom_object,
            JOBSET_GROUP,
            JOBSET_VERSION,
            self.namespace,
            JOBSET_PLURAL,
            what="list JobSets",
        )
        return sorted(
            listed.get("items", []), key=lambda js: js["metadata"].get("creationTimestamp", ""), reverse=True
        )

    def delete_jobset(self, name: str) -> None:
        # Foreground: the JobSet goes once its Jobs and pods have; each pod gets SIGTERM, then its grace.
        self._call(
            k8s.CustomObjectsApi(self.api).delete_namespaced_custom_object,
            JOBSET_GROUP,
            JOBSET_VERSION,
            self.namespace,
            JOBSET_PLURAL,
            name,
            body=k8s.V1DeleteOptions(propagation_policy="Foreground"),
            what=f"delete JobSet {name}",
        )

    def leader_pod(self, jobset: dict[str, Any]) -> str | None:
        """The pod of node rank 0 in the JobSet's current attempt (the run's log), if it exists yet."""
        restarts = jobset.get("status", {}).get("restarts", 0)
        selector = (
            f"{JOBSET_NAME_KEY}={jobset['metadata']['name']},{RESTART_LABEL}={restarts},"
            f"{COMPLETION_INDEX_LABEL}=0"
        )
        pods = self._call(
            k8s.CoreV1Api(self.api).list_namespaced_pod,
            self.namespace,
            label_selector=selector,
            what="list pods",
        )
        return pods.items[0].metadata.name if pods.items else None

    def log_lines(self, pod: str, follow: bool = False) -> Iterator[str]:
        core = k8s.CoreV1Api(self.api)
        if not follow:
            text = self._call(
                core.read_namespaced_pod_log, pod, self.namespace, container=CONTAINER, what="read logs"
            )
            yield from text.splitlines()
            return
        response = self._call(
            core.read_namespaced_pod_log,
            pod,
            self.namespace,
            container=CONTAINER,
            follow=True,
            _preload_content=False,
            what="follow logs",
        )
        pending = b""
        for chunk in response.stream():  # chunks end anywhere, not at line ends
            *lines, pending = (pending + chunk).split(b"\n")
            yield from (line.decode(errors="replace") for line in lines)
        if pending:
            yield pending.decode(errors="replace")

    def _call(self, method: Any, *args: Any, what: str, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except ApiException as error:
            hint = {
                401: "the token was refused: check AWS credentials and the cluster's access entries",
                403: "forbidden: the caller's access entry lacks the rights in this namespace",
                404: "not found",
                409: "it already exists: choose another RUN, or REPLACE=1 to delete the old one first",
            }.get(error.status, error.reason)
            raise ClusterError(
                f"{what} in namespace {self.namespace} at {self.outputs['eks_cluster_endpoint']}: "
                f"HTTP {error.status}, {hint}"
            ) from None
        except (OSError, HTTPError) as error:  # urllib3 raises MaxRetryError once its retries are spent
            raise ClusterError(
                f"{what}: cannot reach {self.outputs['eks_cluster_endpoint']} ({error}); from inside the VPC or "
                "with the cluster's public endpoint allowed for this address"
            ) from None


def connect(
    outputs: StackOutputs, clock: Callable[[], float] = time.monotonic, *, team: str | None = None
) -> Cluster:
    """A client for the stack's API server in the namespace of `team`'s jobs (the stack's own for none): its
    endpoint and CA from the outputs, a token from STS made fresh before it expires (BearerToken)."""
    namespace = job_namespace(outputs, team)
    configuration = k8s.Configuration()
    configuration.host = outputs["eks_cluster_endpoint"]
    configuration.refresh_api_key_hook = BearerToken(outputs["eks_cluster_name"], outputs.region, clock)
    configuration.refresh_api_key_hook(configuration)  # the first token now: STS refusing it fails here
    configuration.api_key_prefix = {"authorization": "Bearer"}
    try:
        ca = base64.b64decode(outputs["eks_cluster_ca"], validate=True)
    except ValueError:
        raise ClusterError(
            f"stack {outputs.stack}: output eks_cluster_ca is not base64 (a PEM certificate)"
        ) from None
    # The client reads the CA from a file, when it first connects: the file lives until this process ends.
    with tempfile.NamedTemporaryFile("wb", prefix="trainstack-eks-ca-", suffix=".pem", delete=False) as pem:
        pem.write(ca)
    atexit.register(os.unlink, pem.name)
    configuration.ssl_ca_cert = pem.name
    return Cluster(outputs, k8s.ApiClient(configuration), namespace)


def jobset_status(jobset: dict[str, Any]) -> str:
    """The JobSet's state in Batch's words (SUBMITTED ... SUCCEEDED, FAILED), so both backends print alike."""
    status = jobset.get("status", {})
    conditions = {c["type"]: c.get("status") == "True" for c in status.get("conditions", [])}
    if conditions.get("Completed"):
        return "SUCCEEDED"
    if conditions.get("Failed"):
        return "FAILED"
    if conditions.get("Suspended") or jobset.get("spec", {}).get("suspend"):
        return "PENDING"  # Kueue holds it until the LocalQueue's quota admits the whole job
    if any(rjob.get("active", 0) or rjob.get("ready", 0) for rjob in status.get("replicatedJobsStatus", [])):
        return "RUNNING"
    return "STARTING" if status else "SUBMITTED"


def status_reason(jobset: dict[str, Any]) -> str | None:
    for condition in jobset.get("status", {}).get("conditions", []):
        if condition.get("status") == "True" and condition.get("message"):
            return f"{condition['type']}: {condition['message']}"
    return None


def created_at(jobset: dict[str, Any]) -> str:
    stamp = jobset["metadata"].get("creationTimestamp")
    if not stamp:
        return "-"
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).strftime("%Y-%m-%d %H:%M:%S UTC")
