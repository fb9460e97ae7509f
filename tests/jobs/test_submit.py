"""`make train STACK=<env>` against a moto server: what is submitted, and what is refused before submitting."""

from __future__ import annotations

import json

import pytest

from trainer.__main__ import main as trainer_main
from trainer.contract.catalog import instance_type
from trainer.plan.command import plan_for
from trainer.plan.performance import Assumptions

from .conftest import DATASET, IMAGE_TAG, ROOT, TOKENIZER, Stack

CONFIG = "trainer/configs/llama3-8b.yaml"
DATA_ARGS = f"--set data.prefixes=[{DATASET}] --set data.tokenizer_path={TOKENIZER}"


def train(stack: Stack, *variables: str, args: str = DATA_ARGS) -> object:
    return stack.make("train", f"CONFIG={CONFIG}", f"IMAGE={IMAGE_TAG}", f"ARGS={args}", *variables)


def test_submission_runs_the_trainer_on_the_requested_nodes(stack):
    result = train(stack, "NODES=2", "RUN=llama-a")
    assert result.returncode == 0, result.stderr
    (submitted,) = stack.requests("SubmitJob")
    assert submitted["jobName"] == "llama-a"
    assert submitted["jobQueue"] == "gpu-queue"
    overrides = submitted["nodeOverrides"]
    assert overrides["numNodes"] == 2
    (node_range,) = overrides["nodePropertyOverrides"]
    assert node_range["targetNodes"] == "0:"
    container = node_range["containerOverrides"]
    assert container["command"] == [
        "train",
        "--config",
        CONFIG,
        "--set",
        "logging.run_dir=/fsx/checkpoints/llama-a",
        "--set",
        f"data.prefixes=[{DATASET}]",
        "--set",
        f"data.tokenizer_path={TOKENIZER}",
    ]
    assert {"name": "TRAINSTACK_RUN", "value": "llama-a"} in container["environment"]
    (pushed,) = stack.client("ecr").describe_images(repositoryName="trainstack-test")["imageDetails"]
    assert {"name": "TRAINSTACK_IMAGE_DIGEST", "value": pushed["imageDigest"]} in container["environment"]
    assert submitted["tags"] == {"trainstack:run": "llama-a", "trainstack:stack": "test", "team": "_stack"}
    assert f"job id:     {stack.jobs()[0]['jobId']}" in result.stdout
    assert "console:    https://us-east-1.console.aws.amazon.com/batch/home" in result.stdout


def test_image_tag_gets_a_job_definition_revision_once(stack):
    assert train(stack, "RUN=first").returncode == 0
    assert train(stack, "RUN=second").returncode == 0
    (registered,) = stack.requests("RegisterJobDefinition")
    image = f"{stack.outputs['ecr_repository_url']}:{IMAGE_TAG}"
    assert [r["container"]["image"] for r in registered["nodeProperties"]["nodeRangeProperties"]] == [image]
    assert registered["retryStrategy"]["evaluateOnExit"][0]["onStatusReason"] == "Host EC2*"
    first, second = stack.requests("SubmitJob")
    assert first["jobDefinition"] == second["jobDefinition"] != stack.outputs["job_definition"]
    assert first["jobDefinition"].endswith(":2")


def test_a_planted_revision_with_the_image_but_other_settings_is_not_reused(stack):
    """Issue 46 item 9: a revision someone else registered with the same node properties (the pushed image) but
    other parameters (or timeout, retry strategy) is not what the stack's definition says; submit registers its own."""
    batch = stack.client("batch")
    (own,) = batch.describe_job_definitions(jobDefinitions=[stack.outputs["job_definition"]])[
        "jobDefinitions"
    ]
    nodes = own["nodeProperties"]
    for node_range in nodes["nodeRangeProperties"]:
        node_range["container"]["image"] = f"{stack.outputs['ecr_repository_url']}:{IMAGE_TAG}"
    planted = batch.register_job_definition(
        jobDefinitionName=own["jobDefinitionName"],
        type="multinode",
        nodeProperties=nodes,
        retryStrategy=own["retryStrategy"],
        parameters={"planted": "yes"},
    )["jobDefinitionArn"]
    assert train(stack, "RUN=first").returncode == 0
    (submitted,) = stack.requests("SubmitJob")
    assert submitted["jobDefinition"] != planted
    registered = stack.requests("RegisterJobDefinition")[-1]
    assert registered.get("parameters") == (own.get("parameters") or None)


def test_a_templates_runnable_revisions_go_under_its_run_name_and_the_template_stays_as_deployed(stack):
    """Issue 46 item 9: a stack without trainstack:image registers `<name>-template` (infra/cluster.py); the verbs
    register what runs under `<name>-run`, a family Pulumi never replaces (which would deregister every revision of
    the name), so the template never gains a runnable revision and a `-run` one is reused."""
    batch = stack.client("batch")
    (own,) = batch.describe_job_definitions(jobDefinitions=[stack.outputs["job_definition"]])[
        "jobDefinitions"
    ]
    template = batch.register_job_definition(
        jobDefinitionName="trainstack-test-train-template",
        type="multinode",
        nodeProperties=own["nodeProperties"],
        retryStrategy=own["retryStrategy"],
        propagateTags=True,
    )["jobDefinitionArn"]
    stack.outputs_file.write_text(json.dumps({**stack.outputs, "job_definition": template}))
    assert train(stack, "RUN=first").returncode == 0
    assert train(stack, "RUN=second").returncode == 0
    first, second = stack.requests("SubmitJob")
    assert first["jobDefinition"] == second["jobDefinition"]
    assert first["jobDefinition"].endswith(":job-definition/trainstack-test-train-run:1")
    (registered,) = [
        r for r in stack.requests("RegisterJobDefinition") if r["jobDefinitionName"].endswith("-run")
    ]
    image = f"{stack.outputs['ecr_repository_url']}:{IMAGE_TAG}"
    assert [r["container"]["image"] for r in registered["nodeProperties"]["nodeRangeProperties"]] == [image]
    revisions = batch.describe_job_definitions(jobDefinitionName="trainstack-test-train-template")[
        "jobDefinitions"
    ]
    assert [r["revision"] for r in revisions] == [1]


def test_run_name_defaults_to_the_config_name_so_resubmitting_resumes(stack):
    assert train(stack).returncode == 0
    (submitted,) = stack.requests("SubmitJob")
    assert submitted["jobName"] == "llama3-8b"
    assert (
        "logging.run_dir=/fsx/checkpoints/llama3-8b"
        in submitted["nodeOverrides"]["nodePropertyOverrides"][0]["containerOverrides"]["command"]
    )


def submit_in_process(stack: Stack, capsys, *argv: str, args: str = DATA_ARGS) -> tuple[int, str]:
    """The same `trainer submit` that `make train STACK=...` runs, without a process start per case."""
    status = trainer_main(
        [
            "submit",
            "--stack",
            "test",
            "--outputs",
            str(stack.outputs_file),
            "--config",
            CONFIG,
            "--image",
            IMAGE_TAG,
            *list(argv),
            *args.split(),
        ]
    )
    return status, capsys.readouterr().err


REFUSALS = {
    "too many nodes": (
        ["--nodes", "9"],
        DATA_ARGS,
        "NODES=9: stack 'test' allows 1 to 4 nodes of p5.48xlarge",
    ),
    "tensor parallel across nodes": (
        [],
        DATA_ARGS + " --set parallel.tensor_model_parallel_size=16",
        "tensor_model_parallel_size = 16 does not divide the 8 GPUs of a p5.48xlarge node",
    ),
    "image not pushed": (["--image", "feedfacecafe"], DATA_ARGS, "IMAGE=feedfacecafe: no such tag in"),
    "dataset not uploaded": (
        [],
        f"--set data.prefixes=[/fsx/datasets/missing/x] --set data.tokenizer_path={TOKENIZER}",
        "s3://trainstack-test-datasets/missing/x.bin not found",
    ),
    "dataset outside fsx": (
        [],
        f"--set data.prefixes=[data/local/x] --set data.tokenizer_path={TOKENIZER}",
        "data.prefixes[0] = 'data/local/x': the cluster reads data from /fsx/datasets/",
    ),
    "unknown config key": (
        [],
        DATA_ARGS + " --set schedule.train_iter=5",
        "did you mean 'schedule.train_iters'?",
    ),
    "bad run name": (["--run", "my/run"], DATA_ARGS, "RUN='my/run': use letters, digits"),
}


@pytest.mark.parametrize("case", REFUSALS, ids=list(REFUSALS))
def test_refused_submission_names_the_problem_and_submits_nothing(stack, capsys, case):
    argv, args, message = REFUSALS[case]
    status, stderr = submit_in_process(stack, capsys, *argv, args=args)
    assert status == 2
    assert message in stderr
    assert stack.requests("SubmitJob") == [] and stack.jobs() == []


def test_make_train_refuses_a_disabled_queue(stack):
    stack.client("batch").update_job_queue(jobQueue="gpu-queue", state="DISABLED")
    result = train(stack)
    assert result.returncode != 0
    assert "job queue 'gpu-queue' is DISABLED" in result.stderr
    assert stack.jobs() == []


def test_outputs_missing_keys_are_named(stack, capsys):
    outputs = dict(stack.outputs)
    del outputs["job_queue"], outputs["gpus_per_node"]
    stack.outputs_file.write_text(json.dumps(outputs))
    status, stderr = submit_in_process(stack, capsys)
    assert status == 2
    assert "stack 'test' lacks the outputs job_queue, gpus_per_node" in stderr
    assert stack.jobs() == []


def test_config_outside_the_image_is_refused(stack, capsys, tmp_path):
    outside = tmp_path / "mine.yaml"
    outside.write_text((ROOT / CONFIG).read_text())
    status, stderr = submit_in_process(stack, capsys, "--config", str(outside))
    assert status == 2
    assert "the image carries trainer/ only" in stderr
    assert stack.jobs() == []


def test_auto_layout_is_planned_for_the_stack_and_passed_to_the_job(stack):
    auto = ["parallel.tensor_model_parallel_size=auto", "parallel.recompute=auto"]
    result = train(stack, "RUN=planned", args=" ".join([DATA_ARGS, *(f"--set {key}" for key in auto)]))
    assert result.returncode == 0, result.stderr
    (submitted,) = stack.requests("SubmitJob")
    command = submitted["nodeOverrides"]["nodePropertyOverrides"][0]["containerOverrides"]["command"]
    assert "auto" not in " ".join(command)
    overrides = [*DATA_ARGS.replace("--set ", "").split(), *auto]
    chosen = plan_for(ROOT / CONFIG, overrides, instance_type("p5.48xlarge"), 4, Assumptions()).chosen
    tp, recompute = chosen.overrides(["parallel.tensor_model_parallel_size", "parallel.recompute"])
    assert command[-4:] == ["--set", tp, "--set", recompute]
    assert f"layout:     {chosen.describe()}" in result.stdout


def test_auto_layout_that_fits_no_layout_is_refused(stack, capsys):
    args = DATA_ARGS + " --set model.num_layers=320 --set parallel.recompute=auto"
    status, stderr = submit_in_process(stack, capsys, "--nodes", "1", args=args)
    assert status == 2
    assert "parallel.recompute = auto: no layout fits 1 x p5.48xlarge" in stderr
    assert stack.jobs() == []
