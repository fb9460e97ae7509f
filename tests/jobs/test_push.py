"""`make push STACK=<env>`: the docker commands for the stack's ECR repository, and immutable tags respected."""

from __future__ import annotations

import json

import pytest

from tests.conftest import stack_plan
from trainer.__main__ import main as trainer_main
from trainer.jobs.submit import JOB_DEFINITION_OUTPUTS

from .conftest import IMAGE_TAG, Stack


def test_push_logs_in_to_the_stack_registry_and_pushes_the_commit_tag(stack: Stack, capsys):
    outputs = ["--stack", "test", "--outputs", str(stack.outputs_file)]
    assert trainer_main(["push", *outputs, "--tag", "cafef00dcafe", "--dry-run"]) == 0
    login, tag, push = capsys.readouterr().out.splitlines()
    registry, repository = stack.outputs["ecr_repository_url"].split("/", 1)
    assert login == f"docker login --username AWS --password-stdin {registry}"
    assert tag == f"docker tag trainstack:cafef00dcafe {registry}/{repository}:cafef00dcafe"
    assert push == f"docker push {registry}/{repository}:cafef00dcafe"


def test_push_skips_a_tag_already_in_the_immutable_registry(stack: Stack, capsys):
    outputs = ["--stack", "test", "--outputs", str(stack.outputs_file)]
    assert trainer_main(["push", *outputs, "--tag", IMAGE_TAG]) == 0
    assert "is already in the registry (tags are immutable)" in capsys.readouterr().out


def add_spot_definition(stack: Stack) -> str:
    """The Spot queue's single-node definition as infra/cluster.py registers it: the `:latest` placeholder."""
    arn = stack.client("batch").register_job_definition(
        jobDefinitionName="trainstack-test-spot",
        type="container",
        containerProperties={
            "image": f"{stack.outputs['ecr_repository_url']}:latest",
            "command": ["train", "--config", "trainer/configs/llama3-8b.yaml"],
            "resourceRequirements": [
                {"type": "VCPU", "value": "188"},
                {"type": "MEMORY", "value": "1900000"},
            ],
        },
        retryStrategy={"attempts": 3},
    )["jobDefinitionArn"]
    stack.outputs_file.write_text(json.dumps({**stack.outputs, "spot_job_definition": arn}))
    return arn


def test_push_points_every_exported_job_definition_at_the_pushed_tag(stack: Stack, capsys):
    """An immutable repository never receives `:latest`: without a revision per push the Spot job could never pull
    a new image (the multi-node one gets its revision at submission too)."""
    spot = add_spot_definition(stack)
    outputs = ["--stack", "test", "--outputs", str(stack.outputs_file)]
    assert trainer_main(["push", *outputs, "--tag", IMAGE_TAG]) == 0
    printed = capsys.readouterr().out
    image = f"{stack.outputs['ecr_repository_url']}:{IMAGE_TAG}"
    registered = {r["jobDefinitionName"]: r for r in stack.requests("RegisterJobDefinition")}
    assert registered["trainstack-test-spot"]["containerProperties"]["image"] == image
    assert registered["trainstack-test-spot"]["type"] == "container"
    assert registered["trainstack-test-spot"]["retryStrategy"] == {"attempts": 3}
    nodes = registered["trainstack-test-train"]["nodeProperties"]["nodeRangeProperties"]
    assert [n["container"]["image"] for n in nodes] == [image]
    batch = stack.client("batch")
    [latest] = batch.describe_job_definitions(jobDefinitionName="trainstack-test-spot", status="ACTIVE")[
        "jobDefinitions"
    ][-1:]
    assert latest["revision"] == 2 and latest["containerProperties"]["image"] == image
    assert f"  spot_job_definition: {spot.rsplit(':', 1)[0]}:2" in printed
    # Pushing the same tag again finds the revisions instead of registering more.
    assert trainer_main(["push", *outputs, "--tag", IMAGE_TAG]) == 0
    assert len(stack.requests("RegisterJobDefinition")) == 3  # the Spot placeholder and one revision each


def test_push_names_a_job_definition_the_stack_no_longer_has(stack: Stack, capsys):
    gone = "arn:aws:batch:us-east-1:123456789012:job-definition/trainstack-test-spot:7"
    stack.outputs_file.write_text(json.dumps({**stack.outputs, "spot_job_definition": gone}))
    outputs = ["--stack", "test", "--outputs", str(stack.outputs_file)]
    assert trainer_main(["push", *outputs, "--tag", IMAGE_TAG]) == 2
    assert f"push: job definition {gone!r} (spot_job_definition) is missing" in capsys.readouterr().err


def placeholder_outputs(stack: str) -> dict[str, str]:
    """{output: image} of every job definition `stack` registers naming `:latest` of its own repository."""
    plan = stack_plan(stack)
    repository = next(r for r in plan.resources if r.type == "aws:ecr/repository:Repository")
    latest = f"{repository.outputs['repositoryUrl']}:latest"
    by_arn = {value: name for name, value in plan.outputs.items() if isinstance(value, str)}
    found = {}
    for definition in (r for r in plan.resources if r.type == "aws:batch/jobDefinition:JobDefinition"):
        properties = definition.inputs.get("containerProperties") or definition.inputs.get("nodeProperties")
        if latest in str(properties):
            found[by_arn[definition.outputs["arn"]]] = latest
    return found


def uncovered(stack: str, covered: tuple[str, ...]) -> list[str]:
    """Exported definitions naming `:latest`, which an IMMUTABLE repository never receives (ECR User Guide, "Image
    tag mutability"), that no verb re-points at the pushed tag."""
    return sorted(output for output in placeholder_outputs(stack) if output not in covered)


@pytest.mark.parametrize("name", ["dev", "staging", "prod", "eks-dev"])
def test_every_job_definition_a_stack_names_latest_in_gets_a_revision_per_push(name):
    assert uncovered(name, JOB_DEFINITION_OUTPUTS) == []


def test_round_three_left_the_data_queues_definition_on_latest():
    """The data queue's single-node definition was not re-pointed, so a data job submitted after a `pulumi up`
    pulled a tag that does not exist."""
    assert "data_job_definition" in placeholder_outputs("dev")
    assert uncovered("dev", ("job_definition", "spot_job_definition")) == ["data_job_definition"]
