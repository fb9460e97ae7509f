"""A moto server on 127.0.0.1 holding what a stack describes (queue, multi-node job definition, ECR image,
datasets bucket, log group), and an outputs file naming it, for the real `make train STACK=...` path."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
import requests
from moto.batch.models import JobDefinition
from moto.moto_api import recorder
from moto.server import ThreadedMotoServer

from tests.conftest import ROOT
from trainer.contract.container import SUBMISSION_ENV

REGION = "us-east-1"
IMAGE_TAG = "0123456789ab"
DATASET = "/fsx/datasets/corpus/corpus"
TOKENIZER = "/fsx/datasets/corpus/corpus.tokenizer.json"


def _describe_with_node_properties(self: JobDefinition) -> dict:
    # moto 5.2.5 drops nodeProperties from DescribeJobDefinitions (FACTS.md); real Batch returns them.
    described = _describe(self)
    if self.node_properties:
        described["nodeProperties"] = json.loads(json.dumps(self.node_properties))
    return described


_describe = JobDefinition.describe


@dataclass
class Stack:
    endpoint: str
    outputs_file: Path
    outputs: dict
    recording: Path

    def client(self, service: str):
        return boto3.client(service, region_name=REGION, endpoint_url=self.endpoint)

    def make(self, target: str, *variables: str) -> subprocess.CompletedProcess:
        """Run `make <target> STACK=test OUTPUTS=<file> ...` against the moto server."""
        command = [
            "make",
            "--no-print-directory",
            target,
            "STACK=test",
            f"OUTPUTS={self.outputs_file}",
            *variables,
        ]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)

    def recorded(self, action: str) -> list[dict]:
        """The recorded requests (url, headers, body) whose target header or URL names `action`."""
        found = []
        for line in self.recording.read_text().splitlines():
            entry = json.loads(line)
            target = entry["headers"].get("X-Amz-Target", "") + entry["url"]
            if action.lower() in target.lower().replace("/", ""):
                entry["body"] = base64.b64decode(entry["body"]) if entry["body_encoded"] else entry["body"]
                found.append(entry)
        return found

    def requests(self, action: str) -> list[dict]:
        """JSON bodies of the recorded Batch/ECR/... requests for `action` (REST-JSON and JSON protocols)."""
        return [json.loads(entry["body"] or "{}") for entry in self.recorded(action)]

    def jobs(self) -> list[dict]:
        batch = self.client("batch")
        statuses = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")
        return [
            j for s in statuses for j in batch.list_jobs(jobQueue="gpu-queue", jobStatus=s)["jobSummaryList"]
        ]


def add_container_queue(
    stack: Stack, queue: str, definition: str, command: list[str], resources: dict
) -> str:
    """A queue on the stack's compute environment and a single-node (container) job definition, as infra/ makes
    the data and Spot queues; the definition's ARN."""
    batch = stack.client("batch")
    environment = batch.describe_compute_environments()["computeEnvironments"][0]["computeEnvironmentArn"]
    batch.create_job_queue(
        jobQueueName=queue,
        state="ENABLED",
        priority=1,
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment": environment}],
    )
    return batch.register_job_definition(
        jobDefinitionName=definition,
        type="container",
        containerProperties={
            "image": f"{stack.outputs['ecr_repository_url']}:latest",
            "command": command,
            "resourceRequirements": [{"type": k, "value": str(v)} for k, v in resources.items()],
        },
        propagateTags=True,
    )["jobDefinitionArn"]


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    JobDefinition.describe = _describe_with_node_properties
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    requests.post(f"{endpoint}/moto-api/config", json={"batch": {"use_docker": False}}, timeout=10)
    yield endpoint
    server.stop()
    JobDefinition.describe = _describe


def _create_stack(endpoint: str) -> dict:
    def client(service):
        return boto3.client(service, region_name=REGION, endpoint_url=endpoint)

    ec2, iam, batch = client("ec2"), client("iam"), client("batch")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/20")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="efa", Description="efa", VpcId=vpc)["GroupId"]
    role = iam.create_role(RoleName="batch-instance", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    iam.create_instance_profile(InstanceProfileName="batch-instance")
    iam.add_role_to_instance_profile(InstanceProfileName="batch-instance", RoleName="batch-instance")
    profile = iam.get_instance_profile(InstanceProfileName="batch-instance")["InstanceProfile"]["Arn"]
    environment = batch.create_compute_environment(
        computeEnvironmentName="gpu-ce",
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
        serviceRole=role,
    )["computeEnvironmentArn"]
    batch.create_job_queue(
        jobQueueName="gpu-queue",
        state="ENABLED",
        priority=1,
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment": environment}],
    )
    repository = client("ecr").create_repository(
        repositoryName="trainstack-test", imageTagMutability="IMMUTABLE"
    )
    repository_url = repository["repository"]["repositoryUri"]
    manifest = json.dumps(
        {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json"}
    )
    client("ecr").put_image(repositoryName="trainstack-test", imageManifest=manifest, imageTag=IMAGE_TAG)
    definition = batch.register_job_definition(
        jobDefinitionName="trainstack-test-train",
        type="multinode",
        nodeProperties={
            "numNodes": 4,
            "mainNode": 0,
            "nodeRangeProperties": [
                {
                    "targetNodes": "0:",
                    "container": {
                        "image": f"{repository_url}:latest",
                        "command": ["train", "--config", "trainer/configs/llama3-8b.yaml"],
                        "resourceRequirements": [
                            {"type": "VCPU", "value": "188"},
                            {"type": "MEMORY", "value": "1900000"},
                            {"type": "GPU", "value": "8"},
                        ],
                    },
                }
            ],
        },
        retryStrategy={"attempts": 3, "evaluateOnExit": [{"onStatusReason": "Host EC2*", "action": "RETRY"}]},
        propagateTags=True,
    )["jobDefinitionArn"]
    s3 = client("s3")
    s3.create_bucket(Bucket="trainstack-test-datasets")
    for suffix in (".bin", ".idx", ".tokenizer.json"):
        s3.put_object(Bucket="trainstack-test-datasets", Key=f"corpus/corpus{suffix}", Body=b"x")
    client("logs").create_log_group(logGroupName="/trainstack/test/train")
    kms_key = client("kms").create_key()["KeyMetadata"]["Arn"]
    s3.create_bucket(Bucket="trainstack-test-checkpoints")
    return {
        "region": REGION,
        "job_queue": "gpu-queue",
        "job_definition": definition,
        "ecr_repository_url": repository_url,
        "datasets_bucket": "trainstack-test-datasets",
        "checkpoints_bucket": "trainstack-test-checkpoints",
        "fsx_file_system_id": "fs-0123456789abcdef0",
        "fsx_dns_name": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
        "fsx_mount_name": "abcdefgh",
        "log_group": "/trainstack/test/train",
        "kms_key_arn": kms_key,
        "instance_type": "p5.48xlarge",
        "node_count": 4,
        "gpus_per_node": 8,
    }


@pytest.fixture
def stack(moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    """A fresh stack per test (moto reset), with request recording on; boto3 here and in every `make` run
    talks to the moto server."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    requests.post(f"{moto_endpoint}/moto-api/reset", timeout=10)
    outputs = _create_stack(moto_endpoint)
    outputs_file = tmp_path / "outputs.json"
    outputs_file.write_text(json.dumps(outputs))
    recording = tmp_path / "recording.jsonl"
    recorder._location = str(recording)
    requests.post(f"{moto_endpoint}/moto-api/recorder/reset-recording", timeout=10)
    requests.post(f"{moto_endpoint}/moto-api/recorder/start-recording", timeout=10)
    yield Stack(moto_endpoint, outputs_file, outputs, recording)
    requests.post(f"{moto_endpoint}/moto-api/recorder/stop-recording", timeout=10)


def without_submission_env(environment: list[dict]) -> tuple[list[dict], dict[str, str]]:
    """A submitted environment split into what `make render` printed and what only the moment of submission knows
    (the contract's SUBMISSION_ENV: the image digest, the submit time)."""
    moment = {e["name"]: e["value"] for e in environment if e["name"] in SUBMISSION_ENV}
    return [e for e in environment if e["name"] not in SUBMISSION_ENV], moment
