"""Turning `trainstack:teams` on or off on a running stack, and what a fair-share submission must carry.

The rules come from botocore's Batch model (the API reference's text): a queue created without a scheduling policy
can never get one, and one with a policy can never lose it, so that change must replace the queue (pulumi-aws
would otherwise plan UpdateJobQueue); and Batch refuses a fair-share job with no scheduling priority
(nextflow-io/nextflow pull 3505 quotes the 400).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import botocore.session
import pytest
from botocore.stub import Stubber

from tests.infra.test_teams import TEAMS
from trainer.aws.outputs import StackOutputs
from trainer.jobs.request import Submission, batch_job_request

POLICY = "schedulingPolicyArn"


def batch_model():
    return botocore.session.get_session().get_service_model("batch")


def queue_update_problems(before: dict, after: dict, replace_on_changes: list[str]) -> list[str]:
    """What UpdateJobQueue would refuse in the change `before` -> `after` of a queue pulumi updates in place."""
    had, has = before.get(POLICY) is not None, after.get(POLICY) is not None
    if had == has or POLICY in replace_on_changes:
        return []
    change = "add a fair-share policy to a FIFO queue" if has else "remove the queue's fair-share policy"
    return [f"UpdateJobQueue cannot {change}: replace the queue (replace_on_changes=['{POLICY}'])"]


def test_the_model_says_a_queue_can_neither_gain_nor_lose_its_policy():
    shapes = batch_model().operation_model("CreateJobQueue").input_shape.members
    assert "can't have a fair-share scheduling policy added" in shapes[POLICY].documentation
    update = batch_model().operation_model("UpdateJobQueue").input_shape.members
    assert "can be replaced but not removed" in update[POLICY].documentation


@pytest.mark.parametrize("name", ["dev", "prod"])
def test_turning_teams_on_or_off_replaces_the_gpu_queue(variant, name):
    single, shared = variant(name), variant(name, **{"trainstack:teams": json.dumps(TEAMS)})
    for queue in single.all("batch.JobQueue"):
        after = next(q for q in shared.all("batch.JobQueue") if q.name == queue.name)
        on, off = (queue.inputs, after.inputs), (after.inputs, queue.inputs)
        assert queue_update_problems(*on, after.replace_on_changes) == []
        assert queue_update_problems(*off, queue.replace_on_changes) == []
    assert POLICY in shared.one("batch.JobQueue", "-gpu").inputs


def test_the_queue_as_registered_before_issue_36_is_an_in_place_update_batch_refuses(variant):
    single, shared = variant("dev"), variant("dev", **{"trainstack:teams": json.dumps(TEAMS)})
    before, after = single.one("batch.JobQueue", "-gpu"), shared.one("batch.JobQueue", "-gpu")
    [problem] = queue_update_problems(before.inputs, after.inputs, [])
    assert "add a fair-share policy to a FIFO queue" in problem
    [problem] = queue_update_problems(after.inputs, before.inputs, [])
    assert "remove the queue's fair-share policy" in problem


def fair_share_refusal(request: dict, definition: dict) -> str | None:
    """Batch's answer to a SubmitJob on a fair-share queue (model: shareIdentifier "must be specified"; pull 3505:
    a scheduling priority from the definition or the request)."""
    if "shareIdentifier" not in request:
        return "shareIdentifier must be specified on a queue with a fair-share scheduling policy"
    if "schedulingPriority" not in definition and "schedulingPriorityOverride" not in request:
        return (
            "Either schedulingPriority in job definition or schedulingPriorityOverride should be specified."
        )
    return None


def test_a_team_submission_carries_a_priority_batchs_model_accepts():
    outputs = StackOutputs(
        "dev", {"region": "us-east-1", "job_queue": "trainstack-dev-gpu-1a2b3c4", "teams": ["vision"]}
    )
    submission = Submission("vision-a", 2, 8, "repo:tag", ["train"], team="vision")
    request = batch_job_request(
        submission, outputs, "arn:aws:batch:us-east-1:123456789012:job-definition/d:2"
    )
    # The stack's job definitions set no schedulingPriority (infra/cluster.py), so the request must.
    assert fair_share_refusal(request, {}) is None
    assert 0 <= request["schedulingPriorityOverride"] <= 9999
    before = {k: v for k, v in request.items() if k != "schedulingPriorityOverride"}
    assert "schedulingPriorityOverride should be specified" in str(fair_share_refusal(before, {}))
    batch = botocore.session.get_session().create_client("batch", region_name="us-east-1")
    with Stubber(batch) as stub:  # the Stubber validates the request against botocore's model
        stub.add_response("submit_job", {"jobName": "vision-a", "jobId": "1"}, request)
        batch.submit_job(**request)


def share_refusal(queue_has_policy: bool, request: dict) -> str | None:
    """SubmitJob `shareIdentifier` against the queue (botocore batch model: "Don't specify this parameter if the job
    queue doesn't have a fair-share scheduling policy. If the job queue has a fair-share scheduling policy, then
    this parameter must be specified")."""
    if queue_has_policy and "shareIdentifier" not in request:
        return "shareIdentifier must be specified on a queue with a fair-share scheduling policy"
    if not queue_has_policy and "shareIdentifier" in request:
        return "shareIdentifier given to a queue without a fair-share scheduling policy"
    return None


def test_the_model_states_the_share_identifier_rule_both_ways():
    text = batch_model().operation_model("SubmitJob").input_shape.members["shareIdentifier"].documentation
    assert "Don't specify this parameter if the job queue doesn't have a fair-share scheduling policy" in text
    assert (
        "If the job queue has a fair-share scheduling policy, then this parameter must be specified" in text
    )


@pytest.mark.parametrize("teams", [False, True])
def test_a_sweep_on_the_spot_queue_carries_a_share_exactly_when_the_queue_has_the_teams_policy(
    variant, teams
):
    """A team's sweep workers go to the Spot queue with the team's share (trainer/jobs/sweep.py), so with teams
    that queue has the GPU queue's fair-share policy; without teams neither has one, and no job carries a share."""
    from trainer.jobs.sweep import StackSweep, sweep_request

    changes = {"trainstack:teams": json.dumps(TEAMS)} if teams else {}
    planned = variant("dev", **changes)
    gpu, spot = planned.one("batch.JobQueue", "-gpu"), planned.one("batch.JobQueue", "-spot")
    assert (POLICY in spot.inputs) is teams and spot.inputs.get(POLICY) == gpu.inputs.get(POLICY)
    team = TEAMS[0]["name"] if teams else None
    outputs = StackOutputs("dev", {"region": "us-east-1", "spot_job_queue": "trainstack-dev-spot-9a8b7c6"})
    sweep = StackSweep(Path("trainer/configs/local-sweep.yaml"), "lr", 8, 2, None, team, "abc", ())
    request = sweep_request(sweep, outputs, "arn:aws:batch:us-east-1:123456789012:job-definition/s:1")
    assert share_refusal(POLICY in spot.inputs, request) is None
    assert fair_share_refusal(request, {}) is None if teams else "shareIdentifier" not in request
    batch = botocore.session.get_session().create_client("batch", region_name="us-east-1")
    with Stubber(batch) as stub:  # the Stubber validates the request against botocore's model
        stub.add_response("submit_job", {"jobName": sweep.job_name, "jobId": "1"}, request)
        batch.submit_job(**request)


def model_text(shape: str, member: str) -> str:
    return str(batch_model().shape_for(shape).members[member].documentation)


def test_weight_factor_bounds_are_the_models():
    """Issue 46 item 11: the config's bounds are the ones ShareAttributes.weightFactor states in .venv's botocore."""
    from infra.config import TeamConfig

    found = re.search(
        r"smallest supported value is (\d+\.\d+), and the largest supported value is (\d+\.\d+)",
        model_text("ShareAttributes", "weightFactor"),
    )
    assert found is not None
    smallest, largest = (float(v) for v in found.groups())
    member = {"name": "vision", "gpuQuota": 8, "members": [TEAMS[0]["members"][0]]}
    for accepted in (smallest, largest):
        assert TeamConfig.model_validate({**member, "weightFactor": accepted}).weight_factor == accepted
    for refused in (smallest / 2, largest + 0.0001, 0):
        with pytest.raises(ValueError):
            TeamConfig.model_validate({**member, "weightFactor": refused})


def test_team_names_are_share_identifiers_the_model_accepts():
    """Issue 46 item 13: a share identifier is alphanumeric (the model's text), so a team name has no '-'."""
    from infra.config import TeamConfig

    assert "alphanumeric characters" in model_text("ShareAttributes", "shareIdentifier")
    member = {"gpuQuota": 8, "members": [TEAMS[0]["members"][0]]}
    assert TeamConfig.model_validate({**member, "name": "vision2"}).name == "vision2"
    with pytest.raises(ValueError, match="alphanumeric only"):
        TeamConfig.model_validate({**member, "name": "vision-2"})
