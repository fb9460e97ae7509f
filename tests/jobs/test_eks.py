"""`make train|status|logs|cancel STACK=<eks env>` end to end: moto for STS, EKS, ECR and S3, and a loopback HTTP
server standing in for the cluster's API server. The stand-in authenticates the bearer token the way EKS's
authenticator does (refuses one signed more than 15 minutes ago, decodes it and replays the presigned STS
GetCallerIdentity URL, with the cluster's name in `x-k8s-aws-id`, against STS), records every JobSet it receives and checks it against the pinned JobSet CRD schema
with unknown fields rejected."""

from __future__ import annotations

import base64
import copy
import ipaddress
import json
import re
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

import pytest
import requests
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support.servers import serve_in_background
from trainer.__main__ import main as trainer_main
from trainer.aws.outputs import load_outputs
from trainer.contract.container import SUBMISSION_ENV
from trainer.jobs.eks import K8S_AWS_ID_HEADER, TOKEN_PREFIX, TOKEN_VALID_SECONDS, connect, eks_token

from .conftest import DATASET, IMAGE_TAG, REGION, TOKENIZER, Stack, without_submission_env
from .jobset_schema import jobset_errors
from .test_smoke import PASSED_REPORT, export_tokens
from .test_teams import team_data

CLUSTER = "trainstack-eks-test"
NAMESPACE = "trainstack"
CONFIG = "trainer/configs/llama3-8b.yaml"
DATA = ["--set", f"data.prefixes=[{DATASET}]", "--set", f"data.tokenizer_path={TOKENIZER}"]
JOBSETS = re.compile(r"^/apis/jobset\.x-k8s\.io/v1alpha2/namespaces/([^/]+)/jobsets(?:/([^/?]+))?$")
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/?]+)/log)?$")


def decode_token(token: str) -> str:
    """The presigned URL inside a `k8s-aws-v1.` token (base64url, padding stripped)."""
    body = token.removeprefix(TOKEN_PREFIX)
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()


@dataclass
class ApiServer:
    """What the stand-in has seen and holds: callers, created JobSets by namespace, deletions, pods and their logs."""

    cluster: str
    endpoint: str = ""
    callers: list[str] = field(default_factory=list)
    received: list[dict] = field(default_factory=list)
    namespaces: dict[str, dict[str, dict]] = field(default_factory=dict)
    deletions: list[dict] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)  # every authenticated (method, path)
    pods: list[dict] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)
    # What the controller and the pods do once a JobSet is created (a test sets it: a run that completes).
    on_create: Callable[[dict], None] | None = None
    ca: bytes = b"-----BEGIN CERTIFICATE-----\n"  # its certificate when it serves TLS
    now: Callable[[], datetime] = lambda: datetime.now(UTC)  # the authenticator's clock (a test's fake one)

    def authenticate(self, header: str) -> str | None:
        """The caller's ARN, as the authenticator learns it from STS, or None for a token it refuses."""
        if not header.startswith(f"Bearer {TOKEN_PREFIX}"):
            return None
        url = decode_token(header.removeprefix("Bearer "))
        query = parse_qs(urlparse(url).query)
        if query.get("Action") != ["GetCallerIdentity"]:
            return None
        if K8S_AWS_ID_HEADER not in query.get("X-Amz-SignedHeaders", [""])[0].split(";"):
            return None
        # aws-iam-authenticator pkg/token/token.go: valid 15 minutes after X-Amz-Date, whatever X-Amz-Expires says.
        signed = datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        if self.now() - signed > timedelta(seconds=TOKEN_VALID_SECONDS):
            return None
        # moto's server picks the service from an Authorization header's credential scope; a presigned URL carries
        # that scope in X-Amz-Credential (real STS needs no such header).
        routing = f"AWS4-HMAC-SHA256 Credential={query['X-Amz-Credential'][0]}"
        headers = {K8S_AWS_ID_HEADER: self.cluster, "Authorization": routing}
        replay = requests.get(url, headers=headers, timeout=10)
        match = re.search(r"<Arn>([^<]+)</Arn>", replay.text)
        return match.group(1) if replay.ok and match else None

    @property
    def jobsets(self) -> dict[str, dict]:
        """The JobSets in the stack's own namespace, by name."""
        return self.namespaces.setdefault(NAMESPACE, {})


def handler_for(server: ApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def reply(self, status: int, body: object) -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def status(self, code: int, reason: str) -> None:
            self.reply(
                code,
                {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code},
            )

        def body(self) -> dict:
            length = int(self.headers.get("Content-Length", 0))
            return json.loads(self.rfile.read(length) or b"{}")

        def caller_ok(self) -> bool:
            caller = server.authenticate(self.headers.get("Authorization", ""))
            if caller is None:
                self.status(401, "Unauthorized")
                return False
            server.callers.append(caller)
            server.requests.append((self.command, self.path))
            return True

        def do_POST(self) -> None:
            if not self.caller_ok():
                return
            if not (match := JOBSETS.match(urlparse(self.path).path)) or match.group(2):
                return self.status(404, "NotFound")
            jobset = self.body()
            server.received.append(copy.deepcopy(jobset))
            if errors := jobset_errors(jobset):
                return self.status(422, "Invalid: " + "; ".join(errors))
            # The API server refuses an object whose namespace is not the request's (400 BadRequest, "the namespace
            # of the provided object does not match the namespace sent on the request").
            if jobset["metadata"].get("namespace", match.group(1)) != match.group(1):
                return self.status(400, "BadRequest")
            name, held = jobset["metadata"]["name"], server.namespaces.setdefault(match.group(1), {})
            if name in held:
                return self.status(409, "AlreadyExists")
            jobset["metadata"]["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            held[name] = jobset
            self.reply(201, jobset)
            if server.on_create:
                server.on_create(jobset)

        def do_GET(self) -> None:
            if not self.caller_ok():
                return
            url = urlparse(self.path)
            if match := JOBSETS.match(url.path):
                held = server.namespaces.get(match.group(1), {})
                if match.group(2) is None:
                    return self.reply(200, {"kind": "JobSetList", "items": list(held.values())})
                found = held.get(match.group(2))
                return self.reply(200, found) if found else self.status(404, "NotFound")
            if match := PODS.match(url.path):
                if match.group(2):
                    return self.reply(200, server.logs[match.group(2)])
                selector = dict(
                    term.split("=", 1) for term in unquote(parse_qs(url.query)["labelSelector"][0]).split(",")
                )
                pods = [
                    p
                    for p in server.pods
                    if p["metadata"]["namespace"] == match.group(1)
                    and selector.items() <= p["metadata"]["labels"].items()
                ]
                return self.reply(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods})
            self.status(404, "NotFound")

        def do_DELETE(self) -> None:
            if not self.caller_ok():
                return
            match = JOBSETS.match(urlparse(self.path).path)
            held = server.namespaces.get(match.group(1), {}) if match else {}
            if not match or match.group(2) not in held:
                return self.status(404, "NotFound")
            server.deletions.append({"name": match.group(2), "namespace": match.group(1), **self.body()})
            self.reply(200, held.pop(match.group(2)))

    return Handler


def self_signed(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key, as PEM files (certificate, key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


@pytest.fixture
def api_server(request, tmp_path: Path) -> Iterator[ApiServer]:
    """The stand-in on plain HTTP, or over TLS with a certificate of its own (indirect parameter "tls")."""
    state = ApiServer(CLUSTER)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(state))
    scheme = "http"
    if getattr(request, "param", None) == "tls":
        cert_file, key_file = self_signed(tmp_path, "api-server")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
        state.ca = cert_file.read_bytes()
        scheme = "https"
    state.endpoint = f"{scheme}://127.0.0.1:{httpd.server_address[1]}"
    serve_in_background(httpd)
    yield state
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def eks_stack(stack: Stack, api_server: ApiServer) -> Stack:
    """The moto stack of conftest.py as an EKS stack: a cluster in moto, the stand-in as its endpoint."""
    stack.client("eks").create_cluster(
        name=CLUSTER,
        roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": [], "endpointPrivateAccess": True},
    )
    outputs = {k: v for k, v in stack.outputs.items() if k not in ("job_queue", "job_definition")}
    outputs.update(
        orchestrator="eks",
        eks_cluster_name=CLUSTER,
        eks_cluster_endpoint=api_server.endpoint,
        eks_cluster_ca=base64.b64encode(api_server.ca).decode(),
        k8s_namespace=NAMESPACE,
        kueue_local_queue="training",
        fsx_claim="fsx",
        efa_devices_per_node=32,
    )
    stack.outputs_file.write_text(json.dumps(outputs))
    stack.outputs = outputs
    return stack


def trainer(stack: Stack, capsys, verb: str, *argv: str) -> tuple[int, str, str]:
    status = trainer_main([*verb.split(), "--stack", "test", "--outputs", str(stack.outputs_file), *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def submit(stack: Stack, capsys, run: str = "llama-eks", *argv: str) -> tuple[int, str, str]:
    return trainer(
        stack, capsys, "submit", "--config", CONFIG, "--image", IMAGE_TAG, "--run", run, *argv, *DATA
    )


def test_the_token_is_a_presigned_get_caller_identity_url_with_the_cluster_signed_in(stack):
    token = eks_token(CLUSTER, REGION)
    assert token.startswith("k8s-aws-v1.") and not token.endswith("=")
    query = parse_qs(urlparse(decode_token(token)).query)
    assert query["Action"] == ["GetCallerIdentity"] and query["Version"] == ["2011-06-15"]
    assert query["X-Amz-Expires"] == ["60"]
    assert query["X-Amz-SignedHeaders"][0].split(";") == ["host", K8S_AWS_ID_HEADER]
    assert ApiServer(CLUSTER).authenticate(f"Bearer {token}") == "arn:aws:sts::123456789012:user/moto"


class FakeClock:
    """One clock for the token's age (monotonic seconds), its signing time (botocore's) and the authenticator's."""

    def __init__(self) -> None:
        self.start, self.seconds = datetime.now(UTC), 0.0

    def monotonic(self) -> float:
        return self.seconds

    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.seconds)


def test_the_token_is_made_again_before_the_authenticator_would_refuse_it(eks_stack, api_server, monkeypatch):
    """A `make logs FOLLOW=1` that polls a JobSet Kueue holds for an hour: every request is authenticated."""
    clock = FakeClock()
    monkeypatch.setattr("botocore.auth.get_current_datetime", lambda: clock.now().replace(tzinfo=None))
    api_server.now = clock.now
    cluster = connect(load_outputs("test", str(eks_stack.outputs_file)), clock.monotonic)
    first = cluster.api.configuration.api_key["authorization"]
    tokens = set()
    for _ in range(60):  # a poll a minute
        assert cluster.jobsets() == []
        tokens.add(cluster.api.configuration.api_key["authorization"])
        clock.seconds += 60
    assert len(api_server.callers) == 60
    assert 4 <= len(tokens) <= 5  # one per 13 minutes, not one per request
    # The failing case: the first token, kept, is refused once 15 minutes have passed since it was signed.
    assert api_server.authenticate(f"Bearer {first}") is None
    clock.seconds = TOKEN_VALID_SECONDS - 1  # and accepted until then
    assert api_server.authenticate(f"Bearer {first}") is not None


def test_make_train_submits_exactly_the_jobset_make_render_prints(eks_stack, api_server, capsys):
    status, rendered, err = trainer(
        eks_stack, capsys, "render", "--config", CONFIG, "--image", IMAGE_TAG, "--run", "llama-eks", *DATA
    )
    assert status == 0, err
    status, out, err = submit(eks_stack, capsys)
    assert status == 0, err
    (received,) = api_server.received
    sent = copy.deepcopy(received)
    container = sent["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    container["env"], moment = without_submission_env(container["env"])
    assert sent == yaml.safe_load(rendered)  # and the moment's values, nothing else
    assert set(moment) == set(SUBMISSION_ENV)
    assert jobset_errors(received) == []
    # Two calls, each as the caller: the run's JobSets listed (one job per run), then the JobSet created.
    assert api_server.callers == ["arn:aws:sts::123456789012:user/moto"] * 2
    assert "job id:     llama-eks" in out
    assert "make logs STACK=test JOB=llama-eks FOLLOW=1" in out
    pod = received["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == f"{eks_stack.outputs['ecr_repository_url']}:{IMAGE_TAG}"


def test_the_pre_submit_checks_still_run_on_eks(eks_stack, api_server, capsys):
    status, _, err = trainer(
        eks_stack, capsys, "submit", "--config", CONFIG, "--image", "not-pushed", "--run", "llama-eks", *DATA
    )
    assert status == 2
    assert "IMAGE=not-pushed: no such tag" in err
    missing = ["--set", "data.prefixes=[/fsx/datasets/none]", "--set", f"data.tokenizer_path={TOKENIZER}"]
    status, _, err = trainer(eks_stack, capsys, "submit", "--config", CONFIG, "--image", IMAGE_TAG, *missing)
    assert status == 2 and "s3://trainstack-test-datasets/none.bin not found" in err
    assert api_server.received == []


def test_a_missing_cluster_is_named_before_anything_is_sent(eks_stack, api_server, capsys):
    eks_stack.client("eks").delete_cluster(name=CLUSTER)
    status, _, err = submit(eks_stack, capsys)
    assert status == 2
    assert f"EKS cluster '{CLUSTER}' does not exist in us-east-1; run make up STACK=test" in err
    assert api_server.received == []


def test_an_eks_run_name_must_be_a_dns_label(eks_stack, api_server, capsys):
    status, _, err = submit(eks_stack, capsys, "Llama_EKS")
    assert status == 2 and "RUN='Llama_EKS': on EKS the run names the JobSet" in err
    assert api_server.received == []


def test_a_run_that_exists_and_a_refused_token_are_one_line_each(eks_stack, api_server, capsys):
    assert submit(eks_stack, capsys)[0] == 0
    api_server.jobsets["llama-eks"]["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}
    status, _, err = submit(eks_stack, capsys)  # ended, so no job of the run is live, but its name is taken
    assert status == 1
    assert "HTTP 409, it already exists: choose another RUN, or REPLACE=1 to delete the old one first" in err
    api_server.cluster = "another-cluster"  # STS answers, but for another cluster's id the token is refused
    api_server.authenticate = lambda header: None  # type: ignore[method-assign]
    status, _, err = submit(eks_stack, capsys, "llama-two")
    assert status == 1 and "HTTP 401, the token was refused" in err


def test_a_live_jobset_of_the_run_refuses_a_second_and_replace_deletes_it_first(
    eks_stack, api_server, capsys
):
    assert submit(eks_stack, capsys)[0] == 0  # SUBMITTED: Kueue has not admitted it yet
    status, _, err = submit(eks_stack, capsys)
    assert status == 2 and len(api_server.received) == 1 and api_server.deletions == []
    assert "RUN=llama-eks: job llama-eks of this run is SUBMITTED on stack test" in err
    assert "make cancel STACK=test JOB=llama-eks" in err and "REPLACE=1" in err
    status, out, err = submit(eks_stack, capsys, "llama-eks", "--replace")
    assert status == 0, err
    assert "replacing run 'llama-eks': stopping llama-eks (SUBMITTED)" in out
    assert [d["name"] for d in api_server.deletions] == ["llama-eks"]
    assert len(api_server.received) == 2 and "llama-eks" in api_server.jobsets


def test_an_unreachable_api_server_is_named(eks_stack, api_server, capsys):
    outputs = {**eks_stack.outputs, "eks_cluster_endpoint": "http://127.0.0.1:9"}
    eks_stack.outputs_file.write_text(json.dumps(outputs))
    status, _, err = submit(eks_stack, capsys)
    assert status == 1 and "cannot reach http://127.0.0.1:9" in err


def pod(name: str, jobset: str, index: int, restarts: int = 0, namespace: str = NAMESPACE) -> dict:
    labels = {
        "jobset.sigs.k8s.io/jobset-name": jobset,
        "jobset.sigs.k8s.io/restart-attempt": str(restarts),
        "batch.kubernetes.io/job-completion-index": str(index),
    }
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels}}


def test_status_logs_and_cancel_on_an_eks_stack(eks_stack, api_server, capsys):
    assert submit(eks_stack, capsys)[0] == 0
    status, out, err = trainer(eks_stack, capsys, "job status")
    assert status == 0, err
    assert re.search(r"^llama-eks  SUBMITTED llama-eks\s+created \d{4}-\d\d-\d\d", out, re.M)
    # The controller's view: one restart so far, both pods active; node rank 0 of attempt 1 has logged.
    api_server.jobsets["llama-eks"]["status"] = {
        "restarts": 1,
        "replicatedJobsStatus": [{"name": "node", "active": 1, "ready": 1}],
    }
    api_server.pods = [
        pod("llama-eks-node-0-0-old", "llama-eks", 0, 0),
        pod("llama-eks-node-0-0-abc", "llama-eks", 0, 1),
    ]
    api_server.logs["llama-eks-node-0-0-abc"] = "step 1 loss 10.1\nstep 2 loss 9.7\n"
    status, out, err = trainer(eks_stack, capsys, "job status", "--job", "llama-eks")
    assert status == 0, err
    assert "job llama-eks (llama-eks): RUNNING" in out
    assert "  attempts: 2" in out and "  nodes:    4" in out
    assert "pod llama-eks-node-0-0-abc in namespace trainstack" in out
    assert "health:   no health report yet (s3://trainstack-test-checkpoints/llama-eks/health.json)" in out
    status, out, err = trainer(eks_stack, capsys, "job logs", "--job", "llama-eks")
    assert status == 0, err
    assert out.splitlines() == ["step 1 loss 10.1", "step 2 loss 9.7"]
    status, out, err = trainer(eks_stack, capsys, "job cancel", "--job", "llama-eks")
    assert status == 0, err
    assert "job llama-eks: deletion requested (was RUNNING); each pod gets SIGTERM" in out
    assert api_server.deletions[0]["name"] == "llama-eks"
    assert api_server.deletions[0]["propagationPolicy"] == "Foreground"


def test_cancel_of_an_ended_jobset_and_of_an_unknown_one(eks_stack, api_server, capsys):
    assert submit(eks_stack, capsys)[0] == 0
    api_server.jobsets["llama-eks"]["status"] = {
        "conditions": [{"type": "Completed", "status": "True", "message": "jobset completed successfully"}]
    }
    status, _, err = trainer(eks_stack, capsys, "job cancel", "--job", "llama-eks")
    assert status == 2 and "job llama-eks already ended (SUCCEEDED); nothing to cancel" in err
    status, _, err = trainer(eks_stack, capsys, "job status", "--job", "nope")
    assert status == 2 and "read JobSet nope in namespace trainstack" in err and "HTTP 404" in err
    status, _, err = trainer(eks_stack, capsys, "job cancel")
    assert status == 2 and "cancel needs the job: make cancel STACK=<env> JOB=<name>" in err


def test_make_smoke_on_eks_prints_the_same_report_as_on_batch(eks_stack, api_server, capsys):
    def preflight_passes(jobset: dict) -> None:
        name = jobset["metadata"]["name"]
        jobset["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}
        api_server.pods = [pod(f"{name}-node-0-0-x", name, 0)]
        api_server.logs[f"{name}-node-0-0-x"] = "\n".join(["torchrun noise", *PASSED_REPORT])

    api_server.on_create = preflight_passes
    export_tokens(eks_stack, "smoke-eks")
    status, out, err = trainer(
        eks_stack, capsys, "smoke", "--image", IMAGE_TAG, "--run", "smoke-eks", "--poll-s", "0.1",
        "--export-timeout-s", "0",
    )  # fmt: skip
    assert status == 0, out + err
    (received,) = api_server.received
    assert jobset_errors(received) == []
    job = received["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["parallelism"] == 2
    assert job["template"]["spec"]["containers"][0]["args"][:2] == ["--skip-preflight", "preflight"]
    lines = out.splitlines()
    assert [line for line in lines if line.startswith("preflight")] == PASSED_REPORT
    assert "torchrun noise" not in out
    assert lines[-1] == "smoke: passed (job smoke-eks SUCCEEDED)"


def test_logs_follow_streams_node_rank_zeros_pod_once_it_exists(eks_stack, api_server, capsys):
    assert submit(eks_stack, capsys)[0] == 0
    api_server.jobsets["llama-eks"]["status"] = {"replicatedJobsStatus": [{"name": "node", "active": 4}]}
    api_server.pods = [pod("llama-eks-node-0-0-abc", "llama-eks", 0)]
    api_server.logs["llama-eks-node-0-0-abc"] = "".join(
        f"step {i} loss {10 - i / 10:.1f}\n" for i in range(2000)
    )
    status, out, err = trainer(eks_stack, capsys, "job logs", "--follow")
    assert status == 0, err
    lines = out.splitlines()
    assert len(lines) == 2000 and lines[0] == "step 0 loss 10.0" and lines[-1] == "step 1999 loss -189.9"


@pytest.mark.parametrize("api_server", ["tls"], indirect=True)
def test_the_ca_from_the_outputs_verifies_the_api_servers_certificate(
    eks_stack, api_server, capsys, tmp_path
):
    status, _, err = submit(eks_stack, capsys)
    assert status == 0, err
    assert len(api_server.received) == 1
    other_ca, _ = self_signed(tmp_path, "someone-else")
    outputs = {**eks_stack.outputs, "eks_cluster_ca": base64.b64encode(other_ca.read_bytes()).decode()}
    eks_stack.outputs_file.write_text(json.dumps(outputs))
    status, _, err = submit(eks_stack, capsys, "llama-two")
    assert status == 1 and "cannot reach https://127.0.0.1:" in err and "CERTIFICATE_VERIFY_FAILED" in err
    assert len(api_server.received) == 1


# An EKS stack shared by two teams (infra/eks_teams.py): each team's JobSets go to, and are found in, its namespace.
TEAM_NAMESPACES = {"vision": "team-vision", "language": "team-language"}


@pytest.fixture
def teams_stack(eks_stack: Stack) -> Stack:
    outputs = {
        **eks_stack.outputs,
        "teams": list(TEAM_NAMESPACES),
        "team_gpu_quotas": dict.fromkeys(TEAM_NAMESPACES, 32),
        "team_namespaces": TEAM_NAMESPACES,
    }
    eks_stack.outputs_file.write_text(json.dumps(outputs))
    eks_stack.outputs = outputs
    for team in TEAM_NAMESPACES:
        team_data(eks_stack, team)
    return eks_stack


def team_argv(team: str) -> list[str]:
    """--team and the team's copy of the corpus (under its own prefix, as make data TEAM= LOCAL=1 puts it)."""
    data = f"/fsx/datasets/teams/{team}/corpus/corpus"
    return [
        "--team",
        team,
        "--set",
        f"data.prefixes=[{data}]",
        "--set",
        f"data.tokenizer_path={data}.tokenizer.json",
    ]


def test_a_team_submits_into_its_namespace_with_its_queue_service_account_and_prefix(
    teams_stack, api_server, capsys
):
    job = ("--config", CONFIG, "--image", IMAGE_TAG, "--run", "llama-eks", *team_argv("vision"))
    status, rendered, err = trainer(teams_stack, capsys, "render", *job)
    assert status == 0, err
    status, out, err = trainer(teams_stack, capsys, "submit", *job)
    assert status == 0, err
    (received,) = api_server.received
    assert jobset_errors(received) == []
    assert list(api_server.namespaces) == [
        "team-vision"
    ]  # the request's namespace: the team's, not the stack's
    sent = copy.deepcopy(received)
    pod_template = sent["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    container = pod_template["spec"]["containers"][0]
    container["env"], _ = without_submission_env(container["env"])
    assert sent == yaml.safe_load(rendered)
    assert sent["metadata"]["namespace"] == "team-vision"
    assert sent["metadata"]["labels"] == {
        "kueue.x-k8s.io/queue-name": "training",  # every team's LocalQueue has the stack's queue name
        "trainstack.dev/run": "llama-eks",
        "team": "vision",
    }
    assert pod_template["metadata"]["labels"]["team"] == "vision"
    assert (
        pod_template["spec"]["serviceAccountName"] == "trainer"
    )  # its Pod Identity reads teams/vision/ only
    assert "logging.run_dir=/fsx/checkpoints/teams/vision/llama-eks" in container["args"]
    assert "(s3://trainstack-test-checkpoints/teams/vision/llama-eks)" in out
    assert (
        "in namespace team-vision" in out and "make logs STACK=test TEAM=vision JOB=llama-eks FOLLOW=1" in out
    )
    # One job per run, in the team's namespace: vision's live run refuses a second, language's of one name is apart.
    status, _, err = trainer(teams_stack, capsys, "submit", *job)
    assert status == 2 and "job llama-eks of this run is SUBMITTED" in err
    assert "make cancel STACK=test TEAM=vision JOB=llama-eks" in err
    language = ("--config", CONFIG, "--image", IMAGE_TAG, "--run", "llama-eks", *team_argv("language"))
    status, _, err = trainer(teams_stack, capsys, "submit", *language)
    assert status == 0, err
    assert {ns: list(held) for ns, held in api_server.namespaces.items()} == {
        "team-vision": ["llama-eks"],
        "team-language": ["llama-eks"],
    }


def test_status_logs_and_cancel_find_a_teams_jobset_in_its_namespace(teams_stack, api_server, capsys):
    run = ("--config", CONFIG, "--image", IMAGE_TAG, "--run", "llama-eks", *team_argv("vision"))
    assert trainer(teams_stack, capsys, "submit", *run)[0] == 0
    status, out, err = trainer(teams_stack, capsys, "job status", "--team", "vision")
    assert status == 0, err
    assert re.search(r"^llama-eks  SUBMITTED llama-eks", out, re.M)
    status, out, err = trainer(teams_stack, capsys, "job status", "--team", "language")
    assert status == 0 and "no jobs in namespace 'team-language'" in out
    api_server.namespaces["team-vision"]["llama-eks"]["status"] = {
        "replicatedJobsStatus": [{"name": "node", "active": 1}]
    }
    api_server.pods = [pod("llama-eks-node-0-0-abc", "llama-eks", 0, namespace="team-vision")]
    api_server.logs["llama-eks-node-0-0-abc"] = "step 1 loss 10.1\n"
    status, out, err = trainer(teams_stack, capsys, "job status", "--team", "vision", "--job", "llama-eks")
    assert status == 0, err
    assert "pod llama-eks-node-0-0-abc in namespace team-vision (make logs STACK=test TEAM=vision" in out
    assert "no health report yet (s3://trainstack-test-checkpoints/teams/vision/llama-eks/health.json)" in out
    status, out, err = trainer(teams_stack, capsys, "job logs", "--team", "vision", "--job", "llama-eks")
    assert status == 0 and out.splitlines() == ["step 1 loss 10.1"], err
    status, out, err = trainer(teams_stack, capsys, "job cancel", "--team", "vision", "--job", "llama-eks")
    assert status == 0, err
    assert (
        api_server.deletions[0]["name"] == "llama-eks"
        and api_server.deletions[0]["namespace"] == "team-vision"
    )


def test_a_teams_smoke_jobset_runs_and_is_read_back_in_its_namespace_under_its_prefix(
    teams_stack, api_server, capsys
):
    def preflight_passes(jobset: dict) -> None:
        name = jobset["metadata"]["name"]
        jobset["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}
        api_server.pods = [pod(f"{name}-node-0-0-x", name, 0, namespace="team-vision")]
        api_server.logs[f"{name}-node-0-0-x"] = "\n".join(PASSED_REPORT)

    api_server.on_create = preflight_passes
    export_tokens(teams_stack, "teams/vision/smoke-eks")
    status, out, err = trainer(
        teams_stack, capsys, "smoke", "--image", IMAGE_TAG, "--run", "smoke-eks", "--team", "vision",
        "--poll-s", "0.1", "--export-timeout-s", "0",
    )  # fmt: skip
    assert status == 0, out + err
    (received,) = api_server.received
    assert jobset_errors(received) == []
    assert list(api_server.namespaces) == ["team-vision"]
    assert received["metadata"]["labels"]["team"] == "vision"
    args = received["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert args[-1] == "/fsx/checkpoints/teams/vision/smoke-eks/preflight"
    assert "namespace team-vision" in out
    assert [line for line in out.splitlines() if line.startswith("preflight")] == PASSED_REPORT
    assert out.splitlines()[-1] == "smoke: passed (job smoke-eks SUCCEEDED)"


@pytest.mark.parametrize(
    ("verb", "argv", "message"),
    [
        ("submit", [], "stack 'test' is shared by teams vision, language: say which with TEAM=<name>"),
        (
            "submit",
            ["--team", "audio"],
            "TEAM=audio: not a team of stack 'test'; its teams are vision, language",
        ),
        ("job status", [], "stack 'test' is shared by teams vision, language: say which with TEAM=<name>"),
        ("smoke", [], "stack 'test' is shared by teams vision, language: say which with TEAM=<name>"),
        (
            "job cancel",
            ["--job", "x", "--team", "audio"],
            "TEAM=audio: not a team of stack 'test'; its teams are",
        ),
    ],
)
def test_a_stack_with_teams_wants_one_of_its_teams(teams_stack, api_server, capsys, verb, argv, message):
    if verb == "submit":
        argv = ["--config", CONFIG, "--image", IMAGE_TAG, "--run", "llama-eks", *argv, *DATA]
    if verb == "smoke":
        argv = ["--image", IMAGE_TAG, "--no-wait", *argv]
    status, _, err = trainer(teams_stack, capsys, verb, *argv)
    assert status == 2 and message in err
    assert api_server.received == [] and api_server.callers == []
