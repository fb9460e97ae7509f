"""`make train STACK=... TEAM=<name>` on a stack shared by teams: the job carries the team's share and tag, its run
and data live under the team's prefix, and a missing, unknown or over-quota team, or data outside its prefix, is
refused before anything is submitted."""

from __future__ import annotations

import json

import pytest

from trainer.__main__ import main as trainer_main

from .conftest import Stack
from .test_submit import submit_in_process, train

# A team's copy of the conftest corpus, where `make data STACK= TEAM=vision LOCAL=1` puts it.
TEAM_DATA = "/fsx/datasets/teams/vision/corpus/corpus"
TEAM_ARGS = f"--set data.prefixes=[{TEAM_DATA}] --set data.tokenizer_path={TEAM_DATA}.tokenizer.json"

TEAMS = {"teams": ["vision", "speech"], "team_gpu_quotas": {"vision": 16, "speech": 32}}


def share(stack: Stack) -> None:
    stack.outputs_file.write_text(json.dumps({**stack.outputs, **TEAMS}))


def team_data(stack: Stack, team: str = "vision") -> None:
    for suffix in (".bin", ".idx", ".tokenizer.json"):
        key = f"teams/{team}/corpus/corpus{suffix}"
        stack.client("s3").put_object(Bucket="trainstack-test-datasets", Key=key, Body=b"x")


def command(submitted: dict) -> list[str]:
    return submitted["nodeOverrides"]["nodePropertyOverrides"][0]["containerOverrides"]["command"]


def test_make_train_team_submits_to_the_team_share_with_its_tag_and_its_run_under_its_prefix(stack):
    share(stack)
    team_data(stack)
    result = train(stack, "TEAM=vision", "NODES=2", "RUN=vision-a", args=TEAM_ARGS)
    assert result.returncode == 0, result.stderr
    (submitted,) = stack.requests("SubmitJob")
    assert submitted["shareIdentifier"] == "vision"
    assert submitted["schedulingPriorityOverride"] == 0  # fair-share queues refuse a job without a priority
    assert submitted["tags"] == {"trainstack:run": "vision-a", "trainstack:stack": "test", "team": "vision"}
    assert "logging.run_dir=/fsx/checkpoints/teams/vision/vision-a" in command(submitted)
    assert "(s3://trainstack-test-checkpoints/teams/vision/vision-a)" in result.stdout


def test_two_teams_runs_of_one_name_never_share_a_checkpoint_directory(stack, capsys):
    share(stack)
    team_data(stack, "vision")
    team_data(stack, "speech")
    for team in ("vision", "speech"):
        data = TEAM_ARGS.replace("/vision/", f"/{team}/")
        status, stderr = submit_in_process(
            stack, capsys, "--team", team, "--nodes", "1", "--run", "llama", args=data
        )
        assert status == 0, stderr
    vision, speech = (command(s) for s in stack.requests("SubmitJob"))
    assert "logging.run_dir=/fsx/checkpoints/teams/vision/llama" in vision
    assert "logging.run_dir=/fsx/checkpoints/teams/speech/llama" in speech


def test_a_running_job_of_another_team_with_the_runs_name_neither_blocks_nor_is_replaced(stack, capsys):
    """One job per run is per team: two teams' runs of one name live in different directories, and a team role may
    not stop another team's job (infra/teams.py StopOwnJobs), so REPLACE=1 must not try."""
    from .test_one_job_per_run import _running

    share(stack)
    team_data(stack, "vision")
    team_data(stack, "speech")
    status, stderr = submit_in_process(
        stack, capsys, "--team", "vision", "--nodes", "1", "--run", "llama", args=TEAM_ARGS
    )
    assert status == 0, stderr
    _running(stack)  # vision's llama is RUNNING
    speech = TEAM_ARGS.replace("/vision/", "/speech/")
    for replace in ((), ("--replace",)):
        status, stderr = submit_in_process(
            stack, capsys, "--team", "speech", "--nodes", "1", "--run", "llama", *replace, args=speech
        )
        assert status == 0, stderr
    assert stack.requests("TerminateJob") == []
    status, stderr = submit_in_process(
        stack, capsys, "--team", "vision", "--nodes", "1", "--run", "llama", args=TEAM_ARGS
    )
    assert status == 2 and "RUN=llama: job " in stderr and "of this run is RUNNING" in stderr


def test_a_team_run_reads_only_data_under_its_own_prefix(stack, capsys):
    share(stack)
    status, stderr = submit_in_process(stack, capsys, "--team", "vision", "--nodes", "1")
    assert status == 2
    assert (
        "data.prefixes[0] = '/fsx/datasets/corpus/corpus': team vision's data lives under "
        "/fsx/datasets/teams/vision/ (s3://trainstack-test-datasets/teams/vision/); upload it with "
        "make data STACK=test TEAM=vision SRC=... LOCAL=1"
    ) in stderr
    assert "data.tokenizer_path = '/fsx/datasets/corpus/corpus.tokenizer.json'" in stderr
    assert stack.requests("SubmitJob") == []


@pytest.mark.parametrize(
    ("argv", "teams", "message"),
    [
        ([], TEAMS, "stack 'test' is shared by teams vision, speech: say which with TEAM=<name>"),
        (["--team", "audio"], TEAMS, "TEAM=audio: not a team of stack 'test'; its teams are vision, speech"),
        (
            ["--team", "vision", "--nodes", "4"],
            TEAMS,
            "NODES=4: 32 GPUs is over team 'vision''s quota of 16 (trainstack:teams gpuQuota); ask for at most 2",
        ),
        (
            ["--team", "vision"],
            {},
            "TEAM=vision: stack 'test' has no teams (trainstack:teams); leave TEAM out",
        ),
    ],
)
def test_team_refusals_name_the_problem_and_submit_nothing(stack, capsys, argv, teams, message):
    stack.outputs_file.write_text(json.dumps({**stack.outputs, **teams}))
    status, stderr = submit_in_process(stack, capsys, *argv)
    assert status == 2 and message in stderr
    assert stack.requests("SubmitJob") == [] and stack.jobs() == []


def test_on_batch_status_takes_a_team_of_the_stack_and_lists_the_one_queue(stack, capsys):
    # Batch job ids are unique in the stack's one queue: TEAM= is checked, and needed only on EKS (test_eks.py).
    share(stack)
    base = ["job", "status", "--stack", "test", "--outputs", str(stack.outputs_file)]
    assert trainer_main(base) == 0
    assert trainer_main([*base, "--team", "vision"]) == 0
    assert trainer_main([*base, "--team", "audio"]) == 2
    assert "TEAM=audio: not a team of stack 'test'; its teams are vision, speech" in capsys.readouterr().err
