"""The documented team workflow (docs/security.md#teams) run as the team role, every AWS call checked against the
team's policy.

A moto server holds the two-team prod stack as the Pulumi program plans it (its buckets, repository, key, roles and
job definition by their planned names and ARNs; the queue and definition by Pulumi's physical names), and the team
role (tagged team=vision), assumed through moto's STS. As that role, in this process: `make data STACK=prod
TEAM=vision LOCAL=1`'s upload, `make train STACK=prod TEAM=vision` (a new image: a new definition revision),
`make status` (the list, then the job with its health report), `make logs`, `models list --stack prod --team
vision`, `make cancel`, `make smoke TEAM=vision NOWAIT=1`, `make finetune TEAM=vision` twice (the training job,
then, once it succeeded, the stages job) and `make sweep STACK=prod TEAM=vision PARALLEL=2` (an array job on the
Spot queue, which shares the GPU queue's fair-share policy). botocore's
`before-call` event records every call with its parameters; each becomes the IAM requests it authorises (action,
resource ARN, condition keys: AUTHORISATIONS, each from the service's reference) and each request is decided
against the planned team policy by policy/iam_evaluation.py, with the role's tag as `aws:PrincipalTag/team`.
moto's own IAM enforcement judges S3 only: it authorises every other service against resource "*" and reads a
condition on a key the request lacks as an explicit deny (moto 5.2.5 core/responses.py call_action,
iam/access_control.py), so under it no scoped policy passes a single Batch call; for S3, where it checks the bucket
and object ARNs, the last test turns it on (moto.core.authorization.enable_iam_authentication) as a second judge.

A call no policy statement allows fails the test and is named; so does a call with no entry in AUTHORISATIONS, so a
new call in the workflow cannot pass unexamined; and every Allow statement of the policy must be needed by some
call (least privilege): dropping any one of them denies a named call.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import botocore.handlers
import pytest
import requests
import yaml
from botocore.exceptions import ClientError
from moto.batch.models import batch_backends
from moto.core.authorization import enable_iam_authentication

from infra.mocks import ACCOUNT_ID
from policy.actors import register_context
from policy.iam_evaluation import Request, decide
from tests.infra.conftest import Planned, _variant
from trainer.__main__ import main as trainer_main
from trainer.jobs import finetune as finetune_driver

from .conftest import IMAGE_TAG
from .test_upload import write_dataset

TEAMS = [
    {"name": "vision", "gpuQuota": 16, "members": [f"arn:aws:iam::{ACCOUNT_ID}:role/vision-engineers"]},
    {"name": "speech", "gpuQuota": 32, "members": [f"arn:aws:iam::{ACCOUNT_ID}:role/speech-engineers"]},
]
pytestmark = pytest.mark.slow  # a whole workflow, verb after verb (make test runs it)

REGION = "us-west-2"  # prod's
# The physical names Pulumi gives the queue and the job definition: <resource name>-<7 hex>.
QUEUE = "trainstack-prod-gpu-1a2b3c4"
DEFINITION = "trainstack-prod-train-5d6e7f8"
SPOT_QUEUE, SPOT_DEFINITION = "trainstack-prod-spot-9a8b7c6", "trainstack-prod-spot-0f1e2d3"
RUN = "llama-v"
DATA = "/fsx/datasets/teams/vision/corpus/corpus"


@dataclass(frozen=True)
class Call:
    service: str
    operation: str
    params: dict[str, Any]

    def __str__(self) -> str:
        return f"{self.service}.{self.operation}"


@dataclass
class World:
    """What a request's ARNs and condition keys need beyond its parameters."""

    region: str
    account: str
    kms_key_arn: str
    job_tags: Callable[[str], dict[str, str]]  # a job's tags as Batch holds them (aws:ResourceTag/<key>)

    def arn(self, service: str, resource: str) -> str:
        return f"arn:aws:{service}:{self.region}:{self.account}:{resource}"

    def batch_arn(self, kind: str, name_or_arn: str) -> str:
        return name_or_arn if name_or_arn.startswith("arn:") else self.arn("batch", f"{kind}/{name_or_arn}")


def _request_tags(tags: dict[str, str]) -> dict[str, Any]:
    """aws:RequestTag/<key> for each tag and aws:TagKeys (IAM User Guide, "Controlling access during AWS requests")."""
    return {**{f"aws:RequestTag/{k}": v for k, v in tags.items()}, "aws:TagKeys": list(tags)}


def _s3_object(action: str, *also: str) -> Callable[[Call, World], list[Request]]:
    def requests_(call: Call, world: World) -> list[Request]:
        found = [Request(action, f"arn:aws:s3:::{call.params['Bucket']}/{call.params['Key']}")]
        return found + [Request(kms, world.kms_key_arn) for kms in also]

    return requests_


def _register_job_definition(call: Call, world: World) -> list[Request]:
    """batch:RegisterJobDefinition on the definition, iam:PassRole on each role it names, and batch:TagResource for
    its tags (Service Authorization Reference, AWS Batch: the Actions and "API operations" tables)."""
    p = call.params
    definition = world.batch_arn("job-definition", p["jobDefinitionName"])
    containers = [p.get("containerProperties", {})] + [
        r["container"] for r in p.get("nodeProperties", {}).get("nodeRangeProperties", [])
    ]
    roles = {c[k] for c in containers for k in ("jobRoleArn", "executionRoleArn") if c.get(k)}
    tags = _request_tags(p.get("tags", {}))
    # Each container's image, privilege, user and log settings as Batch's condition keys (policy/access.py).
    found = [
        Request("batch:RegisterJobDefinition", definition, {**tags, **register_context(c)})
        for c in containers
        if c
    ]
    found += [Request("iam:PassRole", role) for role in sorted(roles)]
    if p.get("tags"):
        found.append(Request("batch:TagResource", definition, _request_tags(p["tags"])))
    return found


def _submit_job(call: Call, world: World) -> list[Request]:
    """batch:SubmitJob on the queue and on the definition (both required resources), with the share identifier
    and the request's tags; batch:TagResource on the new job for those tags, which has none yet."""
    p = call.params
    context = {**_request_tags(p.get("tags", {}))}
    if "shareIdentifier" in p:
        context["batch:ShareIdentifier"] = p["shareIdentifier"]
    found = [
        Request("batch:SubmitJob", world.batch_arn("job-queue", p["jobQueue"]), context),
        Request("batch:SubmitJob", world.batch_arn("job-definition", p["jobDefinition"]), context),
    ]
    if p.get("tags"):
        new_job = world.arn("batch", "job/00000000-0000-0000-0000-000000000000")
        found.append(Request("batch:TagResource", new_job, _request_tags(p["tags"])))
    return found


def _stop_job(action: str) -> Callable[[Call, World], list[Request]]:
    def requests_(call: Call, world: World) -> list[Request]:
        tags = world.job_tags(call.params["jobId"])
        job = world.arn("batch", f"job/{call.params['jobId']}")
        return [Request(action, job, {f"aws:ResourceTag/{k}": v for k, v in tags.items()})]

    return requests_


def _unscoped(action: str) -> Callable[[Call, World], list[Request]]:
    """An action with no resource type: only "*" grants it (Service Authorization Reference)."""
    return lambda call, world: [Request(action, "*")]


# Each call the workflow may make -> the IAM requests it authorises. Sources: S3 API Reference, each operation's
# "Permissions" (HeadObject needs s3:GetObject; an SSE-KMS PutObject kms:GenerateDataKey, a GetObject kms:Decrypt;
# a multipart upload both: S3 User Guide, "Multipart upload API and permissions"); Service Authorization Reference
# for AWS Batch, Amazon ECR (DescribeImages: repository) and CloudWatch Logs (GetLogEvents: the stream's ARN,
# CloudWatch Logs User Guide "Overview of managing access permissions").
AUTHORISATIONS: dict[str, Callable[[Call, World], list[Request]]] = {
    "s3.GetBucketLocation": lambda c, w: [
        Request("s3:GetBucketLocation", f"arn:aws:s3:::{c.params['Bucket']}")
    ],
    "s3.HeadObject": _s3_object("s3:GetObject"),
    "s3.GetObject": _s3_object("s3:GetObject", "kms:Decrypt"),
    "s3.PutObject": _s3_object("s3:PutObject", "kms:GenerateDataKey"),
    "s3.CreateMultipartUpload": _s3_object("s3:PutObject", "kms:GenerateDataKey", "kms:Decrypt"),
    "s3.UploadPart": _s3_object("s3:PutObject"),
    "s3.CompleteMultipartUpload": _s3_object("s3:PutObject", "kms:Decrypt"),
    "s3.AbortMultipartUpload": _s3_object("s3:AbortMultipartUpload"),
    "s3.ListObjectsV2": lambda c, w: [
        Request(
            "s3:ListBucket", f"arn:aws:s3:::{c.params['Bucket']}", {"s3:prefix": c.params.get("Prefix", "")}
        )
    ],
    "ecr.DescribeImages": lambda c, w: [
        Request("ecr:DescribeImages", w.arn("ecr", f"repository/{c.params['repositoryName']}"))
    ],
    "batch.DescribeJobQueues": _unscoped("batch:DescribeJobQueues"),
    "batch.DescribeJobDefinitions": _unscoped("batch:DescribeJobDefinitions"),
    "batch.DescribeJobs": _unscoped("batch:DescribeJobs"),
    "batch.ListJobs": _unscoped("batch:ListJobs"),
    "batch.RegisterJobDefinition": _register_job_definition,
    "batch.SubmitJob": _submit_job,
    "batch.TerminateJob": _stop_job("batch:TerminateJob"),
    "batch.CancelJob": _stop_job("batch:CancelJob"),
    # Amazon EKS: DescribeCluster on the cluster resource (Service Authorization Reference, Amazon EKS), what
    # connecting to an EKS stack's cluster and the orchestrator check call (trainer/jobs/eks.py).
    "eks.DescribeCluster": lambda c, w: [
        Request("eks:DescribeCluster", w.arn("eks", f"cluster/{c.params['name']}"))
    ],
    "logs.GetLogEvents": lambda c, w: [
        Request(
            "logs:GetLogEvents",
            w.arn("logs", f"log-group:{c.params['logGroupName']}:log-stream:{c.params['logStreamName']}"),
        )
    ],
}


def denials(calls: list[Call], documents: list[str], tags: dict[str, str], world: World) -> list[str]:
    """One line per call that the policies do not allow, naming the call and the request refused."""
    variables = {f"aws:PrincipalTag/{k}": v for k, v in tags.items()}
    found = []
    for call in calls:
        if str(call) not in AUTHORISATIONS:
            found.append(
                f"{call}: no entry in AUTHORISATIONS; add its IAM actions from the service's reference"
            )
            continue
        for request in AUTHORISATIONS[str(call)](call, world):
            decision = decide(documents, request, variables)
            if decision != "allowed":
                found.append(f"{call}: {request} is {decision}")
    return found


@dataclass
class Recorder:
    """Every botocore call made in this process, with its parameters (before-parameter-build) once sent
    (before-call)."""

    calls: list[Call] = field(default_factory=list)

    def parameters(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["recorded_params"] = {k: v for k, v in params.items() if k != "Body"}  # a stream: not kept

    def before_call(self, model: Any, context: dict[str, Any], **_: Any) -> None:
        service = model.service_model.signing_name  # the IAM service prefix (ECR's endpoint is api.ecr)
        self.calls.append(Call(service, model.name, context.get("recorded_params", {})))


@dataclass
class Workflow:
    plan: Planned
    calls: list[Call]
    world: World
    outputs: dict[str, Any]
    out: dict[str, str]
    credentials: dict[str, str]  # the team role's session, as environment variables

    @property
    def policy(self) -> str:
        (policy,) = self.plan.all("iam.Policy")
        return policy.inputs["policy"]

    @property
    def role_tags(self) -> dict[str, str]:
        return dict(self.plan.one("iam.Role", "-team-vision").inputs["tags"])


def buckets_and_image(plan: Planned, region: str) -> tuple[dict[str, str], str]:
    """The planned datasets and checkpoints buckets and repository in moto, the image IMAGE_TAG pushed: the buckets
    by kind, and the repository's URL."""
    s3, ecr = boto3.client("s3", region_name=region), boto3.client("ecr", region_name=region)
    named = {
        kind: plan.one("s3.Bucket", f"-{kind}").outputs["bucket"] for kind in ("datasets", "checkpoints")
    }
    # us-east-1 takes no LocationConstraint (S3 API Reference, CreateBucket).
    where = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
    for bucket in named.values():
        s3.create_bucket(Bucket=bucket, **where)
    repository = plan.one("ecr.Repository").outputs["name"]
    url = ecr.create_repository(repositoryName=repository, imageTagMutability="IMMUTABLE")["repository"][
        "repositoryUri"
    ]
    manifest = json.dumps(
        {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json"}
    )
    ecr.put_image(repositoryName=repository, imageManifest=manifest, imageTag=IMAGE_TAG)
    return named, url


def _build_stack(plan: Planned) -> dict[str, Any]:
    """The planned stack in moto, as the platform operators' `make up` and `make push` leave it."""

    def client(service: str) -> Any:
        return boto3.client(service, region_name=REGION)

    named, url = buckets_and_image(plan, REGION)
    ec2, iam, batch = client("ec2"), client("iam"), client("batch")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/20")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="efa", Description="efa", VpcId=vpc)["GroupId"]
    service_role = iam.create_role(RoleName="batch-service", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    iam.create_instance_profile(InstanceProfileName="batch-instance")
    profile = iam.get_instance_profile(InstanceProfileName="batch-instance")["InstanceProfile"]["Arn"]
    environment = batch.create_compute_environment(
        computeEnvironmentName="trainstack-prod-gpu-ce",
        type="MANAGED",
        state="ENABLED",
        computeResources={
            "type": "EC2",
            "minvCpus": 0,
            "maxvCpus": 4 * 192,
            "instanceTypes": ["p5.48xlarge"],
            "subnets": [subnet],
            "securityGroupIds": [group],
            "instanceRole": profile,
        },
        serviceRole=service_role,
    )["computeEnvironmentArn"]
    shares = [{"shareIdentifier": t["name"], "weightFactor": 1.0} for t in TEAMS]
    scheduling = batch.create_scheduling_policy(
        name="trainstack-prod-teams", fairsharePolicy={"shareDistribution": shares}
    )["arn"]
    for queue in (QUEUE, SPOT_QUEUE):  # both with the teams' policy (infra/cluster.py)
        batch.create_job_queue(
            jobQueueName=queue,
            state="ENABLED",
            priority=1,
            schedulingPolicyArn=scheduling,
            computeEnvironmentOrder=[{"order": 1, "computeEnvironment": environment}],
        )
    planned = json.loads(plan.one("batch.JobDefinition", "-train").inputs["nodeProperties"])
    container = planned["nodeRangeProperties"][0]["container"]
    definition = batch.register_job_definition(
        jobDefinitionName=DEFINITION,
        type="multinode",
        nodeProperties={
            "numNodes": planned["numNodes"],
            "mainNode": 0,
            "nodeRangeProperties": [
                {
                    "targetNodes": "0:",
                    "container": {
                        "image": f"{url}:latest",
                        "command": container.get("command", []),
                        "jobRoleArn": container["jobRoleArn"],
                        "executionRoleArn": container["executionRoleArn"],
                        "resourceRequirements": container["resourceRequirements"],
                    },
                }
            ],
        },
        propagateTags=True,
        tags=plan.config.tags,  # the provider's default tags (infra/__main__.py)
    )["jobDefinitionArn"]
    spot = json.loads(plan.one("batch.JobDefinition", "-spot").inputs["containerProperties"])
    spot_definition = batch.register_job_definition(
        jobDefinitionName=SPOT_DEFINITION,
        type="container",
        containerProperties={
            "image": f"{url}:latest",
            "jobRoleArn": spot["jobRoleArn"],
            "executionRoleArn": spot["executionRoleArn"],
            "resourceRequirements": spot["resourceRequirements"],
        },
        propagateTags=True,
        tags=plan.config.tags,
    )["jobDefinitionArn"]
    client("logs").create_log_group(logGroupName=plan.config.jobs_log_group)
    return {
        "spot_job_queue": SPOT_QUEUE,
        "spot_job_definition": spot_definition,
        "region": REGION,
        "job_queue": QUEUE,
        "job_definition": definition,
        "ecr_repository_url": url,
        "datasets_bucket": named["datasets"],
        "checkpoints_bucket": named["checkpoints"],
        "fsx_file_system_id": "fs-0123456789abcdef0",
        "fsx_dns_name": "fs-0123456789abcdef0.fsx.us-west-2.amazonaws.com",
        "fsx_mount_name": "abcdefgh",
        "log_group": plan.config.jobs_log_group,
        "kms_key_arn": plan.key_arn,
        "instance_type": "p5.48xlarge",
        "node_count": planned["numNodes"],
        "gpus_per_node": 8,
        "teams": [t["name"] for t in TEAMS],
        "team_gpu_quotas": {t["name"]: t["gpuQuota"] for t in TEAMS},
        "allowed_regions": [REGION],
    }


def _assume_team_role(plan: Planned) -> dict[str, str]:
    """The team role in moto's IAM, tagged as planned, assumed through moto's STS: the session's credentials."""
    role = plan.one("iam.Role", "-team-vision")
    iam = boto3.client("iam", region_name=REGION)
    arn = iam.create_role(
        RoleName=role.outputs["name"],
        AssumeRolePolicyDocument=role.inputs["assumeRolePolicy"],
        Tags=[{"Key": k, "Value": v} for k, v in role.inputs["tags"].items()],
    )["Role"]["Arn"]
    credentials = boto3.client("sts", region_name=REGION).assume_role(RoleArn=arn, RoleSessionName="ana")[
        "Credentials"
    ]
    return {
        "AWS_ACCESS_KEY_ID": credentials["AccessKeyId"],
        "AWS_SECRET_ACCESS_KEY": credentials["SecretAccessKey"],
        "AWS_SESSION_TOKEN": credentials["SessionToken"],
    }


@pytest.fixture(scope="module")
def workflow(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workflow]:
    """The whole workflow, run once for the module's tests as team vision's role."""
    mp = fresh_moto_as_admin(moto_endpoint)
    tmp = tmp_path_factory.mktemp("team-workflow")
    plan = _variant("prod", (("trainstack:spot", "true"), ("trainstack:teams", json.dumps(TEAMS))))
    outputs = _build_stack(plan)
    outputs_file, prefix = team_inputs(tmp, outputs)
    admin = boto3.client("batch", region_name=REGION)
    team_session = _assume_team_role(plan)
    out: dict[str, str] = {}
    stack = ["--stack", "prod", "--outputs", str(outputs_file)]
    with as_role(team_session) as recorder:
        out["upload"] = run_verb(
            ["upload", *stack, "--prefix", str(prefix), "--name", "corpus", "--team", "vision"]
        )
        data = ["--set", f"data.prefixes=[{DATA}]", "--set", f"data.tokenizer_path={DATA}.tokenizer.json"]
        train = ["submit", *stack, "--config", "trainer/configs/llama3-8b.yaml", "--image", IMAGE_TAG]
        out["train"] = run_verb([*train, "--team", "vision", "--nodes", "2", "--run", RUN, *data])
        (job,) = [
            j
            for s in ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")
            for j in admin.list_jobs(jobQueue=QUEUE, jobStatus=s)["jobSummaryList"]
        ]
        job_id = job["jobId"]
        _platform_side(plan, outputs, job_id)
        out["list"] = run_verb(["job", "status", *stack])
        out["status"] = run_verb(["job", "status", *stack, "--job", job_id])
        out["logs"] = run_verb(["job", "logs", *stack, "--job", job_id])
        out["models"] = run_verb(["models", "list", *stack, "--team", "vision"])
        moto_job = batch_backends[ACCOUNT_ID][REGION]._jobs[job_id]
        moto_job.status, moto_job.job_stopped = "RUNNING", False  # moto ends jobs at once
        out["cancel"] = run_verb(["job", "cancel", *stack, "--job", job_id])
        out["smoke"] = run_verb(
            ["smoke", *stack, "--image", IMAGE_TAG, "--team", "vision", "--run", "smoke-v", "--no-wait"]
        )
        finetune = [
            "finetune",
            *stack,
            "--team",
            "vision",
            "--image",
            IMAGE_TAG,
            "--nodes",
            "2",
            "--run",
            "sft-v",
        ]
        finetune += ["--dataset", "chat", "--suite", str(_team_suite(tmp, mp))]
        out["finetune"] = run_verb(finetune)
        out["finetune-stages"] = run_verb(finetune)  # moto's Batch ended the training job SUCCEEDED
        out["sweep"] = run_verb(
            ["sweep-stack", *stack, "--sweep", "trainer/configs/llama3-8b-sweep.yaml", "--team", "vision", "--parallel",
             "2", "--image", IMAGE_TAG, "--no-follow"]
        )  # fmt: skip
    world = World(
        REGION,
        ACCOUNT_ID,
        outputs["kms_key_arn"],
        lambda job: admin.describe_jobs(jobs=[job])["jobs"][0].get("tags", {}),
    )
    yield Workflow(plan, recorder.calls, world, outputs, out, team_session)
    mp.undo()


def fresh_moto_as_admin(moto_endpoint: str) -> pytest.MonkeyPatch:
    """This process's AWS calls to a freshly reset moto server, as the account's administrator (undo it after)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    mp.setenv("AWS_ACCESS_KEY_ID", "testing")
    mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    mp.delenv("AWS_SESSION_TOKEN", raising=False)
    mp.delenv("AWS_PROFILE", raising=False)
    requests.post(f"{moto_endpoint}/moto-api/reset", timeout=10)
    return mp


@contextlib.contextmanager
def as_role(session: dict[str, str]) -> Iterator[Recorder]:
    """Inside: every botocore call of this process made with the role's `session` credentials, and recorded."""
    recorder = Recorder()
    handlers = [
        *botocore.handlers.BUILTIN_HANDLERS,
        ("before-parameter-build", recorder.parameters),
        ("before-call", recorder.before_call),
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(botocore.handlers, "BUILTIN_HANDLERS", handlers)
        for name, value in session.items():
            mp.setenv(name, value)
        yield recorder


def team_inputs(tmp: Path, outputs: dict[str, Any]) -> tuple[Path, Path]:
    """The stack's outputs file, a prepared corpus here for the team to upload (its prefix), and a chat dataset with
    held-out data already under vision's prefix in the datasets bucket."""
    outputs_file = tmp / "outputs.json"
    outputs_file.write_text(json.dumps(outputs))
    prefix = tmp / "corpus"
    write_dataset(prefix, documents=10, tokens_per_document=50)
    _chat_data_uploaded(outputs["datasets_bucket"])
    return outputs_file, prefix


def _chat_data_uploaded(bucket: str) -> None:
    """A chat dataset and held-out data under vision's prefix, as `trainer upload --team vision` (above) leaves
    them."""
    s3 = boto3.client("s3", region_name=REGION)
    for suffix in (".bin", ".idx", "-mask.bin", "-mask.idx", ".tokenizer.json", ".chat.json"):
        s3.put_object(Bucket=bucket, Key=f"teams/vision/chat/chat{suffix}", Body=b"x")
    for suffix in (".bin", ".idx", ".tasks.jsonl"):
        s3.put_object(Bucket=bucket, Key=f"teams/vision/sft/heldout{suffix}", Body=b"x")


def _team_suite(tmp: Any, mp: pytest.MonkeyPatch) -> Any:
    """The default fine-tune suite over vision's own held-out data, in an image's trainer/ tree."""
    root = tmp / "image"
    path = root / "trainer" / "configs" / "suites" / "vision-sft.yaml"
    path.parent.mkdir(parents=True)
    suite = yaml.safe_load(finetune_driver.DEFAULT_SUITE.read_text())
    suite["perplexity"][0]["data"] = "/fsx/datasets/teams/vision/sft/heldout"
    suite["generation"][0]["file"] = "/fsx/datasets/teams/vision/sft/heldout.tasks.jsonl"
    path.write_text(yaml.safe_dump(suite))
    mp.setattr(finetune_driver, "ROOT", root)
    return path


def run_verb(argv: list[str]) -> str:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = trainer_main(argv)
    assert status == 0, f"{' '.join(argv[:2])}: {stderr.getvalue()}"
    return stdout.getvalue()


def _platform_side(plan: Planned, outputs: dict[str, Any], job_id: str) -> None:
    """What the cluster writes while the job runs: its log stream, and the health report FSx exports."""
    admin = boto3.client("batch", region_name=REGION)
    stream = admin.describe_jobs(jobs=[job_id])["jobs"][0]["container"]["logStreamName"]
    logs = boto3.client("logs", region_name=REGION)
    logs.create_log_stream(logGroupName=outputs["log_group"], logStreamName=stream)
    now_ms = int(time.time() * 1000)
    logs.put_log_events(
        logGroupName=outputs["log_group"],
        logStreamName=stream,
        logEvents=[{"timestamp": now_ms, "message": "step 1 loss 9.5"}],
    )
    ranks = [{"rank": 3, "host": "ip-10-0-1-7", "instance_id": "i-0abc", "compute_s": 2.4, "median_s": 1.0,
              "ratio": 2.4, "windows": 3}]  # fmt: skip
    health = {"stragglers": {"step": 60, "interval": 20, "median_s": 1.0, "ranks": ranks}}
    boto3.client("s3", region_name=REGION).put_object(
        Bucket=outputs["checkpoints_bucket"], Key=f"teams/vision/{RUN}/health.json", Body=json.dumps(health)
    )


def test_the_team_workflow_runs_under_the_team_role_and_every_call_is_allowed(workflow):
    assert "uploaded 3 files to s3://trainstack-prod-datasets/teams/vision/corpus/" in workflow.out["upload"]
    assert "(s3://trainstack-prod-checkpoints/teams/vision/llama-v)" in workflow.out["train"]
    assert "health:   stragglers at step 60: rank 3 on ip-10-0-1-7" in workflow.out["status"]
    assert "step 1 loss 9.5" in workflow.out["logs"]
    assert "no model versions in s3://trainstack-prod-checkpoints/teams/vision" in workflow.out["models"]
    assert "termination requested (was RUNNING)" in workflow.out["cancel"]
    assert "report later: make smoke STACK=prod TEAM=vision JOB=" in workflow.out["smoke"]
    assert workflow.out["finetune"].startswith("train: submitted (job ")
    assert "stages: submitted (job " in workflow.out["finetune-stages"]
    assert "teams/vision/sweeps/llama3-8b-sweep/" in workflow.out["sweep"]
    sweeps = [
        c.params for c in workflow.calls if str(c) == "batch.SubmitJob" and c.params["jobQueue"] == SPOT_QUEUE
    ]
    assert [(s["shareIdentifier"], s["arrayProperties"]["size"]) for s in sweeps] == [("vision", 2)]
    made = {str(c) for c in workflow.calls}
    # The calls issue 36 named, each made by the workflow (the residency check, the image, the data, a new
    # revision for the new image, the submission, the log, the cancel).
    for call in (
        "s3.GetBucketLocation",
        "ecr.DescribeImages",
        "s3.HeadObject",
        "batch.RegisterJobDefinition",
        "batch.SubmitJob",
        "s3.PutObject",
        "s3.GetObject",
        "s3.ListObjectsV2",
        "logs.GetLogEvents",
        "batch.TerminateJob",
    ):
        assert call in made
    assert denials(workflow.calls, [workflow.policy], workflow.role_tags, workflow.world) == []


def without(policy: str, sid: str) -> str:
    document = json.loads(policy)
    kept = [s for s in document["Statement"] if s.get("Sid") != sid]
    assert len(kept) == len(document["Statement"]) - 1, f"no statement {sid}"
    return json.dumps({**document, "Statement": kept})


def test_a_missing_permission_fails_and_names_the_call(workflow):
    found = denials(
        workflow.calls, [without(workflow.policy, "SeeImages")], workflow.role_tags, workflow.world
    )
    repository = workflow.plan.one("ecr.Repository").outputs["arn"]
    assert found and all(line.startswith("ecr.DescribeImages: ecr:DescribeImages on ") for line in found)
    assert f"ecr:DescribeImages on {repository} is implicitly denied" in found[0]


def test_another_team_could_not_run_this_workflow_on_these_resources(workflow):
    found = denials(workflow.calls, [workflow.policy], {"team": "speech"}, workflow.world)
    assert any(line.startswith("batch.SubmitJob: batch:SubmitJob on ") for line in found)
    assert any(line.startswith("batch.TerminateJob: ") for line in found)
    assert any(line.startswith("s3.PutObject: s3:PutObject on arn:aws:s3:::") for line in found)


def test_every_allow_statement_is_needed_by_the_workflow(workflow):
    """Least privilege: dropping any Allow statement denies some call of the workflow."""
    for statement in json.loads(workflow.policy)["Statement"]:
        if statement["Effect"] != "Allow":
            continue
        reduced = without(workflow.policy, statement["Sid"])
        assert denials(workflow.calls, [reduced], workflow.role_tags, workflow.world), statement["Sid"]


def test_a_call_without_an_authorisation_entry_fails(workflow):
    unknown = Call("ecr", "ListImages", {"repositoryName": "x"})
    (line,) = denials([unknown], [workflow.policy], workflow.role_tags, workflow.world)
    assert line.startswith("ecr.ListImages: no entry in AUTHORISATIONS")


def test_moto_s3_enforcement_agrees_on_the_team_prefixes(workflow):
    """moto's own IAM enforcement, where it covers the service (S3: bucket and object ARNs), on the team's S3
    statements with the role's tag substituted as IAM does for the session (moto substitutes no variables)."""
    role = workflow.plan.one("iam.Role", "-team-vision").outputs["name"]
    document = json.loads(workflow.policy)
    s3_only = [s for s in document["Statement"] if all(a.startswith("s3:") for a in s["Action"])]
    text = json.dumps({**document, "Statement": s3_only}).replace("${aws:PrincipalTag/team}", "vision")
    iam = boto3.client("iam", region_name=REGION)
    arn = iam.create_policy(PolicyName="team-access-s3", PolicyDocument=text)["Policy"]["Arn"]
    iam.attach_role_policy(RoleName=role, PolicyArn=arn)
    session = boto3.session.Session(
        aws_access_key_id=workflow.credentials["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=workflow.credentials["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=workflow.credentials["AWS_SESSION_TOKEN"],
        region_name=REGION,
    )
    s3 = session.client("s3")
    datasets, checkpoints = workflow.outputs["datasets_bucket"], workflow.outputs["checkpoints_bucket"]
    with enable_iam_authentication():
        assert s3.get_bucket_location(Bucket=datasets)["LocationConstraint"] == REGION
        s3.head_object(Bucket=datasets, Key="teams/vision/corpus/corpus.bin")
        s3.put_object(Bucket=checkpoints, Key=f"teams/vision/{RUN}/note.txt", Body=b"x")
        assert s3.get_object(Bucket=checkpoints, Key=f"teams/vision/{RUN}/health.json")["Body"].read()
        for call in (
            lambda: s3.put_object(Bucket=checkpoints, Key=f"teams/speech/{RUN}/note.txt", Body=b"x"),
            lambda: s3.head_object(Bucket=datasets, Key="corpus/corpus.bin"),
            lambda: s3.delete_object(Bucket=checkpoints, Key=f"teams/vision/{RUN}/note.txt"),
        ):
            with pytest.raises(ClientError) as refused:
                call()
            assert refused.value.response["Error"]["Code"] in ("AccessDenied", "403")
