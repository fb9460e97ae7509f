"""Teams (infra/teams.py) under the Pulumi mocks, and each team's access decided by evaluating the generated policy.

The evaluator is policy/iam_evaluation.py (IAM's evaluation logic, condition operators and policy variables, from the
IAM User Guide): moto 5.2.5's engine evaluates only `StringEquals` and reads a condition on an absent key as an
explicit deny, so it cannot decide the `Null` and `ForAllValues` conditions that keep a team from re-tagging jobs.
The documented examples at the end check the evaluator against AWS's own text. The whole team workflow, run as the
role against moto, is tests/jobs/test_team_workflow.py.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass

import pytest

from infra.config import StackConfigError, parse_stack_config, read_stack_file
from infra.mocks import ACCOUNT_ID
from infra.teams import TEAM, identity_center_role_pattern
from policy.actors import register_context
from policy.iam_evaluation import Request
from policy.iam_evaluation import decide as evaluate
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
# SSO Admin API reference: an instance ARN as AWS::SSO::Assignment's InstanceArn pattern has it, and the PrincipalId
# example GUID of CreateAccountAssignment (botocore 1.44.8 sso-admin service model documentation).
INSTANCE = "arn:aws:sso:::instance/ssoins-1234567890abcdef"
GROUP = "f81d4fae-7dec-11d0-a765-00a0c91e6bf6"
SSO_TEAMS = [
    {"name": "vision", "gpuQuota": 16, "identityCenterGroup": {"instanceArn": INSTANCE, "groupId": GROUP}},
    {**TEAMS[1], "identityCenterGroup": {"instanceArn": INSTANCE, "groupId": "0123456789-" + GROUP}},
]
REGION = "us-west-2"  # prod's
BATCH = f"arn:aws:batch:{REGION}:{ACCOUNT_ID}"
# The physical names Pulumi gives the queue and job definition: <resource name>-<7 hex>.
QUEUE = f"{BATCH}:job-queue/trainstack-prod-gpu-1a2b3c4"
DEFINITION = f"{BATCH}:job-definition/trainstack-prod-train-5d6e7f8:3"


@pytest.fixture(scope="module")
def two_teams(variant):
    return variant("prod", **{"trainstack:teams": json.dumps(TEAMS)})


@pytest.fixture(scope="module")
def sso_teams(variant):
    """vision: an Identity Center group only; speech: IAM members and a group."""
    return variant("prod", **{"trainstack:teams": json.dumps(SSO_TEAMS)})


@dataclass(frozen=True)
class RolePolicy:
    """The policy attached to a team's role, and the role's tags (its sessions' aws:PrincipalTag values)."""

    document: str
    tags: dict[str, str]


def role_policy(stack, team: str) -> RolePolicy:
    role = stack.one("iam.Role", f"-team-{team}")
    (attachment,) = [a for a in stack.all("iam.RolePolicyAttachment") if a.name.endswith(f"-team-{team}")]
    (policy,) = [p for p in stack.all("iam.Policy") if p.outputs["arn"] == attachment.inputs["policyArn"]]
    return RolePolicy(policy.inputs["policy"], dict(role.inputs["tags"]))


def decide(policy: RolePolicy | dict, action: str, resource: str, **context: str) -> str:
    if isinstance(policy, dict):  # a documented example, for a user named "someone"
        return evaluate([policy], Request(action, resource, context), {"aws:username": "someone"})
    variables = {f"aws:PrincipalTag/{k}": v for k, v in policy.tags.items()}
    return evaluate([policy.document], Request(action, resource, context), variables)


def object_arn(stack, bucket: str, key: str) -> str:
    return f"{stack.one('s3.Bucket', f'-{bucket}').outputs['arn']}/{key}"


ALLOWED = "allowed"


@pytest.mark.parametrize("bucket", ["datasets", "checkpoints"])
@pytest.mark.parametrize("action", ["s3:GetObject", "s3:PutObject"])
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
    spot_queue = (
        f"{BATCH}:job-queue/trainstack-prod-spot-9a8b7c6"  # a team's sweep workers (trainer/jobs/sweep.py)
    )
    spot_definition = f"{BATCH}:job-definition/trainstack-prod-spot-0f1e2d3:2"
    for resource in (QUEUE, DEFINITION, spot_queue, spot_definition):
        assert decide(policy, "batch:SubmitJob", resource, **own) == ALLOWED
        assert (
            decide(policy, "batch:SubmitJob", resource, **{**own, "batch:ShareIdentifier": "speech"})
            != ALLOWED
        )
        assert (
            decide(policy, "batch:SubmitJob", resource, **{**own, "aws:RequestTag/team": "speech"}) != ALLOWED
        )
    # The data preparation queue and definition are the platform operators' (docs/security.md#teams).
    data_queue = f"{BATCH}:job-queue/trainstack-prod-data-4d5e6f7"
    data_definition = f"{BATCH}:job-definition/trainstack-prod-data-8a9b0c1:1"
    for resource in (data_queue, data_definition):
        assert decide(policy, "batch:SubmitJob", resource, **own) != ALLOWED


JOB = f"{BATCH}:job/0d6e5f3a-1111-2222-3333-444455556666"
# What SubmitJob's tags put in the request (aws:RequestTag/<key>, aws:TagKeys) for team vision's job.
VISION_JOB_TAGS = {
    "aws:RequestTag/team": "vision",
    "aws:RequestTag/trainstack:run": "llama",
    "aws:RequestTag/trainstack:stack": "prod",
    "aws:TagKeys": ["trainstack:run", "trainstack:stack", "team"],
}


def test_a_team_tags_jobs_only_at_submission_with_its_own_name_and_keys(two_teams):
    policy = role_policy(two_teams, "vision")
    assert decide(policy, "batch:TagResource", JOB, **VISION_JOB_TAGS) == ALLOWED
    speech = {**VISION_JOB_TAGS, "aws:RequestTag/team": "speech"}
    assert decide(policy, "batch:TagResource", JOB, **speech) != ALLOWED
    extra_key = {**VISION_JOB_TAGS, "aws:TagKeys": ["team", "priority"], "aws:RequestTag/priority": "high"}
    assert decide(policy, "batch:TagResource", JOB, **extra_key) != ALLOWED


@pytest.mark.parametrize("owner", ["speech", "vision", "_stack"])
@pytest.mark.parametrize("action", ["batch:TagResource", "batch:UntagResource"])
def test_no_team_retags_or_untags_a_job_that_has_a_team_tag(two_teams, owner, action):
    """The data-preparation jobs carry team=_stack (trainer/jobs/teams.py): no team can claim them, nor another
    team's, nor re-tag its own; the Deny holds whatever else allows it."""
    policy = role_policy(two_teams, "vision")
    decision = decide(policy, action, JOB, **VISION_JOB_TAGS, **{"aws:ResourceTag/team": owner})
    assert decision == "explicitly denied"


def test_no_team_stops_a_job_tagged_for_the_stack_or_another_team(two_teams):
    policy = role_policy(two_teams, "vision")
    for owner in ("speech", "_stack"):
        assert decide(policy, "batch:TerminateJob", JOB, **{"aws:ResourceTag/team": owner}) != ALLOWED
    assert decide(policy, "batch:TerminateJob", JOB) != ALLOWED  # untagged: no aws:ResourceTag/team


def test_a_team_registers_training_revisions_passing_only_their_roles_and_the_stack_tags(two_teams):
    policy = role_policy(two_teams, "vision")
    repository = two_teams.one("ecr.Repository").outputs["repositoryUrl"]
    revision = register_context({**two_teams.node_container, "image": f"{repository}:v2"})
    assert decide(policy, "batch:RegisterJobDefinition", DEFINITION.rsplit(":", 1)[0], **revision) == ALLOWED
    data = f"{BATCH}:job-definition/trainstack-prod-data-1a2b3c4"
    assert decide(policy, "batch:RegisterJobDefinition", data, **revision) != ALLOWED
    # Batch User Guide's condition keys: nothing a team changes but the image, and that from the stack's repository.
    for planted in (
        {**revision, "batch:Privileged": "true"},
        {**revision, "batch:Image": "public.ecr.aws/someone/else:latest"},
        {**revision, "batch:User": "root"},
        {**revision, "batch:AWSLogsGroup": "/elsewhere"},
    ):
        assert (
            decide(policy, "batch:RegisterJobDefinition", DEFINITION.rsplit(":", 1)[0], **planted) != ALLOWED
        )
    job_role = two_teams.one("iam.Role", "-job").outputs["arn"]
    assert decide(policy, "iam:PassRole", job_role) == ALLOWED
    admin = f"arn:aws:iam::{ACCOUNT_ID}:role/admin"
    assert decide(policy, "iam:PassRole", admin) != ALLOWED
    tags = two_teams.config.tags
    stack_tags = {f"aws:RequestTag/{k}": v for k, v in tags.items()} | {"aws:TagKeys": list(tags)}
    assert decide(policy, "batch:TagResource", DEFINITION, **stack_tags) == ALLOWED
    changed = {**stack_tags, "aws:RequestTag/owner": "someone-else"}
    assert decide(policy, "batch:TagResource", DEFINITION, **changed) != ALLOWED


@pytest.mark.parametrize("action", ["batch:TerminateJob"])
def test_a_team_stops_only_jobs_tagged_with_its_name(two_teams, action):
    policy = role_policy(two_teams, "speech")
    assert decide(policy, action, JOB, **{"aws:ResourceTag/team": "speech"}) == ALLOWED
    assert decide(policy, action, JOB, **{"aws:ResourceTag/team": "vision"}) != ALLOWED


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


def test_team_tag_is_left_to_activate_later_and_teams_are_exported(two_teams):
    # AWS lists a tag for activation only once it reaches billing data (policy/cost.py cost-tags-activated-later).
    assert two_teams.all("costexplorer.CostAllocationTag") == []
    assert two_teams.plan.outputs["teams"] == ["vision", "speech"]
    assert set(two_teams.plan.outputs["team_role_arns"]) == {"vision", "speech"}
    assert two_teams.plan.outputs["team_gpu_quotas"] == {"vision": 16, "speech": 32}


def test_a_stack_without_teams_stays_single_tenant(stack):
    if stack.config.teams:  # eks-dev: teams on EKS, tests/infra/test_eks_teams.py
        assert stack.config.orchestrator == "eks" and stack.all("batch.SchedulingPolicy") == []
        return
    assert stack.all("batch.SchedulingPolicy") == []
    assert [r for r in stack.all("iam.Role") if "-team-" in r.name] == []
    if stack.config.orchestrator == "batch":
        assert "schedulingPolicyArn" not in stack.one("batch.JobQueue", "-gpu").inputs
    assert "teams" not in stack.plan.outputs


def test_two_team_stack_passes_the_policy_pack(two_teams):
    from policy.offline import evaluate, mandatory, policy_resources

    assert mandatory(evaluate(policy_resources(two_teams.plan), "prod")) == []


# --- IAM Identity Center groups -------------------------------------------------------------------------------


def test_a_group_team_gets_a_permission_set_in_its_instance(sso_teams):
    for team in ("vision", "speech"):
        permission_set = sso_teams.one("ssoadmin.PermissionSet", f"-team-{team}")
        assert permission_set.inputs["name"] == f"prod-{team}"
        assert permission_set.inputs["instanceArn"] == INSTANCE
        assert permission_set.inputs["tags"] == {"team": team}


def test_the_permission_set_only_assumes_its_own_team_role(sso_teams):
    roles = {team: sso_teams.one("iam.Role", f"-team-{team}").outputs["arn"] for team in ("vision", "speech")}
    for team, other in (("vision", "speech"), ("speech", "vision")):
        permission_set = sso_teams.one("ssoadmin.PermissionSet", f"-team-{team}")
        inline = sso_teams.one("ssoadmin.PermissionSetInlinePolicy", f"-team-{team}")
        assert inline.inputs["permissionSetArn"] == permission_set.outputs["arn"]
        assert inline.inputs["instanceArn"] == INSTANCE
        document = json.loads(inline.inputs["inlinePolicy"])
        assert document["Statement"] == [
            {
                "Sid": "AssumeTeamRole",
                "Effect": "Allow",
                "Action": ["sts:AssumeRole"],
                "Resource": [roles[team]],
            }
        ]
        policy = document
        assert decide(policy, "sts:AssumeRole", roles[team]) == ALLOWED
        assert decide(policy, "sts:AssumeRole", roles[other]) != ALLOWED
        assert (
            decide(policy, "s3:GetObject", object_arn(sso_teams, "datasets", "teams/vision/a.bin")) != ALLOWED
        )


def test_the_permission_set_is_assigned_to_the_group_on_this_account(sso_teams):
    groups = {team["name"]: team["identityCenterGroup"]["groupId"] for team in SSO_TEAMS}
    for team, group in groups.items():
        assignment = sso_teams.one("ssoadmin.AccountAssignment", f"-team-{team}")
        assert assignment.inputs == {
            "instanceArn": INSTANCE,
            "permissionSetArn": sso_teams.one("ssoadmin.PermissionSet", f"-team-{team}").outputs["arn"],
            "principalId": group,
            "principalType": "GROUP",
            "targetId": ACCOUNT_ID,
            "targetType": "AWS_ACCOUNT",
        }


def arn_like(pattern: str, arn: str) -> bool:
    """IAM's ArnLike (IAM User Guide, "IAM JSON policy elements: Condition operators", ARN condition operators):
    each of the six colon-separated parts matched on its own, `*` any run of characters and `?` one."""
    parts, values = pattern.split(":", 5), arn.split(":", 5)
    return len(values) == 6 and all(fnmatch.fnmatchcase(v, p) for p, v in zip(parts, values, strict=True))


# IAM Identity Center User Guide, "Referencing permission sets in resource policies, Amazon EKS, and AWS KMS": the
# role names and ARNs as the page prints them (the example's two suffixes, and the us-east-1 form without a region).
DOCUMENTED_ACCOUNT, DOCUMENTED_PERMISSION_SET = "111122223333", "DatabaseAdministrator"
DOCUMENTED_ROLE_ARNS = [
    "arn:aws:iam::111122223333:role/aws-reserved/sso.amazonaws.com/eu-west-2/AWSReservedSSO_DatabaseAdministrator_1234567890abcdef",
    "arn:aws:iam::111122223333:role/aws-reserved/sso.amazonaws.com/eu-west-2/AWSReservedSSO_DatabaseAdministrator_abcdef0123456789",
    "arn:aws:iam::111122223333:role/aws-reserved/sso.amazonaws.com/AWSReservedSSO_DatabaseAdministrator_1234567890abcdef",
]


@pytest.mark.parametrize("role_arn", DOCUMENTED_ROLE_ARNS)
def test_the_pattern_matches_the_documented_identity_center_role_arns(role_arn):
    assert arn_like(identity_center_role_pattern(DOCUMENTED_ACCOUNT, DOCUMENTED_PERMISSION_SET), role_arn)


@pytest.mark.parametrize(
    "role_arn",
    [
        # another permission set's role, another account's, a role outside the reserved path, a user
        DOCUMENTED_ROLE_ARNS[0].replace("DatabaseAdministrator", "ReadOnly"),
        DOCUMENTED_ROLE_ARNS[0].replace("111122223333", "444455556666"),
        "arn:aws:iam::111122223333:role/AWSReservedSSO_DatabaseAdministrator_1234567890abcdef",
        "arn:aws:iam::111122223333:user/AWSReservedSSO_DatabaseAdministrator_1234567890abcdef",
    ],
)
def test_the_pattern_refuses_other_roles(role_arn):
    assert not arn_like(identity_center_role_pattern(DOCUMENTED_ACCOUNT, DOCUMENTED_PERMISSION_SET), role_arn)


def test_a_group_team_role_trusts_the_account_only_for_its_permission_set_role(sso_teams):
    trust = json.loads(sso_teams.one("iam.Role", "-team-vision").inputs["assumeRolePolicy"])
    assert trust["Statement"] == [
        {
            "Sid": "IdentityCenterGroup",
            "Effect": "Allow",
            "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT_ID}:root"},
            "Action": "sts:AssumeRole",
            "Condition": {
                "ArnLike": {"aws:PrincipalArn": identity_center_role_pattern(ACCOUNT_ID, "prod-vision")}
            },
        }
    ]
    (pattern,) = trust["Statement"][0]["Condition"]["ArnLike"].values()
    provisioned = f"arn:aws:iam::{ACCOUNT_ID}:role/aws-reserved/sso.amazonaws.com/{REGION}/AWSReservedSSO_prod-vision_0a1b2c3d4e5f6a7b"
    assert arn_like(pattern, provisioned)
    assert not arn_like(pattern, provisioned.replace("prod-vision", "prod-speech"))


def test_a_team_with_members_and_a_group_trusts_both(sso_teams):
    trust = json.loads(sso_teams.one("iam.Role", "-team-speech").inputs["assumeRolePolicy"])
    members, group = trust["Statement"]
    assert members == {
        "Effect": "Allow",
        "Principal": {"AWS": TEAMS[1]["members"]},
        "Action": "sts:AssumeRole",
    }
    assert group["Condition"]["ArnLike"]["aws:PrincipalArn"].endswith("/*AWSReservedSSO_prod-speech_*")


def test_teams_without_a_group_get_no_identity_center_resources(two_teams):
    assert [r.type for r in two_teams.plan.resources if r.type.startswith("aws:ssoadmin/")] == []


def test_group_team_stack_passes_the_policy_pack(sso_teams):
    from policy.offline import evaluate, mandatory, policy_resources

    assert mandatory(evaluate(policy_resources(sso_teams.plan), "prod")) == []


GROUP_TEAM = SSO_TEAMS[0]


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
        (
            [{**TEAMS[0], "members": []}],
            "trainstack:teams[0][members] = []: List should have at least 1 item",
        ),
        (
            [{"name": "vision", "gpuQuota": 16}],
            "team 'vision' has neither members nor identityCenterGroup, so nobody could assume its role",
        ),
        (
            [
                {
                    **GROUP_TEAM,
                    "identityCenterGroup": {"instanceArn": "ssoins-1234567890abcdef", "groupId": GROUP},
                }
            ],
            "trainstack:teams[0][identityCenterGroup][instanceArn] = 'ssoins-1234567890abcdef': not an IAM "
            "Identity Center instance ARN; write arn:aws:sso:::instance/ssoins-",
        ),
        (
            [{**GROUP_TEAM, "identityCenterGroup": {"instanceArn": INSTANCE, "groupId": "vision-engineers"}}],
            "trainstack:teams[0][identityCenterGroup][groupId] = 'vision-engineers': not an identity store group "
            "id; write its GUID",
        ),
        (
            [{**GROUP_TEAM, "identityCenterGroup": {"instanceArn": INSTANCE}}],
            "trainstack:teams[0][identityCenterGroup][groupId]: required",
        ),
        (
            [{**GROUP_TEAM, "name": "a" + "b" * 27}],
            "its permission set name 'prod-abbbbbbbbbbbbbbbbbbbbbbbbbbb' is 33 characters; IAM Identity Center "
            "allows 32: shorten the team name",
        ),
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
    policy = BATCH_SHARE_EXAMPLE
    queue = "arn:aws:batch:us-east-2:555555555555:job-queue/jobqueue1"
    assert decide(policy, "batch:SubmitJob", queue, **{"batch:ShareIdentifier": "lowCpu"}) == ALLOWED
    assert decide(policy, "batch:SubmitJob", queue, **{"batch:ShareIdentifier": "highCpu"}) != ALLOWED
    other_queue = "arn:aws:batch:us-east-2:555555555555:job-queue/jobqueue2"
    assert decide(policy, "batch:SubmitJob", other_queue, **{"batch:ShareIdentifier": "lowCpu"}) != ALLOWED


def test_evaluator_scopes_listing_by_prefix_as_the_documented_home_directory_example():
    """AWS lets the user list the bucket's root, home/ and their own home/<username>/ only."""
    policy = S3_HOME_LIST_EXAMPLE
    bucket = "arn:aws:s3:::amzn-s3-demo-bucket"
    for prefix in ("", "home/", "home/someone/", "home/someone/photos/"):
        assert decide(policy, "s3:ListBucket", bucket, **{"s3:prefix": prefix}) == ALLOWED
    assert decide(policy, "s3:ListBucket", bucket, **{"s3:prefix": "home/someone-else/"}) != ALLOWED
    assert decide(policy, "s3:ListBucket", bucket) != ALLOWED  # no prefix in the request: StringLike fails


def test_a_team_lists_only_its_own_prefixes(two_teams):
    policy = role_policy(two_teams, "vision")
    for bucket in ("datasets", "checkpoints"):
        arn = two_teams.one("s3.Bucket", f"-{bucket}").outputs["arn"]
        assert decide(policy, "s3:ListBucket", arn, **{"s3:prefix": "teams/vision/"}) == ALLOWED
        assert decide(policy, "s3:ListBucket", arn, **{"s3:prefix": "teams/vision/llama/"}) == ALLOWED
        assert decide(policy, "s3:ListBucket", arn, **{"s3:prefix": "teams/speech/"}) != ALLOWED
        assert decide(policy, "s3:ListBucket", arn, **{"s3:prefix": ""}) != ALLOWED
