"""`make finetune STACK=<env>` (`trainer finetune`) against a moto server (Batch, S3, ECR) and, on EKS, the loopback
API server of test_eks.py: train found by its name and submitted, followed, or named when it failed; then one one-node
job of `finetune-stages`; the stage skipped once its outputs are in the checkpoints bucket; bad input refused before
anything is submitted."""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from pathlib import Path

import pytest
import yaml
from moto.batch.models import batch_backends

from tests.checkpoint.test_version import config, prepared
from tests.support.training import sealed_checkpoint
from trainer.__main__ import main as trainer_main
from trainer.checkpoint.version import Lineage, add_evaluation, write_record
from trainer.contract.container import IMAGE_DIGEST_ENV
from trainer.jobs import finetune as finetune_driver
from trainer.launch import node
from trainer.models import pipeline

from .conftest import IMAGE_TAG, REGION, TOKENIZER, Stack
from .jobset_schema import jobset_errors
from .test_eks import ApiServer, api_server, eks_stack, teams_stack  # noqa: F401  (fixtures)

RUN = "sft-a"
DATASETS, CHECKPOINTS = "trainstack-test-datasets", "trainstack-test-checkpoints"
TOKENIZER_ARGS = ("--set", f"data.tokenizer_path={TOKENIZER}")


def upload_inputs(stack: Stack, prefix: str = "chat/chat", heldout: str = "sft/heldout") -> None:
    """What `trainer upload` leaves in the datasets bucket for a chat dataset, and the default suite's files."""
    s3 = stack.client("s3")
    for suffix in (".bin", ".idx", "-mask.bin", "-mask.idx", ".tokenizer.json", ".chat.json"):
        s3.put_object(Bucket=DATASETS, Key=f"{prefix}{suffix}", Body=b"x")
    for suffix in (".bin", ".idx", ".tasks.jsonl"):
        s3.put_object(Bucket=DATASETS, Key=heldout + suffix, Body=b"x")


def finetune(stack: Stack, capsys, *argv: str) -> tuple[int, str, str]:
    status = trainer_main(
        ["finetune", "--stack", "test", "--outputs", str(stack.outputs_file), "--image", IMAGE_TAG, "--run", RUN,
         "--dataset", "chat", "--poll-s", "0.05", *TOKENIZER_ARGS, *argv]
    )  # fmt: skip
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def submitted(stack: Stack) -> list[dict]:
    return stack.requests("SubmitJob")


def command_of(request: dict) -> list[str]:
    return request["nodeOverrides"]["nodePropertyOverrides"][0]["containerOverrides"]["command"]


def batch_job(job_id: str):
    return batch_backends["123456789012"][REGION]._jobs[job_id]


def publish_stage_outputs(stack: Stack, tmp_path: Path, *, tag: str = "candidate", under: str = "") -> str:
    """What the stages job leaves under /fsx/checkpoints, made by the stages' own code (a recorded checkpoint, its
    evaluation, the tag event under the root, an export and its marker), copied key for key into the checkpoints
    bucket as FSx's auto-export of /fsx/checkpoints does (infra/lustre.py), below `under` (a team's teams/<team>/);
    the version."""
    prefix = prepared(tmp_path / "data", "some text to train on. " * 50)
    lineage = Lineage(config(prefix, prefix + ".tokenizer.json"), environ={})
    root = tmp_path / "fsx-checkpoints"
    checkpoint = sealed_checkpoint(root / RUN / "checkpoints" / "iter_0000200", 1.5)
    write_record(checkpoint, lineage.record(checkpoint, 200, {"val_loss": 1.5}))
    add_evaluation(checkpoint, "llama3-8b-sft", {"suite": "trainer/configs/suites/llama3-8b-sft.yaml"})
    _, version = pipeline.promote(root / RUN, root, checkpoint, tag)
    export = root / RUN / "export" / version
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}\n")
    (export / "model.safetensors").write_bytes(b"weights")
    pipeline.write_marker(root / RUN / "export", version)
    s3 = stack.client("s3")
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        s3.put_object(
            Bucket=CHECKPOINTS, Key=under + path.relative_to(root).as_posix(), Body=path.read_bytes()
        )
    return version


def test_a_first_call_submits_the_training_job_with_submits_checks_and_the_chat_dataset(stack, capsys):
    upload_inputs(stack)
    status, out, err = finetune(stack, capsys)
    assert status == 0, err
    (request,) = submitted(stack)
    assert request["jobName"] == RUN and request["nodeOverrides"]["numNodes"] == 4
    command = command_of(request)
    assert command[:3] == ["train", "--config", "trainer/configs/llama3-8b-sft.yaml"]
    assert (
        "data.prefixes=[/fsx/datasets/chat/chat]" in command
        and f"logging.run_dir=/fsx/checkpoints/{RUN}" in command
    )
    job_id = stack.jobs()[0]["jobId"]
    assert out.splitlines()[0].startswith(f"train: submitted (job {job_id}): 4 x p5.48xlarge (")
    assert "stages" not in out  # without --wait the call returns once the job is submitted


def test_the_next_call_finds_training_succeeded_and_submits_one_one_node_stages_job(stack, capsys):
    upload_inputs(stack)
    assert finetune(stack, capsys)[0] == 0
    status, out, err = finetune(stack, capsys)  # moto's Batch ends the training job at once, SUCCEEDED
    assert status == 0, err
    train_id = stack.jobs()[0]["jobId"]
    train, stages = submitted(stack)
    assert out.splitlines()[0] == f"train: succeeded (job {train_id})"
    assert out.splitlines()[1].startswith("stages: submitted (job ")
    assert stages["jobName"] == f"{RUN}-stages" and stages["jobQueue"] == "gpu-queue"
    # One node of the stack's multi-node definition, the revision with the training job's image (Batch API
    # Reference, NodeOverrides: numNodes may be lowered to 1 with the open node range "0:" and main node 0).
    assert stages["nodeOverrides"]["numNodes"] == 1 and stages["jobDefinition"] == train["jobDefinition"]
    environment = stages["nodeOverrides"]["nodePropertyOverrides"][0]["containerOverrides"]["environment"]
    assert {"name": "TRAINSTACK_RUN", "value": RUN} in environment
    assert any(e["name"] == IMAGE_DIGEST_ENV for e in environment)  # the records carry the digest
    # The command as the image's entrypoint hands it to `trainer launch`, then launch to the stages verb.
    parser = argparse.ArgumentParser()
    node.add_arguments(parser)
    launch = parser.parse_args(command_of(stages))
    assert launch.nproc_per_node == 1 and launch.skip_preflight and launch.verb[0] == "finetune-stages"
    verb = argparse.ArgumentParser()
    pipeline.add_arguments(verb)
    stage_args = verb.parse_args(launch.verb[1:])
    assert (stage_args.run, stage_args.tags_root) == (
        Path(f"/fsx/checkpoints/{RUN}"),
        Path("/fsx/checkpoints"),
    )
    assert (
        stage_args.suite == Path("trainer/configs/suites/llama3-8b-sft.yaml")
        and stage_args.record == "llama3-8b-sft"
    )
    assert (stage_args.tag, stage_args.dtype, str(stage_args.tokenizer)) == ("candidate", "bf16", TOKENIZER)


def test_a_stage_whose_outputs_are_in_the_bucket_is_done_and_nothing_is_submitted(stack, capsys, tmp_path):
    upload_inputs(stack)
    finetune(stack, capsys)
    finetune(stack, capsys)
    status, out, _ = finetune(stack, capsys)  # the stages job ended, but FSx has exported nothing yet
    assert status == 0
    stages_id = next(job["jobId"] for job in stack.jobs() if job["jobName"] == f"{RUN}-stages")
    assert out.splitlines()[1] == f"stages: succeeded (job {stages_id})"
    assert (
        "stages: the bucket lacks any model version under s3://trainstack-test-checkpoints/sft-a/ yet" in out
    )
    version = publish_stage_outputs(stack, tmp_path)
    status, out, _ = finetune(stack, capsys)
    assert status == 0
    assert out.splitlines()[-1] == (
        f"stages: done ({version}: evaluated as 'llama3-8b-sft', tagged 'candidate', exported to "
        f"s3://{CHECKPOINTS}/{RUN}/export/{version}/)"
    )
    assert len(submitted(stack)) == 2  # train and stages, once each


def test_an_export_missing_a_file_in_the_bucket_is_not_done(stack, capsys, tmp_path):
    upload_inputs(stack)
    finetune(stack, capsys)
    finetune(stack, capsys)
    version = publish_stage_outputs(stack, tmp_path)
    stack.client("s3").delete_object(Bucket=CHECKPOINTS, Key=f"{RUN}/export/{version}/model.safetensors")
    status, out, _ = finetune(stack, capsys)
    assert status == 0
    assert (
        f"1 of the export's 2 files (e.g. s3://{CHECKPOINTS}/{RUN}/export/{version}/model.safetensors)" in out
    )
    assert len(submitted(stack)) == 2


def test_an_active_training_job_is_named_and_nothing_more_is_submitted(stack, capsys):
    upload_inputs(stack)
    finetune(stack, capsys)
    job_id = stack.jobs()[0]["jobId"]
    job = batch_job(job_id)
    job.status, job.job_stopped = "RUNNING", False  # moto ends jobs at once; this one is still running
    status, out, _ = finetune(stack, capsys)
    assert status == 0 and out.splitlines() == [f"train: running (job {job_id})"]
    assert len(submitted(stack)) == 1


def test_a_failed_training_job_is_an_error_naming_it_and_retry_submits_it_again(stack, capsys, monkeypatch):
    upload_inputs(stack)
    monkeypatch.setenv("MOTO_SIMPLE_BATCH_FAIL_AFTER", "0")  # moto's Batch fails jobs at once
    finetune(stack, capsys)
    job_id = stack.jobs()[0]["jobId"]
    status, out, err = finetune(stack, capsys)
    assert status == 1
    assert f"finetune: train: failed (job {job_id}" in err
    assert f"its log: make logs STACK=test JOB={job_id}; once fixed, RETRY=1 submits it again" in err
    assert len(submitted(stack)) == 1
    monkeypatch.delenv("MOTO_SIMPLE_BATCH_FAIL_AFTER")
    status, out, err = finetune(stack, capsys, "--retry")
    assert status == 0, err
    assert out.startswith("train: submitted (job ") and len(submitted(stack)) == 2


def test_a_stages_job_from_before_the_latest_training_is_submitted_again(stack, capsys):
    upload_inputs(stack)
    finetune(stack, capsys)
    finetune(stack, capsys)
    ids = {job["jobName"]: job["jobId"] for job in stack.jobs()}
    train_id, stages_id = ids[RUN], ids[f"{RUN}-stages"]
    batch_job(stages_id).job_created_at = batch_job(train_id).job_created_at.replace(year=2000)
    status, out, _ = finetune(stack, capsys)
    assert status == 0 and out.splitlines()[1].startswith("stages: submitted (job ")
    assert len(submitted(stack)) == 3


@pytest.mark.slow
def test_wait_follows_both_jobs_then_waits_for_the_bucket(stack, capsys):
    upload_inputs(stack)
    status, out, _ = finetune(stack, capsys, "--wait", "--export-timeout-s", "0")
    lines = out.splitlines()
    assert [line.split(" (job")[0] for line in lines[:4]] == [
        "train: submitted", "train: succeeded", "stages: submitted", "stages: succeeded",
    ]  # fmt: skip
    assert status == 1 and "and did not within 0 s: check the data repository association" in lines[-1]


def test_bad_input_is_refused_before_anything_is_submitted(stack, capsys, tmp_path):
    status, _, err = finetune(stack, capsys)  # nothing uploaded
    assert status == 2
    assert (
        "DATASET=chat: s3://trainstack-test-datasets/chat/chat.bin" in err and "make data STACK=test" in err
    )
    upload_inputs(stack)
    status, _, err = finetune(stack, capsys, "--run", "bad name!")
    assert status == 2 and "RUN='bad name!': use letters, digits" in err
    status, _, err = finetune(stack, capsys, "--tag", "Prod!")
    assert status == 2 and "--tag 'Prod!'" in err
    status, _, err = finetune(stack, capsys, "--suite", str(tmp_path / "suite.yaml"))
    assert status == 2 and "the image carries trainer/ only" in err
    stack.client("s3").delete_object(Bucket=DATASETS, Key="sft/heldout.tasks.jsonl")
    status, _, err = finetune(stack, capsys)
    assert status == 2
    assert (
        "generation.0.file = '/fsx/datasets/sft/heldout.tasks.jsonl': s3://trainstack-test-datasets/sft"
        in err
    )
    assert trainer_main(["finetune", "--stack", "nope", "--outputs", str(tmp_path / "none.json")]) == 2
    assert "OUTPUTS=" in capsys.readouterr().err
    assert submitted(stack) == []


def test_a_published_dataset_version_is_read_from_its_latest_pointer(stack, capsys):
    upload_inputs(stack, "chat/0123abcd/chat")  # what `make data STACK=` publishes: <name>/<version>/<name>
    latest = {"version": "0123abcd", "prefix": "/fsx/datasets/chat/0123abcd/chat"}
    stack.client("s3").put_object(Bucket=DATASETS, Key="chat/latest.json", Body=json.dumps(latest).encode())
    status, _, err = finetune(stack, capsys)
    assert status == 0, err
    assert "data.prefixes=[/fsx/datasets/chat/0123abcd/chat]" in command_of(submitted(stack)[0])


def test_the_training_job_reads_the_tokenizer_its_dataset_was_prepared_with(stack, capsys):
    upload_inputs(stack)
    status = trainer_main(
        ["finetune", "--stack", "test", "--outputs", str(stack.outputs_file), "--image", IMAGE_TAG, "--run", RUN,
         "--dataset", "chat"]
    )  # fmt: skip
    assert status == 0, capsys.readouterr().err
    assert "data.tokenizer_path=/fsx/datasets/chat/chat.tokenizer.json" in command_of(submitted(stack)[0])


@pytest.mark.slow
def test_make_finetune_on_a_stack_runs_the_driver(stack):
    upload_inputs(stack)
    arguments = ("DATASET=chat", f"RUN={RUN}", f"IMAGE={IMAGE_TAG}", f"ARGS={' '.join(TOKENIZER_ARGS)}")
    result = stack.make("finetune", *arguments)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("train: submitted (job ")
    result = stack.make("finetune", *arguments)
    assert result.returncode == 0, result.stderr
    assert "stages: submitted (job " in result.stdout
    assert [r["jobName"] for r in submitted(stack)] == [RUN, f"{RUN}-stages"]


@pytest.mark.slow
def test_on_eks_the_stages_job_is_a_one_pod_jobset_the_pinned_schema_accepts(eks_stack, api_server, capsys):  # noqa: F811
    upload_inputs(eks_stack)
    status, out, err = finetune(eks_stack, capsys)
    assert status == 0, err
    assert out.splitlines()[0].startswith(f"train: submitted (job {RUN}): 4 x p5.48xlarge")
    (train,) = api_server.received
    api_server.jobsets[RUN]["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}
    status, out, err = finetune(eks_stack, capsys)
    assert status == 0, err
    assert out.splitlines()[0] == f"train: succeeded (job {RUN})"
    assert out.splitlines()[1].startswith(f"stages: submitted (job {RUN}-stages)")
    stages = api_server.received[1]
    assert jobset_errors(stages) == []
    job = stages["spec"]["replicatedJobs"][0]
    assert job["replicas"] == 1 and job["template"]["spec"]["parallelism"] == 1
    container = job["template"]["spec"]["template"]["spec"]["containers"][0]
    train_container = train["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["image"] == train_container["image"]
    assert container["args"][:4] == ["--skip-preflight", "--nproc-per-node", "1", "finetune-stages"]
    status, out, _ = finetune(eks_stack, capsys)  # the stages JobSet has not finished
    assert out.splitlines()[1] == f"stages: submitted (job {RUN}-stages)"  # the JobSet's state, not a new one
    assert len(api_server.received) == 2


def test_on_eks_a_failed_jobset_is_named(eks_stack, api_server, capsys):  # noqa: F811
    upload_inputs(eks_stack)
    finetune(eks_stack, capsys)
    api_server.jobsets[RUN]["status"] = {
        "conditions": [{"type": "Failed", "status": "True", "message": "jobset failed: node exit 1"}]
    }
    status, _, err = finetune(eks_stack, capsys)
    assert status == 1 and f"train: failed (job {RUN}: Failed: jobset failed: node exit 1)" in err
    assert len(api_server.received) == 1


@pytest.mark.slow
def test_on_eks_a_stale_stages_jobset_is_deleted_before_the_new_one(eks_stack, api_server, capsys):  # noqa: F811
    upload_inputs(eks_stack)
    finetune(eks_stack, capsys)
    api_server.jobsets[RUN]["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}
    finetune(eks_stack, capsys)
    stages = api_server.jobsets[f"{RUN}-stages"]
    stages["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    stages["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}
    # The run trained again since (a later attempt of its JobSet ended after the stages job was created).
    api_server.jobsets[RUN]["status"]["conditions"][0]["lastTransitionTime"] = "2026-02-01T00:00:00Z"
    status, out, err = finetune(eks_stack, capsys)
    assert status == 0, err
    assert out.splitlines()[1].startswith(f"stages: submitted (job {RUN}-stages)")
    assert [d["name"] for d in api_server.deletions] == [f"{RUN}-stages"]
    assert [r["metadata"]["name"] for r in api_server.received] == [RUN, f"{RUN}-stages", f"{RUN}-stages"]


@pytest.mark.slow
def test_wait_polls_a_running_training_job_until_it_ends(stack, capsys, monkeypatch):
    upload_inputs(stack)
    finetune(stack, capsys)
    job_id = stack.jobs()[0]["jobId"]
    job = batch_job(job_id)
    job.status, job.job_stopped = "RUNNING", False
    real_sleep = time.sleep

    def ends_during_the_first_wait(seconds: float) -> None:
        # The job ends while the verb waits between its first and second look (a count, not a timer a loaded
        # machine can outrun); only the verb's own thread counts, not the moto server's.
        if threading.current_thread() is threading.main_thread():
            job.status, job.job_stopped = "SUCCEEDED", True  # what Batch reports once the main node exits 0
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", ends_during_the_first_wait)
    status, out, _ = finetune(stack, capsys, "--wait", "--export-timeout-s", "0")
    lines = out.splitlines()
    assert lines[:2] == [f"train: running (job {job_id})", f"train: succeeded (job {job_id})"]
    assert lines[2].startswith("stages: submitted (job ") and lines[3].startswith("stages: succeeded (job ")
    assert status == 1 and len(submitted(stack)) == 2


def test_outputs_older_than_the_training_job_are_not_its_own(stack, capsys, tmp_path):
    upload_inputs(stack)
    publish_stage_outputs(stack, tmp_path)  # an earlier training's, complete in the bucket
    finetune(stack, capsys)
    train = batch_job(stack.jobs()[0]["jobId"])
    train.job_created_at = train.job_created_at.replace(year=train.job_created_at.year + 1)  # trained since
    status, out, _ = finetune(stack, capsys)
    assert status == 0 and out.splitlines()[1].startswith("stages: submitted (job ")
    assert len(submitted(stack)) == 2


# A stack shared by teams (infra/teams.py, docs/security.md#teams): a team fine-tunes as it trains, under its share,
# on its own data, with its run, versions and tags under teams/<team>/.
TEAMS = {"teams": ["vision", "speech"], "team_gpu_quotas": {"vision": 32, "speech": 32}}
VISION = "teams/vision/"


def team_suite(tmp_path: Path, monkeypatch, team: str = "vision") -> Path:
    """The default suite over the team's own held-out data (its role may check only its own prefix), as a file of
    an image's trainer/ tree (the driver checks that the image carries it)."""
    root = tmp_path / "image"
    path = root / "trainer" / "configs" / "suites" / "llama3-8b-sft.yaml"  # its record: the default name
    path.parent.mkdir(parents=True)
    suite = yaml.safe_load(Path("trainer/configs/suites/llama3-8b-sft.yaml").read_text())
    suite["perplexity"][0]["data"] = f"/fsx/datasets/teams/{team}/sft/heldout"
    suite["generation"][0]["file"] = f"/fsx/datasets/teams/{team}/sft/heldout.tasks.jsonl"
    path.write_text(yaml.safe_dump(suite))
    monkeypatch.setattr(finetune_driver, "ROOT", root)
    return path


def team_finetune(stack: Stack, capsys, suite: Path, *argv: str) -> tuple[int, str, str]:
    tokenizer = f"data.tokenizer_path=/fsx/datasets/{VISION}chat/chat.tokenizer.json"  # the dataset's own
    return finetune(stack, capsys, "--team", "vision", "--suite", str(suite), "--set", tokenizer, *argv)


@pytest.mark.slow
def test_a_team_fine_tunes_under_its_share_on_its_data_with_its_versions_and_tags_under_its_prefix(
    stack, capsys, tmp_path, monkeypatch
):
    stack.outputs_file.write_text(json.dumps({**stack.outputs, **TEAMS}))
    suite = team_suite(tmp_path, monkeypatch)
    upload_inputs(stack, f"{VISION}chat/chat", f"{VISION}sft/heldout")
    status, out, err = team_finetune(stack, capsys, suite)
    assert status == 0, err
    (train,) = submitted(stack)
    assert train["shareIdentifier"] == "vision" and train["tags"]["team"] == "vision"
    assert "data.prefixes=[/fsx/datasets/teams/vision/chat/chat]" in command_of(train)
    assert f"logging.run_dir=/fsx/checkpoints/teams/vision/{RUN}" in command_of(train)
    assert "follow it: make logs STACK=test TEAM=vision JOB=" in out
    # Another team's newer job of the run's name, failed, on the one queue: not this team's.
    speech = stack.client("batch").submit_job(
        jobName=RUN, jobQueue="gpu-queue", jobDefinition=train["jobDefinition"], shareIdentifier="speech",
        schedulingPriorityOverride=0, tags={"team": "speech"},
    )["jobId"]  # fmt: skip
    batch_job(speech).status = "FAILED"
    status, out, err = team_finetune(stack, capsys, suite)
    assert status == 0, err
    assert out.splitlines()[0] == f"train: succeeded (job {stack.jobs()[0]['jobId']})"
    stages = submitted(stack)[-1]
    assert stages["jobName"] == f"{RUN}-stages" and stages["shareIdentifier"] == "vision"
    parser = argparse.ArgumentParser()
    node.add_arguments(parser)
    verb = argparse.ArgumentParser()
    pipeline.add_arguments(verb)
    stage_args = verb.parse_args(parser.parse_args(command_of(stages)).verb[1:])
    assert (stage_args.run, stage_args.tags_root) == (
        Path(f"/fsx/checkpoints/teams/vision/{RUN}"),
        Path("/fsx/checkpoints/teams/vision"),  # its tags beside its runs, where models list --team reads
    )
    version = publish_stage_outputs(stack, tmp_path, under=VISION)
    status, out, err = team_finetune(stack, capsys, suite)
    assert status == 0, err
    assert out.splitlines()[-1] == (
        f"stages: done ({version}: evaluated as 'llama3-8b-sft', tagged 'candidate', exported to "
        f"s3://{CHECKPOINTS}/teams/vision/{RUN}/export/{version}/)"
    )
    assert len(submitted(stack)) == 3  # vision's two, speech's one: nothing more


def test_a_teams_fine_tune_is_refused_its_deploy_data_outside_its_prefix_and_a_missing_team(
    stack, capsys, tmp_path, monkeypatch
):
    stack.outputs_file.write_text(json.dumps({**stack.outputs, **TEAMS}))
    upload_inputs(stack)  # the stack's own dataset and suite files, at the bucket's root
    upload_inputs(stack, f"{VISION}chat/chat", f"{VISION}sft/heldout")
    status, _, err = finetune(stack, capsys)
    assert status == 2 and "stack 'test' is shared by teams vision, speech: say which with TEAM=<name>" in err
    status, _, err = team_finetune(
        stack, capsys, finetune_driver.DEFAULT_SUITE
    )  # it reads /fsx/datasets/sft/
    assert status == 2
    assert (
        "perplexity.0.data = '/fsx/datasets/sft/heldout': team vision's data lives under "
        "/fsx/datasets/teams/vision/" in err
    )
    status, _, err = team_finetune(stack, capsys, team_suite(tmp_path, monkeypatch), "--deploy")
    assert status == 2 and "DEPLOY=1 with TEAM=vision: the endpoint is the stack's" in err
    assert submitted(stack) == []


def test_on_eks_a_teams_fine_tune_runs_and_is_found_in_its_namespace(
    teams_stack,  # noqa: F811
    api_server,  # noqa: F811
    capsys,
    tmp_path,
    monkeypatch,
):
    suite = team_suite(tmp_path, monkeypatch)
    upload_inputs(teams_stack, f"{VISION}chat/chat", f"{VISION}sft/heldout")
    status, out, err = team_finetune(teams_stack, capsys, suite)
    assert status == 0, err
    assert "make logs STACK=test TEAM=vision JOB=sft-a FOLLOW=1" in out
    held = api_server.namespaces["team-vision"]
    held[RUN]["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}
    status, out, err = team_finetune(teams_stack, capsys, suite)
    assert status == 0, err
    assert out.splitlines()[0] == f"train: succeeded (job {RUN})"
    assert sorted(held) == [RUN, f"{RUN}-stages"] and list(api_server.namespaces) == ["team-vision"]
    stages = held[f"{RUN}-stages"]
    assert jobset_errors(stages) == [] and stages["metadata"]["labels"]["team"] == "vision"
    args = stages["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert re.search(r"--tags-root /fsx/checkpoints/teams/vision(?: |$)", " ".join(args))
