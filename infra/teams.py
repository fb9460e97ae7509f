"""Teams on a shared stack (`trainstack:teams`): one role per team, one policy for all of them, and fair share.

Attribute-based (IAM User Guide, "Define permissions based on attributes with ABAC authorization"): each team role
carries the tag `team=<name>`, which is the `aws:PrincipalTag/team` of every session of that role, and all team roles
share ONE policy written with `${aws:PrincipalTag/team}`, so a new team is a new config entry, never new policy text.
It allows exactly the calls `make train|smoke|finetune|sweep|status|logs|cancel STACK= TEAM=` and
`make data STACK= TEAM= LOCAL=1` make (tests/jobs/test_team_workflow.py runs them as the role and checks every call
against this policy):

- S3: list, read and write (not delete: the platform operators prune) only under `teams/<team>/` of the datasets
  and checkpoints buckets (its runs, data and model versions: trainer/contract/teams.py), and the two buckets'
  location (the residency check);
- ECR: describe the stack's repository's images (the image check, and the digest the job records);
- Batch: submit only to the stack's GPU and Spot queues (training, smoke and fine-tune jobs; sweep workers) with
  the job definitions of the stack, with the share identifier `<team>` (`batch:ShareIdentifier`, Batch User Guide
  "Resource: Use the batch:ShareIdentifier condition key") and
  the tag `team=<team>` on the job (`aws:RequestTag/team`, the cost-allocation tag); register a revision of the
  training or Spot definition for a new image of the stack's repository, with nothing else changed that IAM can see
  (not privileged, no user, the jobs' log group; passing only its two roles, tagged only with the stack's own tags);
  terminate (what `make cancel` does) only jobs tagged `team=<team>` (`aws:ResourceTag/team`); never tag a job that
  already has a `team` tag (every job the stack's verbs submit gets one at submission: trainer/jobs/teams.py), nor
  untag one.
- CloudWatch Logs: read the jobs' log group.
- Describe/List of jobs take no resource (Service Authorization Reference, "Actions, resources, and condition keys
  for AWS Batch"): every team can see the queue's job list, not only its own (docs/security.md, what is not covered).

A team's `members` (IAM principals) and/or `identityCenterGroup` may assume its role. For a group, the team gets a
permission set `<stack>-<team>` in that Identity Center instance whose only permission is `sts:AssumeRole` on the
team role, assigned to the group on this account; the team role trusts the role Identity Center provisions for it.

The GPU queue (and the Spot queue, where sweeps run) gets a fair-share scheduling policy with one share per team
(Batch API `FairsharePolicy`, `ShareAttributes.weightFactor`: a lower factor gets more of the queue), so a team with
many jobs queued cannot starve another. A queue cannot gain or lose that policy, so turning teams on or off replaces the
queue (infra/cluster.py), and team jobs carry a scheduling priority (trainer/jobs/teams.py). Batch has no per-share
ceiling; the team's `gpuQuota` is checked at submission (trainer/jobs/submit.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_aws as aws

from infra.config import IdentityCenterGroup, StackConfig, TeamConfig, permission_set_name
from infra.iam import BATCH_READ_ACTIONS, allow, policy_document
from trainer.contract.teams import JOB_TAG_KEYS, TEAM_TAG, TEAMS_PREFIX

if TYPE_CHECKING:
    from infra.data_lake import DataLake
    from infra.identity import Identity
    from infra.keys import Keys
    from infra.registry import Registry

# IAM policy variable: the calling session's `team` principal tag (IAM User Guide, "IAM policy elements: Variables").
TEAM = "${aws:PrincipalTag/" + TEAM_TAG + "}"
# Fair-share usage decays over an hour (FairsharePolicy.shareDecaySeconds): yesterday's big run does not count today.
SHARE_DECAY_SECONDS = 3600


def identity_center_role_pattern(account: str, permission_set: str) -> str:
    """The ARNs of the role Identity Center provisions for a permission set in an account, whatever its suffix.

    IAM Identity Center User Guide, "Referencing permission sets in resource policies, Amazon EKS, and AWS KMS":
    role/aws-reserved/sso.amazonaws.com/<region>/AWSReservedSSO_<permission-set-name>_<unique-suffix>, no <region>
    when the identity source is in us-east-1, and a new suffix whenever the role is re-created: hence the wildcards.
    """
    return f"arn:aws:iam::{account}:role/aws-reserved/sso.amazonaws.com/*AWSReservedSSO_{permission_set}_*"


def team_trust_statements(
    cfg: StackConfig, team: TeamConfig, account: pulumi.Input[str]
) -> list[dict[str, Any]]:
    """Who may assume a team's role: its IAM principals, and its Identity Center group's provisioned role."""
    statements: list[dict[str, Any]] = []
    if team.members:
        statements.append({"Effect": "Allow", "Principal": {"AWS": team.members}, "Action": "sts:AssumeRole"})
    if team.identity_center_group is not None:
        # The account as principal, narrowed by aws:PrincipalArn: a role ARN as Principal goes stale whenever
        # Identity Center re-creates the role with a new suffix (same guide as above).
        statements.append(
            {
                "Sid": "IdentityCenterGroup",
                "Effect": "Allow",
                "Principal": {"AWS": pulumi.Output.concat("arn:aws:iam::", account, ":root")},
                "Action": "sts:AssumeRole",
                "Condition": {
                    "ArnLike": {
                        "aws:PrincipalArn": pulumi.Output.from_input(account).apply(
                            lambda account_id: identity_center_role_pattern(
                                account_id, permission_set_name(cfg.stack, team.name)
                            )
                        )
                    }
                },
            }
        )
    return statements


def scheduling_policy(cfg: StackConfig, opts: pulumi.ResourceOptions) -> aws.batch.SchedulingPolicy | None:
    """The GPU and Spot queues' fair-share policy, one share per team; None keeps first-in-first-out queues (and on
    EKS, where Kueue shares the nodes: infra/eks_teams.py)."""
    if not cfg.teams or cfg.orchestrator == "eks":
        return None
    return aws.batch.SchedulingPolicy(
        f"{cfg.name_prefix}-teams",
        fair_share_policy={
            "share_decay_seconds": SHARE_DECAY_SECONDS,
            "share_distributions": [
                {"share_identifier": team.name, "weight_factor": team.weight_factor} for team in cfg.teams
            ],
        },
        opts=opts,
    )


def team_access_statements(
    cfg: StackConfig,
    account: pulumi.Input[str],
    buckets: Sequence[pulumi.Input[str]],
    key_arn: pulumi.Input[str],
    repository_arn: pulumi.Input[str],
    repository_url: pulumi.Input[str],
    job_roles: Sequence[pulumi.Input[str]],
) -> list[dict[str, Any]]:
    """The one team policy: every scope is `${aws:PrincipalTag/team}`, nothing names a team."""
    batch = pulumi.Output.concat("arn:aws:batch:", cfg.region, ":", account)
    own_objects = [pulumi.Output.concat(bucket, "/", TEAMS_PREFIX, TEAM, "/*") for bucket in buckets]
    # Pulumi names the queues and definitions <name>-<suffix>; a SubmitJob names a revision (<name>-<suffix>:<n>).
    # The training definition (train, smoke, fine-tune) on the GPU queue; the Spot one (a sweep's workers) on the Spot
    # queue (infra/cluster.py). A stack without trainstack:spot has neither, and the patterns match nothing.
    definitions = [
        pulumi.Output.concat(batch, ":job-definition/", cfg.name_prefix, kind)
        for kind in ("-train-*", "-spot-*")
    ]
    queues = [
        pulumi.Output.concat(batch, ":job-queue/", cfg.name_prefix, kind) for kind in ("-gpu-*", "-spot-*")
    ]
    jobs = pulumi.Output.concat(batch, ":job/*")
    return [
        allow(
            "SubmitToOwnShare",
            ["batch:SubmitJob"],
            [*queues, *definitions],
            Condition={"StringEquals": {"batch:ShareIdentifier": TEAM, f"aws:RequestTag/{TEAM_TAG}": TEAM}},
        ),
        # Tags given to SubmitJob are authorised as batch:TagResource on the new job too (Service Authorization
        # Reference, AWS Batch "API operations" table: SubmitJob -> batch:SubmitJob, batch:TagResource). On
        # creation the job has no tags (aws:ResourceTag/team absent: the Null operator, IAM User Guide "IAM JSON
        # policy elements: Condition operators"), and afterwards it always has a `team` tag, so this allows
        # tagging only at submission, only with the team's own name (aws:RequestTag/team) and only the keys
        # submit sets (aws:TagKeys, ForAllValues: every key in the request is one of them).
        allow(
            "TagOwnJobsOnSubmit",
            ["batch:TagResource"],
            [jobs],
            Condition={
                "StringEquals": {f"aws:RequestTag/{TEAM_TAG}": TEAM},
                "ForAllValues:StringEquals": {"aws:TagKeys": list(JOB_TAG_KEYS)},
                "Null": {f"aws:ResourceTag/{TEAM_TAG}": "true"},
            },
        ),
        # And whatever else allows it: no team re-tags or untags a job that has a team tag (IAM User Guide, "Policy
        # evaluation logic": an explicit deny overrides any allow).
        {
            "Sid": "NeverRetagJobs",
            "Effect": "Deny",
            "Action": ["batch:TagResource", "batch:UntagResource"],
            "Resource": [jobs],
            "Condition": {"Null": {f"aws:ResourceTag/{TEAM_TAG}": "false"}},
        },
        allow(
            "StopOwnJobs",
            [
                "batch:TerminateJob"
            ],  # `make cancel` terminates (trainer/jobs/job.py cancel): dequeued or running
            [jobs],
            Condition={"StringEquals": {f"aws:ResourceTag/{TEAM_TAG}": TEAM}},
        ),
        # A new image needs a new revision of the multi-node definition (Batch cannot override its image at
        # submission: trainer/jobs/submit.py job_definition_for). RegisterJobDefinition takes the job-definition
        # resource (Service Authorization Reference, AWS Batch, Actions table); the revision carries the
        # definition's job and execution roles (iam:PassRole on exactly those, IAM User Guide "Grant a user
        # permissions to pass a role to an AWS service") and its tags, which are the stack's default tags
        # (infra/__main__.py) and are authorised as batch:TagResource: only those keys with the stack's values.
        # Only with the contents the stack's own revision has, apart from the image, which must come from the
        # stack's repository (Batch User Guide, "Resource: Restrict to POSIX user, Docker image, privilege level,
        # and role on job submission"; condition keys from the Service Authorization Reference, AWS Batch): not
        # privileged (absent means not: RegisterJobDefinition `privileged` defaults to false), no `user` (the
        # image's own, as the stack's definitions have it), the awslogs driver into the jobs' log group.
        allow(
            "RegisterJobDefinitions",
            ["batch:RegisterJobDefinition"],
            definitions,
            Condition={
                "StringLike": {
                    "batch:Image": [
                        pulumi.Output.concat(repository_url, ":*"),
                        pulumi.Output.concat(repository_url, "@sha256:*"),
                    ]
                },
                "BoolIfExists": {"batch:Privileged": "false"},
                "Null": {"batch:User": "true"},
                "StringEqualsIfExists": {
                    "batch:LogDriver": "awslogs",
                    "batch:AWSLogsGroup": cfg.jobs_log_group,
                },
            },
        ),
        allow("PassTheDefinitionsRoles", ["iam:PassRole"], list(job_roles)),
        allow(
            "TagDefinitionsWithTheStackTags",
            ["batch:TagResource"],
            definitions,
            Condition={
                "ForAllValues:StringEquals": {"aws:TagKeys": sorted(cfg.tags)},
                "StringEquals": {f"aws:RequestTag/{key}": value for key, value in sorted(cfg.tags.items())},
            },
        ),
        allow("SeeQueue", list(BATCH_READ_ACTIONS), ["*"]),
        # The image check and the digest the job records (ECR DescribeImages: the repository resource, Service
        # Authorization Reference, Amazon ECR).
        allow("SeeImages", ["ecr:DescribeImages"], [repository_arn]),
        # The run's log (CloudWatch Logs GetLogEvents on a stream of the group; CloudWatch Logs User Guide,
        # "Overview of managing access permissions": the group ARN with ":*" in IAM policies).
        allow(
            "ReadJobLogs",
            ["logs:GetLogEvents"],
            [
                pulumi.Output.concat(
                    "arn:aws:logs:", cfg.region, ":", account, ":log-group:", cfg.jobs_log_group, ":*"
                )
            ],
        ),
        # The residency check (trainer/jobs/residency.py): S3 GetBucketLocation, on the bucket resource.
        allow("LocateBuckets", ["s3:GetBucketLocation"], list(buckets)),
        allow(
            "ListOwnPrefixes",
            ["s3:ListBucket"],
            list(buckets),
            Condition={"StringLike": {"s3:prefix": [f"{TEAMS_PREFIX}{TEAM}/", f"{TEAMS_PREFIX}{TEAM}/*"]}},
        ),
        # HeadObject is authorised as s3:GetObject (S3 API Reference, HeadObject "Permissions").
        allow(
            "ReadWriteOwnPrefixes",
            ["s3:AbortMultipartUpload", "s3:GetObject", "s3:PutObject"],
            own_objects,
        ),
        # The key policy lets principals of the account use the key only through S3 (and the stack's services).
        allow("UseStackKeyThroughS3", ["kms:Decrypt", "kms:GenerateDataKey"], [key_arn]),
    ]


@dataclass
class TeamsArgs:
    config: StackConfig
    account_id: pulumi.Input[str]
    keys: Keys
    lake: DataLake
    identity: Identity
    registry: Registry


class Teams(pulumi.ComponentResource):
    """One role per team, tagged with its name; one shared ABAC policy; the queue's fair-share policy."""

    def __init__(self, name: str, args: TeamsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainstack:teams:Teams", name, None, opts)
        cfg, child = args.config, pulumi.ResourceOptions(parent=self)
        self.scheduling_policy = scheduling_policy(cfg, child)
        self.roles: dict[str, aws.iam.Role] = {}
        self.outputs: dict[str, Any] = {}
        if not cfg.teams:
            self.register_outputs({})
            return
        buckets = [args.lake.datasets.arn, args.lake.checkpoints.arn]
        self.policy = aws.iam.Policy(
            f"{cfg.name_prefix}-team-access",
            description="Every team role: its own queue share, jobs and S3 prefixes (scoped by the team tag)",
            policy=policy_document(
                *team_access_statements(
                    cfg,
                    args.account_id,
                    buckets,
                    args.keys.key.arn,
                    args.registry.repository.arn,
                    args.registry.repository.repository_url,
                    [args.identity.job_role.arn, args.identity.execution_role.arn],
                )
            ),
            opts=child,
        )
        for team in cfg.teams:
            role = aws.iam.Role(
                f"{cfg.name_prefix}-team-{team.name}",
                description=f"Team {team.name} on {cfg.stack}: its queue share, its jobs, its S3 prefixes",
                assume_role_policy=policy_document(*team_trust_statements(cfg, team, args.account_id)),
                tags={TEAM_TAG: team.name},
                opts=child,
            )
            aws.iam.RolePolicyAttachment(
                f"{cfg.name_prefix}-team-{team.name}", role=role.name, policy_arn=self.policy.arn, opts=child
            )
            self.roles[team.name] = role
            if team.identity_center_group is not None:
                self._identity_center_access(
                    cfg, team, team.identity_center_group, role, args.account_id, child
                )
        # The `team` cost-allocation tag is activated later, by hand, as `stack` is (docs/cost.md#budgets-and-tags):
        # a tag key is listed for activation only once it reaches billing data, up to 24 hours after first applied
        # (pulumi-aws costexplorer.CostAllocationTag note), and only the payer account may activate it (a linked
        # account gets AccessDeniedException, 2i2c-org/infrastructure pull 4932); policy/cost.py refuses activating
        # one in the program (`cost-tags-activated-later`).
        self.outputs = {
            "teams": [team.name for team in cfg.teams],
            "team_role_arns": {name: role.arn for name, role in self.roles.items()},
            "team_gpu_quotas": {team.name: team.gpu_quota for team in cfg.teams},
        }
        self.register_outputs(self.outputs)

    def _identity_center_access(
        self,
        cfg: StackConfig,
        team: TeamConfig,
        group: IdentityCenterGroup,
        role: aws.iam.Role,
        account: pulumi.Input[str],
        opts: pulumi.ResourceOptions,
    ) -> None:
        """The team's permission set (assume the team role, nothing else), assigned to its group on this account."""
        name = f"{cfg.name_prefix}-team-{team.name}"
        permission_set = aws.ssoadmin.PermissionSet(
            name,
            name=permission_set_name(cfg.stack, team.name),
            instance_arn=group.instance_arn,
            description=f"Team {team.name} on {cfg.stack}: assume {name} (its queue share, jobs, S3 prefixes)",
            tags={TEAM_TAG: team.name},
            opts=opts,
        )
        inline_policy = aws.ssoadmin.PermissionSetInlinePolicy(
            name,
            instance_arn=group.instance_arn,
            permission_set_arn=permission_set.arn,
            inline_policy=policy_document(allow("AssumeTeamRole", ["sts:AssumeRole"], [role.arn])),
            opts=opts,
        )
        # Assigned after the inline policy exists, so the role provisioned in the account carries it from the start.
        aws.ssoadmin.AccountAssignment(
            name,
            instance_arn=group.instance_arn,
            permission_set_arn=permission_set.arn,
            principal_id=group.group_id,
            principal_type="GROUP",
            target_id=account,
            target_type="AWS_ACCOUNT",
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[inline_policy])),
        )
