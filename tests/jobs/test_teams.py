"""`make train STACK=... TEAM=<name>` on a stack shared by teams: the job carries the team's share and tag, and a
missing, unknown or over-quota team is refused before anything is submitted."""

from __future__ import annotations

import json

import pytest

from .conftest import Stack
from .test_submit import submit_in_process, train

TEAMS = {"teams": ["vision", "speech"], "team_gpu_quotas": {"vision": 16, "speech": 32}}


def share(stack: Stack) -> None:
    stack.outputs_file.write_text(json.dumps({**stack.outputs, **TEAMS}))


def test_make_train_team_submits_to_the_team_share_with_its_tag(stack):
    share(stack)
    result = train(stack, "TEAM=vision", "NODES=2", "RUN=vision-a")
    assert result.returncode == 0, result.stderr
    (submitted,) = stack.requests("SubmitJob")
    assert submitted["shareIdentifier"] == "vision"
    assert submitted["schedulingPriorityOverride"] == 0  # fair-share queues refuse a job without a priority
    assert submitted["tags"] == {"trainstack:run": "vision-a", "trainstack:stack": "test", "team": "vision"}


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
