"""Turning `trainstack:teams` on or off on a running stack, and what a fair-share submission must carry.

The rules come from botocore's Batch model (the API reference's text): a queue created without a scheduling policy
can never get one, and one with a policy can never lose it, so that change must replace the queue (pulumi-aws
would otherwise plan UpdateJobQueue); and Batch refuses a fair-share job with no scheduling priority
(nextflow-io/nextflow pull 3505 quotes the 400).
"""

from __future__ import annotations

import json

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
