"""Bad input catalogue, cluster jobs (docs/bad-inputs.md): `make train STACK=test OUTPUTS=...` against a moto
server with a bad outputs file or an image tag that is not in ECR (and `make finetune STACK=...` with a dataset or suite
it cannot use): one message, a non-zero exit, no job submitted,
no job definition registered, and the outputs file unchanged."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import requests

from tests.deploy.outputs import pool_outputs

from .conftest import DATASET, TOKENIZER, Stack
from .test_sweep import with_single_node_queue

CONFIG = "trainer/configs/llama3-8b.yaml"
DATA_ARGS = f"ARGS=--set data.prefixes=[{DATASET}] --set data.tokenizer_path={TOKENIZER}"


@dataclass(frozen=True)
class Row:
    variables: tuple[str, ...]  # make variables besides STACK and OUTPUTS
    says: str
    setup: Callable[[Stack], None] | None = None
    exit_status: int = 2  # the verb's; make itself then exits 2 as well
    target: str = "train"  # or finetune (trainer/jobs/finetune.py), deploy, sweep (trainer/jobs/sweep.py)


def run_in_flight(stack: Stack) -> None:
    """A job of run llama-a RUNNING in the stack's queue (moto ends jobs at once: held there once it has)."""
    from .test_one_job_per_run import _running

    batch = stack.client("batch")
    batch.submit_job(jobName="llama-a", jobQueue="gpu-queue", jobDefinition=stack.outputs["job_definition"])
    _running(stack)


def without_outputs(*names: str) -> Callable[[Stack], None]:
    def setup(stack: Stack) -> None:
        stack.outputs_file.write_text(json.dumps({k: v for k, v in stack.outputs.items() if k not in names}))

    return setup


def shared_by_teams(stack: Stack) -> None:
    stack.outputs_file.write_text(
        json.dumps({**stack.outputs, "teams": ["vision"], "team_gpu_quotas": {"vision": 8}})
    )


def single_node_queue(stack: Stack) -> None:
    """The Spot queue and its definition (tests/jobs/test_sweep.py), their creation left out of the recording."""
    with_single_node_queue(stack)
    requests.post(f"{stack.endpoint}/moto-api/recorder/reset-recording", timeout=10)
    requests.post(f"{stack.endpoint}/moto-api/recorder/start-recording", timeout=10)


def datasets_in_another_region(stack: Stack) -> None:
    bucket = "trainstack-test-datasets-eu"
    stack.client("s3").create_bucket(
        Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"}
    )
    stack.outputs_file.write_text(json.dumps({**stack.outputs, "datasets_bucket": bucket}))


def on_eks(without: tuple[str, ...] = ()) -> Callable[[Stack], None]:
    """The stack's outputs as an EKS stack's (trainer/contract/outputs.py EKS_OUTPUTS), less `without`; its
    cluster exists in no account."""

    def setup(stack: Stack) -> None:
        eks = {k: v for k, v in stack.outputs.items() if k not in ("job_queue", "job_definition")}
        eks.update(
            orchestrator="eks",
            eks_cluster_name="trainstack-absent",
            eks_cluster_endpoint="https://127.0.0.1:9",
            eks_cluster_ca="",
            k8s_namespace="trainstack",
            kueue_local_queue="training",
            fsx_claim="fsx",
            efa_devices_per_node=32,
        )
        stack.outputs_file.write_text(json.dumps({k: v for k, v in eks.items() if k not in without}))

    return setup


def eks_shared_by_teams(stack: Stack) -> None:
    """An EKS stack with a team: its JobSets live in the team's namespace (infra/eks_teams.py)."""
    on_eks()(stack)
    outputs = json.loads(stack.outputs_file.read_text())
    teams = {
        "teams": ["vision"],
        "team_gpu_quotas": {"vision": 8},
        "team_namespaces": {"vision": "team-vision"},
    }
    stack.outputs_file.write_text(json.dumps({**outputs, **teams}))


def with_inference_pool(stack: Stack) -> None:
    """The stack's outputs with an inference pool's (infra/serving.py SERVING_OUTPUTS); no endpoint exists yet."""
    pool = pool_outputs("trainstack-test-serving", str(stack.outputs["region"]))
    stack.outputs_file.write_text(json.dumps({**stack.outputs, **pool}))


ROWS = {
    "outputs-missing-keys": Row(
        (),
        "stack 'test' lacks the outputs job_queue, gpus_per_node; run `make up STACK=test`",
        without_outputs("job_queue", "gpus_per_node"),
    ),
    "outputs-not-json": Row(
        (), "outputs.json: not JSON (Expecting property name", lambda s: s.outputs_file.write_text("{{")
    ),
    "outputs-file-missing": Row(
        ("OUTPUTS=/nonexistent/outputs.json",), "OUTPUTS=/nonexistent/outputs.json: cannot read it"
    ),
    "image-tag-not-in-ecr": Row(("IMAGE=feedfacecafe",), "IMAGE=feedfacecafe: no such tag in"),
    "nodes-above-the-stack": Row(
        ("NODES=9", "IMAGE=0123456789ab"), "NODES=9: stack 'test' allows 1 to 4 nodes"
    ),
    "team-missing-on-shared-stack": Row(
        ("IMAGE=0123456789ab",),
        "stack 'test' is shared by teams vision: say which with TEAM=<name>",
        shared_by_teams,
    ),
    "team-data-outside-its-prefix": Row(
        ("IMAGE=0123456789ab", "TEAM=vision", "NODES=1"),
        "data.prefixes[0] = '/fsx/datasets/corpus/corpus': team vision's data lives under "
        "/fsx/datasets/teams/vision/ (s3://trainstack-test-datasets/teams/vision/); upload it with "
        "make data STACK=test TEAM=vision SRC=... LOCAL=1",
        shared_by_teams,
    ),
    "eks-outputs-missing-keys": Row(
        ("IMAGE=0123456789ab",),
        "stack 'test' lacks the outputs fsx_claim; run `make up STACK=test`",
        on_eks(without=("fsx_claim",)),
    ),
    "eks-cluster-missing": Row(
        ("IMAGE=0123456789ab", "RUN=llama-eks"),
        "EKS cluster 'trainstack-absent' does not exist in us-east-1; run make up STACK=test",
        on_eks(),
    ),
    # The JobSet v0.12.0 webhook's name rule (trainer/jobs/jobset.py), checked before the token or any AWS call.
    "eks-run-name-leading-digit": Row(
        ("IMAGE=0123456789ab", "RUN=8b-llama"),
        "RUN='8b-llama': on EKS the run names the JobSet, its Jobs and pods (DNS-1035 labels)",
        on_eks(),
    ),
    "eks-run-name-too-long-for-pod-names": Row(
        ("IMAGE=0123456789ab", "RUN=" + "l" * 49, "NODES=4"),
        "characters, with room for its 6-character random suffix); a DNS label holds 63: shorten the run name to "
        "at most 48",
        on_eks(),
    ),
    "dataset-bucket-outside-allowed-regions": Row(
        ("IMAGE=0123456789ab",),
        "dataset location s3://trainstack-test-datasets-eu (datasets_bucket) is in eu-west-1, outside stack "
        "'test''s allowed regions us-east-1",
        datasets_in_another_region,
    ),
    "run-in-flight": Row(
        ("IMAGE=0123456789ab", "RUN=llama-a"),
        "RUN=llama-a: job ",
        run_in_flight,
    ),
    # A team's JobSets are in its namespace: status, logs and cancel need TEAM= to know where to look.
    "eks-team-missing-for-status": Row(
        (),
        "status: stack 'test' is shared by teams vision: say which with TEAM=<name>",
        eks_shared_by_teams,
        target="status",
    ),
    # smoke and finetune submit to the GPU queue as train does: a fair-share queue refuses a job without a share.
    "smoke-team-missing-on-shared-stack": Row(
        ("IMAGE=0123456789ab", "NOWAIT=1"),
        "smoke: not submitted:\n  - stack 'test' is shared by teams vision: say which with TEAM=<name>",
        shared_by_teams,
        target="smoke",
    ),
    "finetune-team-deploy": Row(
        ("IMAGE=0123456789ab", "TEAM=vision", "DEPLOY=1"),
        "DEPLOY=1 with TEAM=vision: the endpoint is the stack's, deployed by its platform operators",
        shared_by_teams,
        target="finetune",
    ),
    "deploy-without-inference-pool": Row(
        ("MODEL=candidate",),
        "stack test has no inference pool (outputs lack serving_endpoint, serving_alarms): set "
        "trainstack:serving in Pulumi.test.yaml",
        target="deploy",
    ),
    "deploy-unknown-model": Row(
        ("MODEL=nope",),
        "deploy: no model version or tag 'nope' in s3://trainstack-test-checkpoints",
        with_inference_pool,
        target="deploy",
    ),
    "finetune-dataset-missing": Row(
        ("IMAGE=0123456789ab", "DATASET=chat-v3"),
        "DATASET=chat-v3: s3://trainstack-test-datasets/chat-v3/chat-v3.bin, ",
        target="finetune",
    ),
    "sweep-stack-without-single-node-queue": Row(
        ("IMAGE=0123456789ab", "PARALLEL=2"),
        "stack 'test' has no single-node GPU queue (spot_job_queue, spot_job_definition): a sweep's workers are "
        "one node each",
        target="sweep",
    ),
    "sweep-stack-parallel-above-trials": Row(
        ("IMAGE=0123456789ab", "TRIALS=8", "PARALLEL=9", "TEAM=vision"),
        "PARALLEL=9: give 1 to 8 (at most TRIALS=8)",
        single_node_queue,
        target="sweep",
    ),
    # The JobSet webhook takes DNS-1035 labels only (jobset v0.12.0): the sweep's name is in its JobSet's.
    "sweep-stack-eks-name-not-a-dns-label": Row(
        ("IMAGE=0123456789ab", "NAME=LR", "TRIALS=8", "PARALLEL=2"),
        "NAME='LR': the sweep's JobSet is named 'sweep-LR', which EKS refuses",
        on_eks(),
        target="sweep",
    ),
    # The trials train on a node's GPUs (one process each), not on this machine: local-sweep.yaml's tiny shape fits
    # none of a p5's 8.
    "sweep-stack-shape-fits-no-node": Row(
        ("IMAGE=0123456789ab", "SWEEP=trainer/configs/local-sweep.yaml", "PARALLEL=2"),
        "space.optimizer.lr = 0.001: schedule.global_batch_size = 16 is not divisible by "
        "schedule.micro_batch_size x data parallel size = 8 x 8 (a trial's 8 cuda process(es))",
        single_node_queue,
        target="sweep",
    ),
    "sweep-stack-outside-the-image": Row(
        ("IMAGE=0123456789ab", "SWEEP=/tmp/s.yaml", "PARALLEL=2"),
        "SWEEP=/tmp/s.yaml: the image carries trainer/ only; put the sweep YAML beside its recipe under "
        "trainer/configs/",
        single_node_queue,
        target="sweep",
    ),
    "sweep-stack-max-dollars-not-positive": Row(
        ("IMAGE=0123456789ab", "MAX_DOLLARS=0", "PARALLEL=2"),
        "MAX_DOLLARS=0: give a positive number of US dollars",
        single_node_queue,
        target="sweep",
    ),
    # nan <= 0 is False: a float check let it through, and every worker refused it (trainer/sweep/worker.py).
    "sweep-stack-max-dollars-nan": Row(
        ("IMAGE=0123456789ab", "MAX_DOLLARS=nan", "PARALLEL=2"),
        "MAX_DOLLARS=nan: give a positive number of US dollars (above 0, finite; not nan or inf)",
        single_node_queue,
        target="sweep",
    ),
    "sweep-stack-max-dollars-inf": Row(
        ("IMAGE=0123456789ab", "MAX_DOLLARS=inf", "PARALLEL=2"),
        "MAX_DOLLARS=inf: give a positive number of US dollars (above 0, finite; not nan or inf)",
        single_node_queue,
        target="sweep",
    ),
    # The local default store is a SQLite file under this checkout's runs/: no worker node reaches it.
    "sweep-stack-mlflow-without-uri": Row(
        ("IMAGE=0123456789ab", "MLFLOW=1", "PARALLEL=2"),
        "MLFLOW=1: on a stack the workers log to a tracking server they can reach: give its URI, "
        "MLFLOW=http://<host>:5000",
        single_node_queue,
        target="sweep",
    ),
    "sweep-stack-register": Row(
        ("IMAGE=0123456789ab", "REGISTER=candidate", "PARALLEL=2"),
        "REGISTER=candidate: a sweep on a stack does not register its best trial; leave REGISTER out, and once the "
        "sweep has ended find the best trial's version",
        single_node_queue,
        target="sweep",
    ),
    "finetune-suite-outside-the-image": Row(
        ("IMAGE=0123456789ab", "SUITE=/tmp/suite.yaml"),
        "SUITE=/tmp/suite.yaml: the image carries trainer/ only; put the suite under trainer/configs/suites/",
        target="finetune",
    ),
}


@pytest.mark.parametrize("row_id", ROWS)
def test_bad_stack_input_submits_nothing(row_id, stack):
    row = ROWS[row_id]
    if row.setup:
        row.setup(stack)
    outputs_before = hashlib.sha256(stack.outputs_file.read_bytes()).hexdigest()
    jobs_before = [job["jobId"] for job in stack.jobs()]

    result = stack.make(row.target, f"CONFIG={CONFIG}", DATA_ARGS, *row.variables)

    assert result.returncode == row.exit_status, result.stderr
    assert row.says in result.stderr
    assert "Traceback" not in result.stderr
    assert [job["jobId"] for job in stack.jobs()] == jobs_before and stack.requests(
        "RegisterJobDefinition"
    ) == []
    assert stack.requests("TerminateJob") == []
    assert hashlib.sha256(stack.outputs_file.read_bytes()).hexdigest() == outputs_before
