"""Teams (infra/teams.py) under the Pulumi mocks, and each team's access decided by evaluating the generated policy.

The evaluator is moto 5.2.5's IAM policy engine (`moto.iam.access_control.IAMPolicy`): the package index holds no
maintained IAM policy evaluator for Python (principalmapper 1.1.5, the one that evaluates conditions and policy
variables, last released in 2022, fails to import on Python 3.10+). moto matches actions and resources with
wildcards and evaluates `StringEquals` conditions; it does not substitute policy variables, so the tests substitute
`${aws:PrincipalTag/team}` with the role's tag first, as IAM does at request time (IAM User Guide, "IAM policy
elements: Variables and tags"), and it ignores other condition operators (pinned below: `StringLike` list scoping is
therefore not proven offline). The documented example at the end checks the engine against AWS's own text.
"""

from __future__ import annotations

import json

import pytest
from moto.iam.access_control import IAMPolicy, PermissionResult

from infra.config import StackConfigError, parse_stack_config, read_stack_file
from infra.mocks import ACCOUNT_ID
from infra.teams import TEAM
from trainer.contract.teams import team_prefix

TEAMS = [
    {"name": "vision", "gpuQuota": 16, "members": [f"arn:aws:iam::{ACCOUNT_ID}:role/vision-engineers"]},
    {
        "name": "speech",
        "gpuQuota": 32,
        "weightFactor": 0.5,
        "members": [f"arn:aws:iam::{ACCOUNT_ID}:user/ana", f"arn:aws:iam::{ACCOUNT_ID}:role/speech-ci"],
    },
]
REGION = "us-west-2"  # prod's
BATCH = f"arn:aws:batch:{REGION}:{ACCOUNT_ID}"
# The physical names Pulumi gives the queue and job definition: <resource name>-<7 hex>.
QUEUE = f"{BATCH}:job-queue/trainstack-prod-gpu-1a2b3c4"
DEFINITION = f"{BATCH}:job-definition/trainstack-prod-train-5d6e7f8:3"


@pytest.fixture(scope="module")
def two_teams(variant):
    return variant("prod", **{"trainstack:teams": json.dumps(TEAMS)})


def role_policy(stack, team: str) -> IAMPolicy:
    """The policy attached to a team's role, with the team tag substituted as IAM substitutes it for a session."""
    role = stack.one("iam.Role", f"-team-{team}")
    tag = role.inputs["tags"]["team"]
    (attachment,) = [a for a in stack.all("iam.RolePolicyAttachment") if a.name.endswith(f"-team-{team}")]
    (policy,) = [p for p in stack.all("iam.Policy") if p.outputs["arn"] == attachment.inputs["policyArn"]]
    return IAMPolicy(policy.inputs["policy"].replace(TEAM, tag))


def decide(policy: IAMPolicy, action: str, resource: str, **context: str) -> PermissionResult:
    return policy.is_action_permitted(action, resource, incoming_condition_values=context or None)


def object_arn(stack, bucket: str, key: str) -> str:
    return f"{stack.one('s3.Bucket', f'-{bucket}').outputs['arn']}/{key}"


ALLOWED = PermissionResult.PERMITTED


@pytest.mark.parametrize("bucket", ["datasets", "checkpoints"])
@pytest.mark.parametrize("action", ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"])
def test_each_team_reaches_its_own_prefix_and_not_the_others(two_teams, bucket, action):
    for team, other in (("vision", "speech"), ("speech", "vision")):
        policy = role_policy(two_teams, team)
        own = object_arn(two_teams, bucket, f"{team_prefix(team)}run1/shard-0.bin")
        theirs = object_arn(two_teams, bucket, f"{team_prefix(other)}run1/shard-0.bin")
        outside = object_arn(two_teams, bucket, "data/shared/shard-0.bin")
        assert decide(policy, action, own) == ALLOWED
        assert decide(policy, action, theirs) != ALLOWED
        assert decide(policy, action, outside) != ALLOWED


def test_a_team_submits_only_to_its_own_share_with_its_tag(two_teams):
    policy = role_policy(two_teams, "vision")
    own = {"batch:ShareIdentifier": "vision", "aws:RequestTag/team": "vision"}
    for resource in (QUEUE, DEFINITION):
        assert decide(policy, "batch:SubmitJob", resource, **own) == ALLOWED
        assert (
            decide(policy, "batch:SubmitJob", resource, **{**own, "batch:ShareIdentifier": "speech"})
            != ALLOWED
        )
        assert (
            decide(policy, "batch:SubmitJob", resource, **{**own, "aws:RequestTag/team": "speech"}) != ALLOWED
        )
    spot_queue = f"{BATCH}:job-queue/trainstack-prod-spot-9a8b7c6"
    assert decide(policy, "batch:SubmitJob", spot_queue, **own) != ALLOWED


def test_a_team_tags_jobs_only_with_its_own_name(two_teams):
    """The tag-on-create check (StringEquals); its StringEqualsIfExists guard against re-tagging another team's
    job is not evaluated by moto (docs/security.md, what only a real account shows)."""
    job = f"{BATCH}:job/0d6e5f3a-1111-2222-3333-444455556666"
    policy = role_policy(two_teams, "vision")
    assert decide(policy, "batch:TagResource", job, **{"aws:RequestTag/team": "vision"}) == ALLOWED
    assert decide(policy, "batch:TagResource", job, **{"aws:RequestTag/team": "speech"}) != ALLOWED


@pytest.mark.parametrize("action", ["batch:CancelJob", "batch:TerminateJob"])
def test_a_team_stops_only_jobs_tagged_with_its_name(two_teams, action):
    job = f"{BATCH}:job/0d6e5f3a-1111-2222-3333-444455556666"
    policy = role_policy(two_teams, "speech")
    assert decide(policy, action, job, **{"aws:ResourceTag/team": "speech"}) == ALLOWED
    assert decide(policy, action, job, **{"aws:ResourceTag/team": "vision"}) != ALLOWED


def test_a_new_team_needs_no_new_policy_text(two_teams):
    (policy,) = two_teams.all("iam.Policy")
    assert TEAM in policy.inputs["policy"]
    assert not [t["name"] for t in TEAMS if t["name"] in policy.inputs["policy"]]
    attached = {
        a.inputs["policyArn"] for a in two_teams.all("iam.RolePolicyAttachment") if "-team-" in a.name
    }
    assert attached == {policy.outputs["arn"]}


def test_team_roles_trust_their_members_and_carry_the_team_tag(two_teams):
    for team in TEAMS:
        role = two_teams.one("iam.Role", f"-team-{team['name']}")
        assert role.inputs["tags"] == {"team": team["name"]}
        (trust,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
        assert trust["Principal"] == {"AWS": team["members"]} and trust["Action"] == "sts:AssumeRole"


def test_gpu_queue_shares_fairly_by_team(two_teams):
    policy = two_teams.one("batch.SchedulingPolicy", "-teams")
    shares = policy.inputs["fairSharePolicy"]["shareDistributions"]
    assert shares == [
        {"shareIdentifier": "vision", "weightFactor": 1.0},
        {"shareIdentifier": "speech", "weightFactor": 0.5},
    ]
    assert two_teams.one("batch.JobQueue", "-gpu").inputs["schedulingPolicyArn"] == policy.outputs["arn"]


def test_team_tag_is_a_cost_allocation_tag_and_teams_are_exported(two_teams):
    assert two_teams.one("costexplorer.CostAllocationTag").inputs == {"tagKey": "team", "status": "Active"}
    assert two_teams.plan.outputs["teams"] == ["vision", "speech"]
    assert set(two_teams.plan.outputs["team_role_arns"]) == {"vision", "speech"}
    assert two_teams.plan.outputs["team_gpu_quotas"] == {"vision": 16, "speech": 32}


def test_a_stack_without_teams_stays_single_tenant(stack):
    assert stack.all("batch.SchedulingPolicy") == []
    assert [r for r in stack.all("iam.Role") if "-team-" in r.name] == []
    assert "schedulingPolicyArn" not in stack.one("batch.JobQueue", "-gpu").inputs
    assert "teams" not in stack.plan.outputs


def test_two_team_stack_passes_the_policy_pack(two_teams):
    from policy.offline import evaluate, policy_resources

    assert evaluate(policy_resources(two_teams.plan), "prod") == []


@pytest.mark.parametrize(
    ("teams", "wanted"),
    [
        (
            [{**TEAMS[0], "name": "Vision"}],
            "trainstack:teams[0][name] = 'Vision': a team name is 2-32 characters",
        ),
        ([{**TEAMS[0], "gpuQuota": 4}], "team 'vision' gpuQuota = 4: below one node of p5.48xlarge (8 GPUs)"),
        ([{**TEAMS[0], "members": ["ana"]}], "'ana' is not an IAM principal ARN"),
        ([TEAMS[0], TEAMS[0]], "team names must be unique"),
    ],
)
def test_bad_teams_are_refused_with_the_key_and_what_is_valid(teams, wanted):
    with pytest.raises(StackConfigError) as error:
        parse_stack_config("prod", {**read_stack_file("prod"), "trainstack:teams": teams})
    assert wanted in str(error.value)


# --- the evaluator against AWS's documented examples ------------------------------------------------------------

# Batch User Guide, "Resource: Use the batch:ShareIdentifier condition key" (the policy as printed).
BATCH_SHARE_EXAMPLE = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Action": ["batch:SubmitJob"],
            "Resource": [
                "arn:aws:batch:us-east-2:555555555555:job-definition/JobDefA",
                "arn:aws:batch:us-east-2:555555555555:job-queue/jobqueue1",
            ],
            "Condition": {"StringEquals": {"batch:ShareIdentifier": ["lowCpu"]}},
        }
    ],
}
# IAM User Guide, "Amazon S3: Allows IAM users access to their S3 home directory, programmatically and in the
# console": its ListObjectsInBucket statement.
S3_HOME_LIST_EXAMPLE = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Sid": "ListObjectsInBucket",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": "arn:aws:s3:::amzn-s3-demo-bucket",
            "Condition": {"StringLike": {"s3:prefix": ["", "home/", "home/${aws:username}/*"]}},
        }
    ],
}


def test_evaluator_decides_the_documented_share_identifier_example_as_aws_describes():
    policy = IAMPolicy(json.dumps(BATCH_SHARE_EXAMPLE))
    queue = "arn:aws:batch:us-east-2:555555555555:job-queue/jobqueue1"
    assert decide(policy, "batch:SubmitJob", queue, **{"batch:ShareIdentifier": "lowCpu"}) == ALLOWED
    assert decide(policy, "batch:SubmitJob", queue, **{"batch:ShareIdentifier": "highCpu"}) != ALLOWED
    other_queue = "arn:aws:batch:us-east-2:555555555555:job-queue/jobqueue2"
    assert decide(policy, "batch:SubmitJob", other_queue, **{"batch:ShareIdentifier": "lowCpu"}) != ALLOWED


def test_evaluator_ignores_string_like_so_prefix_listing_is_not_proven_offline():
    """AWS denies listing another user's home/ prefix under this example; moto 5.2.5 allows it (StringLike is not
    evaluated). When moto learns StringLike this fails: then assert the teams' ListOwnPrefixes scoping too."""
    policy = IAMPolicy(json.dumps(S3_HOME_LIST_EXAMPLE))
    bucket = "arn:aws:s3:::amzn-s3-demo-bucket"
    assert decide(policy, "s3:ListBucket", bucket, **{"s3:prefix": "home/someone-else/"}) == ALLOWED
