"""Teams on the EKS stack (infra/eks_teams.py): namespaces, Kueue queues in a cohort, access entries, pod identities.

The pods' S3 reach is proven twice: moto 5.2.5's IAM policy engine deciding the generated policy, and real S3 calls
under moto's request-time IAM enforcement with the credentials of an assumed role carrying that policy.
"""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.core import set_initial_no_auth_action_count
from moto.iam.access_control import IAMPolicy, PermissionResult

from infra.config import parse_stack_config, read_stack_file
from infra.eks_teams import (
    cluster_queue_name,
    pod_read_statements,
    team_group,
    team_namespace,
    team_nodes,
)
from infra.iam import policy_text
from trainer.contract.teams import TEAM_SERVICE_ACCOUNT, team_directories, team_prefix

TEAMS = ("vision", "language")


def objects(stack, kind: str) -> list[dict]:
    return [
        r.inputs
        for r in stack.plan.resources
        if r.type.startswith("kubernetes:") and r.type.endswith(f":{kind}")
    ]


@pytest.fixture(scope="module")
def stack(eks_stack):
    assert eks_stack.config.teams and [t.name for t in eks_stack.config.teams] == list(TEAMS)
    return eks_stack


def test_the_nodes_are_shared_by_weight_in_whole_nodes_summing_to_the_stack(stack):
    assert team_nodes(stack.config) == {"vision": (1, 1), "language": (1, 1)}
    teams = [
        {"name": "aa", "gpuQuota": 24, "weightFactor": 0.25, "members": ["arn:aws:iam::123456789012:role/a"]},
        {"name": "bb", "gpuQuota": 8, "members": ["arn:aws:iam::123456789012:role/b"]},
        {"name": "cc", "gpuQuota": 24, "members": ["arn:aws:iam::123456789012:role/c"]},
    ]
    three = parse_stack_config(
        "eks-dev", {**read_stack_file("eks-dev"), "trainstack:teams": teams, "trainstack:nodeCount": 3}
    )
    shares = team_nodes(three)
    assert sum(nominal for nominal, _ in shares.values()) == 3
    assert shares["aa"] == (2, 1) and shares["bb"] == (1, 0)  # aa's lower weightFactor: the larger share
    assert shares["cc"] == (
        0,
        3,
    )  # the remainder went to bb (ties by name); cc borrows idle nodes up to its quota


def test_each_team_has_a_queue_in_the_stacks_cohort_that_borrows_and_reclaims(stack):
    queues = {q["metadata"]["name"]: q["spec"] for q in objects(stack, "ClusterQueue")}
    assert set(queues) == {cluster_queue_name(stack.config, t) for t in TEAMS}
    for team in TEAMS:
        spec = queues[cluster_queue_name(stack.config, team)]
        assert spec["cohortName"] == stack.config.name_prefix
        assert spec["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": team_namespace(team)}
        }
        assert spec["preemption"]["reclaimWithinCohort"] == "Any"
        (flavor,) = spec["resourceGroups"][0]["flavors"]
        gpu = next(r for r in flavor["resources"] if r["name"] == "nvidia.com/gpu")
        assert (gpu["nominalQuota"], gpu["borrowingLimit"]) == (8, 8)


def test_each_team_namespace_has_the_stacks_local_queue_name_its_claim_and_service_account(stack):
    local = {
        (q["metadata"]["namespace"], q["metadata"]["name"]): q["spec"] for q in objects(stack, "LocalQueue")
    }
    for team in TEAMS:
        assert local[(team_namespace(team), stack.plan.outputs["kueue_local_queue"])] == {
            "clusterQueue": cluster_queue_name(stack.config, team)
        }
    claims = {
        (c["metadata"]["namespace"], c["metadata"]["name"]): c["spec"]["volumeName"]
        for c in objects(stack, "PersistentVolumeClaim")
    }
    volumes = {v["metadata"]["name"]: v["spec"]["claimRef"] for v in objects(stack, "PersistentVolume")}
    for team in TEAMS:
        for claim in team_directories(team):
            assert volumes[claims[(team_namespace(team), claim)]] == {
                "namespace": team_namespace(team),
                "name": claim,
            }
    accounts = {(a["metadata"]["namespace"], a["metadata"]["name"]) for a in objects(stack, "ServiceAccount")}
    # Each team's, and the stack namespace's own (infra/cluster_software.py).
    assert accounts == {(team_namespace(t), TEAM_SERVICE_ACCOUNT) for t in TEAMS} | {
        ("trainstack", TEAM_SERVICE_ACCOUNT)
    }
    assert stack.plan.outputs["team_namespaces"] == {t: team_namespace(t) for t in TEAMS}


def test_a_jobset_without_a_queue_is_refused_in_team_namespaces(stack):
    (policy,) = [p for p in objects(stack, "ValidatingAdmissionPolicy") if "queue" in p["metadata"]["name"]]
    (binding,) = [
        b for b in objects(stack, "ValidatingAdmissionPolicyBinding") if "queue" in b["metadata"]["name"]
    ]
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["jobsets"]
    assert "kueue.x-k8s.io/queue-name" in policy["spec"]["validations"][0]["expression"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]


def test_each_team_role_maps_to_its_group_and_may_find_the_cluster(stack):
    roles = {r.name.rsplit("-team-", 1)[1]: r for r in stack.all("iam.Role") if r.name.endswith(TEAMS)}
    entries = {e.name: e.inputs for e in stack.all("eks.AccessEntry")}
    for team in TEAMS:
        entry = entries[f"{stack.config.name_prefix}-team-{team}"]
        assert entry["principalArn"] == roles[team].outputs["arn"]
        assert (entry["kubernetesGroups"], entry["type"]) == ([team_group(team)], "STANDARD")
        (policy,) = [p for p in stack.all("iam.RolePolicy") if p.name.endswith(f"-team-{team}-eks")]
        (statement,) = json.loads(policy.inputs["policy"])["Statement"]
        assert statement["Action"] == ["eks:DescribeCluster"]
        assert statement["Resource"] == [stack.one("eks.Cluster").outputs["arn"]]


def pod_policy(stack, team: str) -> str:
    (policy,) = [p for p in stack.all("iam.RolePolicy") if p.name.endswith(f"-team-{team}-pods")]
    return str(policy.inputs["policy"])


def test_each_team_service_account_runs_as_its_own_pod_role(stack):
    associations = {a.name: a.inputs for a in stack.all("eks.PodIdentityAssociation")}
    for team in TEAMS:
        association = associations[f"{stack.config.name_prefix}-team-{team}"]
        assert (association["namespace"], association["serviceAccount"]) == (
            team_namespace(team),
            TEAM_SERVICE_ACCOUNT,
        )
        role = next(r for r in stack.all("iam.Role") if r.outputs["arn"] == association["roleArn"])
        trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]
        assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}


@pytest.mark.parametrize("bucket", ["datasets", "checkpoints"])
def test_the_engine_lets_a_teams_pods_read_only_its_prefix(stack, bucket):
    arn = stack.one("s3.Bucket", f"-{bucket}").outputs["arn"]
    for team, other in (("vision", "language"), ("language", "vision")):
        policy = IAMPolicy(pod_policy(stack, team))
        assert (
            policy.is_action_permitted("s3:GetObject", f"{arn}/{team_prefix(team)}x")
            == PermissionResult.PERMITTED
        )
        for key in (f"{team_prefix(other)}x", "shared/x"):
            assert policy.is_action_permitted("s3:GetObject", f"{arn}/{key}") != PermissionResult.PERMITTED
        for action in ("s3:PutObject", "s3:DeleteObject"):
            assert (
                policy.is_action_permitted(action, f"{arn}/{team_prefix(team)}x")
                != PermissionResult.PERMITTED
            )


# The calls before enforcement starts: create the bucket, put two objects, create the role, attach its policy,
# assume it (moto counts every request; `set_initial_no_auth_action_count`).
SETUP_CALLS = 6


@set_initial_no_auth_action_count(SETUP_CALLS)
@mock_aws
def test_under_iam_enforcement_a_pod_role_reads_its_prefix_and_is_denied_the_others():
    bucket, region = "trainstack-datasets", "us-east-1"
    s3 = boto3.client("s3", region_name=region)
    s3.create_bucket(Bucket=bucket)
    for team in TEAMS:
        s3.put_object(Bucket=bucket, Key=f"{team_prefix(team)}shard-0.bin", Body=team.encode())
    iam = boto3.client("iam", region_name=region)
    trust = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}],
    }
    role = iam.create_role(RoleName="vision-pods", AssumeRolePolicyDocument=json.dumps(trust))["Role"]
    document = policy_text(
        *pod_read_statements("vision", [bucket], "arn:aws:kms:us-east-1:123456789012:key/k")
    )
    iam.put_role_policy(RoleName="vision-pods", PolicyName="read", PolicyDocument=document)
    credentials = boto3.client("sts", region_name=region).assume_role(
        RoleArn=role["Arn"], RoleSessionName="pod"
    )["Credentials"]
    pod = boto3.client(
        "s3",
        region_name=region,
        aws_access_key_id=credentials["AccessKeyId"],
        aws_secret_access_key=credentials["SecretAccessKey"],
        aws_session_token=credentials["SessionToken"],
    )
    assert (
        pod.get_object(Bucket=bucket, Key=f"{team_prefix('vision')}shard-0.bin")["Body"].read() == b"vision"
    )
    for call in (
        lambda: pod.get_object(Bucket=bucket, Key=f"{team_prefix('language')}shard-0.bin"),
        lambda: pod.put_object(Bucket=bucket, Key=f"{team_prefix('vision')}new.bin", Body=b"x"),
    ):
        with pytest.raises(ClientError) as denied:
            call()
        assert denied.value.response["Error"]["Code"] == "AccessDenied"
