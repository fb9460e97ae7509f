"""GPU health from NVML return values (replayed through the real pynvml constants and error types), and a faulty
node taking itself out of service: IMDSv2 served by a real HTTP server, Auto Scaling and EC2 by moto."""

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pynvml
import pytest
from moto import mock_aws
from moto.server import ThreadedMotoServer

from tests.conftest import ROOT, Imds
from trainer.aws.imds import IMDS_ENDPOINT_ENV
from trainer.contract.retry import RETRY_EXIT_CODE as NODE_FAULT
from trainer.preflight.checks import FAILED, OK, check_gpu_health
from trainer.preflight.command import STATUS_FILE_ENV
from trainer.preflight.gpu_health import read_gpus
from trainer.preflight.quarantine import instance_identity, take_out_of_service

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
READINGS = json.loads((Path(__file__).parent / "fixtures" / "nvml_readings.json").read_text())
REGION = "us-east-1"


class ReplayedNvml:
    """pynvml's names and errors, answering each call with the fixture's value for that device."""

    def __init__(self, devices: list[dict]):
        self.devices = devices
        self.initialised = False

    def __getattr__(self, name):
        if not name.startswith("nvmlDeviceGet") or name in (
            "nvmlDeviceGetCount",
            "nvmlDeviceGetHandleByIndex",
        ):
            return getattr(pynvml, name)  # constants and error classes

        def call(handle, *args):
            value = self.devices[handle][name]
            if value == "NotSupported":
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return tuple(value) if isinstance(value, list) else value

        return call

    def nvmlInit(self):
        self.initialised = True

    def nvmlShutdown(self):
        self.initialised = False

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetUUID(self, handle):
        return self.devices[handle]["uuid"]


def test_nvml_faults_are_named_per_gpu():
    nvml = ReplayedNvml(READINGS["devices"])
    readings = read_gpus(nvml)
    assert not nvml.initialised, "NVML is shut down after reading"
    healthy = readings[0]
    assert healthy.retired_pages_pending is None and healthy.remapped_rows == (0, 0, False, False)
    check = check_gpu_health(readings, pynvml)
    assert check.status == FAILED and check.node_fault
    assert check.detail.split(" | ") == [
        "GPU 1 (GPU-remap-pending): row remapping pending after 2 uncorrectable rows (needs a GPU reset); "
        "2 uncorrectable ECC errors since the driver loaded",
        "GPU 2 (GPU-remap-failed): row remapping failed (service the GPU)",
        "GPU 3 (GPU-thermal): hardware slowdown; hardware thermal slowdown",
        "GPU 4 (GPU-volta-pages): retired pages pending (needs a GPU reset)",
    ]
    assert check_gpu_health(read_gpus(ReplayedNvml(READINGS["devices"][:1])), pynvml).status == OK


@pytest.fixture
def aws(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        yield


def _group_with_one_instance(endpoint: str | None = None) -> str:
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=endpoint)
    template = ec2.create_launch_template(
        LaunchTemplateName="batch-ce",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "t3.micro"},
    )["LaunchTemplate"]["LaunchTemplateId"]
    autoscaling = boto3.client("autoscaling", region_name=REGION, endpoint_url=endpoint)
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="AWSBatch-gpu-ce-asg",
        LaunchTemplate={"LaunchTemplateId": template},
        MinSize=1,
        MaxSize=1,
        DesiredCapacity=1,
        AvailabilityZones=[f"{REGION}a"],
    )
    (group,) = autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"]
    return group["Instances"][0]["InstanceId"]


def test_identity_comes_from_imdsv2(imds, monkeypatch):
    monkeypatch.setattr(Imds, "instance_id", "i-0abc")
    assert instance_identity(imds) == ("i-0abc", REGION)


def test_an_instance_in_an_auto_scaling_group_is_marked_unhealthy(aws):
    instance_id = _group_with_one_instance()
    assert take_out_of_service(instance_id, REGION) == (
        f"{instance_id} marked Unhealthy in Auto Scaling group AWSBatch-gpu-ce-asg"
    )
    (described,) = boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_instances(
        InstanceIds=[instance_id]
    )["AutoScalingInstances"]
    assert described["HealthStatus"].upper() == "UNHEALTHY"


def test_an_instance_outside_any_group_is_terminated(aws):
    ec2 = boto3.client("ec2", region_name=REGION)
    (instance,) = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"]
    assert take_out_of_service(instance["InstanceId"], REGION).endswith(
        "terminated (in no Auto Scaling group)"
    )
    (reservation,) = ec2.describe_instances(InstanceIds=[instance["InstanceId"]])["Reservations"]
    assert reservation["Instances"][0]["State"]["Name"] in ("shutting-down", "terminated")


def test_a_faulty_node_in_batch_leaves_service_and_exits_with_the_retry_code(imds, tmp_path, monkeypatch):
    """The preflight's own path: a CPU host posing as p5 (a GPU-count node fault) inside a Batch job, its IMDS a
    local server, Auto Scaling a moto server."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    try:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        instance_id = _group_with_one_instance(endpoint)
        monkeypatch.setattr(Imds, "instance_id", instance_id)
        status = tmp_path / "status"
        result = subprocess.run(
            [*TORCHRUN, "-m", "trainer", "preflight", "--checkpoint-root", str(tmp_path / "ckpt")],
            env={
                **os.environ,
                "TRAINSTACK_INSTANCE_TYPE": "p5.48xlarge",
                "AWS_BATCH_JOB_ID": "0123abcd#0",
                IMDS_ENDPOINT_ENV: imds,
                STATUS_FILE_ENV: str(status),
            },
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert status.read_text() == str(NODE_FAULT), result.stdout + result.stderr
        assert (
            f"out of service   {instance_id} marked Unhealthy in Auto Scaling group AWSBatch-gpu-ce-asg"
            in (result.stdout)
        )
        (described,) = boto3.client(
            "autoscaling", region_name=REGION, endpoint_url=endpoint
        ).describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
        assert described["HealthStatus"].upper() == "UNHEALTHY"
    finally:
        server.stop()
