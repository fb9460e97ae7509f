"""`make render STACK=<env>`: what `make train` would send, with no AWS call; from an outputs file, or from the
offline preview when the stack has no outputs to give."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest
import yaml

from infra.cluster_software import local_queue_name
from infra.config import parse_stack_config, read_stack_file
from infra.eks_teams import team_namespace
from policy.eks import jobset_problems
from tests.conftest import ROOT
from trainer.__main__ import main as trainer_main
from trainer.aws.outputs import StackError, load_outputs
from trainer.contract.container import SUBMISSION_ENV
from trainer.contract.jobset import QUEUE_LABEL
from trainer.contract.outputs import EKS_OUTPUTS, missing_outputs
from trainer.contract.stack import stack_cluster
from trainer.contract.teams import TEAM_SERVICE_ACCOUNT

from .conftest import DATASET, IMAGE_TAG, TOKENIZER, Stack, without_submission_env
from .jobset_schema import jobset_errors
from .test_jobset import EKS_OUTPUTS as EKS_STACK

CONFIG = "trainer/configs/llama3-8b.yaml"
DATA = ["--set", f"data.prefixes=[{DATASET}]", "--set", f"data.tokenizer_path={TOKENIZER}"]


def run(capsys, verb: str, outputs_file, *argv: str) -> tuple[int, str, str]:
    status = trainer_main(
        [
            verb,
            "--stack",
            "test",
            "--outputs",
            str(outputs_file),
            "--config",
            CONFIG,
            "--image",
            IMAGE_TAG,
            *argv,
            *DATA,
        ]
    )
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_batch_render_is_the_submit_job_request_make_train_sends(stack: Stack, capsys):
    status, rendered, err = run(capsys, "render", stack.outputs_file, "--run", "llama-a", "--nodes", "2")
    assert status == 0, err
    assert "jobDefinition becomes the revision of it that names the image" in err
    assert stack.recorded("") == []  # no AWS call
    status, _, err = run(capsys, "submit", stack.outputs_file, "--run", "llama-a", "--nodes", "2")
    assert status == 0, err
    (sent,) = stack.requests("SubmitJob")
    request = json.loads(rendered)
    assert request["jobDefinition"] == stack.outputs["job_definition"]
    assert sent["jobDefinition"].startswith(stack.outputs["job_definition"].rsplit(":", 1)[0] + ":")
    (overrides,) = sent["nodeOverrides"]["nodePropertyOverrides"]
    environment = overrides["containerOverrides"]["environment"]
    overrides["containerOverrides"]["environment"], moment = without_submission_env(environment)
    assert set(moment) == set(SUBMISSION_ENV)  # the digest and the clock: added, nothing else
    assert {k: v for k, v in sent.items() if k != "jobDefinition"} == {
        k: v for k, v in request.items() if k != "jobDefinition"
    }


def test_eks_render_prints_a_jobset_the_pinned_crd_accepts_with_no_aws_call(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # any AWS call would fail
    outputs_file = tmp_path / "eks.json"
    outputs_file.write_text(json.dumps(EKS_STACK))
    status, rendered, err = run(capsys, "render", outputs_file, "--run", "llama-eks")
    assert status == 0, err
    jobset = yaml.safe_load(rendered)
    assert jobset["kind"] == "JobSet" and jobset["metadata"]["name"] == "llama-eks"
    assert jobset_errors(jobset) == []


def readme_render(stack: str) -> list[str]:
    """The README's `make render STACK=<stack>` line, as a shell would split it (README, "make render")."""
    marker = "tests/jobs/test_render.py runs each line of this block"
    block = (ROOT / "README.md").read_text().split(marker, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    (line,) = [
        line for line in block.splitlines() if shlex.split(line)[:3] == ["make", "render", f"STACK={stack}"]
    ]
    return shlex.split(line)


def make_as_written(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [argv[0], "-s", "--no-print-directory", *argv[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(ROOT),
        },  # no Pulumi CLI on this PATH: the stack has no outputs
    )


def test_the_readmes_make_render_on_dev_prints_the_request_from_the_offline_preview():
    result = make_as_written(readme_render("dev"))
    assert result.returncode == 0, result.stderr
    assert "using the offline preview of Pulumi.dev.yaml" in result.stderr
    request = json.loads(result.stdout)
    assert request["jobQueue"] == "trainstack-dev-gpu"
    assert request["nodeOverrides"]["numNodes"] == 1


def test_the_readmes_make_render_on_eks_dev_prints_a_teams_jobset_from_the_offline_preview():
    # eks-dev is shared by teams (docs/eks.md#teams): a job is a team's, its data under the team's prefix.
    result = make_as_written(readme_render("eks-dev"))
    assert result.returncode == 0, result.stderr
    assert "using the offline preview of Pulumi.eks-dev.yaml" in result.stderr
    jobset = yaml.safe_load(result.stdout)
    assert jobset_errors(jobset) == []
    # The policy pack's own JobSet check (policy/eks.py): one node's EFA devices and GPUs per pod.
    assert jobset_problems(jobset, efa_devices_per_node=32, gpus_per_node=8) == []
    job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["parallelism"] == stack_cluster("eks-dev")[1]
    # The team's namespace, LocalQueue and service account as the stack makes them (infra/eks_teams.py).
    assert jobset["metadata"]["namespace"] == team_namespace("vision")
    assert jobset["metadata"]["labels"][QUEUE_LABEL] == local_queue_name(
        parse_stack_config("eks-dev", read_stack_file("eks-dev"))
    )
    assert jobset["metadata"]["labels"]["team"] == "vision"
    assert job["template"]["spec"]["serviceAccountName"] == TEAM_SERVICE_ACCOUNT
    run = jobset["metadata"]["name"]
    assert (
        f"logging.run_dir=/fsx/checkpoints/teams/vision/{run}"
        in job["template"]["spec"]["containers"][0]["args"]
    )


def test_an_eks_stack_lacking_its_outputs_is_named(tmp_path):
    partial = {k: v for k, v in EKS_STACK.items() if k not in ("fsx_claim", "kueue_local_queue")}
    assert missing_outputs(partial) == ["kueue_local_queue", "fsx_claim"]
    assert missing_outputs(EKS_STACK) == []
    assert "job_queue" not in EKS_STACK and set(EKS_OUTPUTS) <= set(EKS_STACK)
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(partial))
    with pytest.raises(StackError, match="lacks the outputs kueue_local_queue, fsx_claim"):
        load_outputs("eks-dev", path)


def test_an_unknown_orchestrator_is_named(tmp_path):
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps({**EKS_STACK, "orchestrator": "slurm"}))
    with pytest.raises(StackError, match="output orchestrator = 'slurm': expected one of batch, eks"):
        load_outputs("eks-dev", path)
