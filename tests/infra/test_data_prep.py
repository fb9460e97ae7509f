"""The CPU data preparation capacity (infra/data_prep.py) of every checked-in stack, under the Pulumi mocks: the
Spot environment scaling from zero in the stack's private subnets, its queue, the least-privilege job role and the
job definition `make data STACK=<env>` submits; and the whole policy pack still passing with it."""

from __future__ import annotations

import base64
import json

import pytest

from infra.data_prep import DATA_INSTANCE_FAMILIES, DATA_JOB_ENVIRONMENT, data_job_memory_mib
from infra.node_bootstrap import ecs_stop_timeout_seconds
from policy.offline import evaluate, mandatory, policy_resources
from tests.conftest import stack_plan
from tests.infra.test_config import error_for


def environment(stack):
    return stack.one("batch.ComputeEnvironment", "-data")


def role_statements(stack) -> dict[str, dict]:
    policy = json.loads(stack.one("iam.RolePolicy", "-data-role").inputs["policy"])
    return {statement["Sid"]: statement for statement in policy["Statement"]}


def test_the_cpu_environment_is_spot_and_scales_from_zero_in_every_private_subnet(stack):
    resources = environment(stack).inputs["computeResources"]
    private = [subnet.id for subnet in stack.all("ec2.Subnet") if "-private-" in subnet.name]

    assert environment(stack).inputs["type"] == "MANAGED"
    assert resources["type"] == "SPOT"
    assert resources["allocationStrategy"] == "SPOT_PRICE_CAPACITY_OPTIMIZED"
    assert "spotIamFleetRole" not in resources  # needed with BEST_FIT only
    assert resources["minVcpus"] == 0
    assert resources["maxVcpus"] == stack.config.data_max_vcpus
    assert resources["instanceTypes"] == DATA_INSTANCE_FAMILIES
    assert sorted(resources["subnets"]) == sorted(private) and len(private) == len(
        stack.config.availability_zones
    )
    assert resources["securityGroupIds"] == [stack.one("ec2.SecurityGroup", "-data").id]
    assert "placementGroup" not in resources  # no EFA: no cluster placement group
    assert resources["instanceRole"] == stack.one("iam.InstanceProfile", "-instance").outputs["arn"]
    assert resources["ec2Configurations"] == [{"imageType": "ECS_AL2023"}]
    assert resources["tags"]["stack"] == stack.stack


def test_its_nodes_use_imdsv2_an_encrypted_root_and_the_agents_stop_timeout(stack):
    template = stack.one("ec2.LaunchTemplate", "-data")
    resources = environment(stack).inputs["computeResources"]

    assert resources["launchTemplate"]["launchTemplateId"] == template.id
    assert template.inputs["metadataOptions"]["httpTokens"] == "required"
    assert template.inputs["metadataOptions"]["httpPutResponseHopLimit"] == 1
    assert "networkInterfaces" not in template.inputs
    ebs = template.inputs["blockDeviceMappings"][0]["ebs"]
    assert (ebs["encrypted"], ebs["kmsKeyId"]) == ("true", stack.key_arn)
    script = base64.b64decode(template.inputs["userData"]).decode()
    assert (
        f"ECS_CONTAINER_STOP_TIMEOUT={ecs_stop_timeout_seconds(stack.config.stop_grace_seconds)}s" in script
    )


def test_its_security_group_has_no_ingress_and_only_https_out(stack):
    group = stack.one("ec2.SecurityGroup", "-data").id
    ingress = [r for r in stack.all("vpc.SecurityGroupIngressRule") if r.inputs["securityGroupId"] == group]
    egress = [
        r.inputs for r in stack.all("vpc.SecurityGroupEgressRule") if r.inputs["securityGroupId"] == group
    ]

    assert ingress == []
    assert [(e["ipProtocol"], e["fromPort"], e["toPort"], e["cidrIpv4"]) for e in egress] == [
        ("tcp", 443, 443, "0.0.0.0/0")
    ]


def test_the_queue_serves_only_the_cpu_environment(stack):
    queue = stack.one("batch.JobQueue", "-data")

    assert queue.inputs["computeEnvironmentOrders"] == [
        {"order": 1, "computeEnvironment": environment(stack).outputs["arn"]}
    ]
    assert stack.plan.outputs["data_job_queue"] == queue.outputs["name"]
    assert (
        stack.plan.outputs["data_job_definition"] == stack.one("batch.JobDefinition", "-data").outputs["arn"]
    )


def test_the_data_job_role_reads_the_sources_writes_the_datasets_and_deletes_nothing(stack):
    datasets = stack.one("s3.Bucket", "-datasets").outputs["arn"]
    statements = role_statements(stack)
    trust = json.loads(stack.one("iam.Role", "-data-role").inputs["assumeRolePolicy"])["Statement"][0]

    assert trust["Principal"] == {"Service": "ecs-tasks.amazonaws.com"}
    assert "aws:SourceAccount" in trust["Condition"]["StringEquals"]
    assert statements["ListSourcesAndDatasets"]["Resource"] == [datasets]
    assert statements["ReadSourcesAndDatasets"] | {"Resource": None} == {
        "Sid": "ReadSourcesAndDatasets",
        "Effect": "Allow",
        "Action": ["s3:GetObject"],
        "Resource": None,
    }
    assert statements["ReadSourcesAndDatasets"]["Resource"] == [f"{datasets}/*"]
    assert statements["WriteDatasets"]["Action"] == ["s3:AbortMultipartUpload", "s3:PutObject"]
    assert statements["WriteDatasets"]["Resource"] == [f"{datasets}/*"]
    assert statements["UseStackKey"]["Resource"] == [stack.key_arn]
    actions = [action for statement in statements.values() for action in statement["Action"]]
    assert not [a for a in actions if a == "*" or a.endswith(":*") or "Delete" in a]
    assert set(statements) == {
        "ListSourcesAndDatasets",
        "ReadSourcesAndDatasets",
        "WriteDatasets",
        "UseStackKey",
    }


def test_named_source_buckets_are_readable_and_nothing_more(variant):
    stack = variant("dev", **{"trainstack:dataSourceBuckets": '["corpus-raw", "web.crawl-2026"]'})
    statements = role_statements(stack)
    datasets = stack.one("s3.Bucket", "-datasets").outputs["arn"]

    assert statements["ListSourcesAndDatasets"]["Resource"] == [
        datasets,
        "arn:aws:s3:::corpus-raw",
        "arn:aws:s3:::web.crawl-2026",
    ]
    assert statements["ReadSourcesAndDatasets"]["Resource"] == [
        f"{datasets}/*",
        "arn:aws:s3:::corpus-raw/*",
        "arn:aws:s3:::web.crawl-2026/*",
    ]
    assert statements["WriteDatasets"]["Resource"] == [f"{datasets}/*"]


def test_the_job_definition_runs_one_cpu_process_with_the_data_role_and_the_stack_logs(stack):
    definition = stack.one("batch.JobDefinition", "-data")
    container = json.loads(definition.inputs["containerProperties"])
    vcpus = stack.config.data_job_vcpus

    assert definition.inputs["type"] == "container"
    assert container["jobRoleArn"] == stack.one("iam.Role", "-data-role").outputs["arn"]
    assert container["executionRoleArn"] == stack.one("iam.Role", "-execution").outputs["arn"]
    assert container["resourceRequirements"] == [
        {"type": "VCPU", "value": str(vcpus)},
        {"type": "MEMORY", "value": str(data_job_memory_mib(vcpus))},
    ]
    assert {e["name"]: e["value"] for e in container["environment"]} == DATA_JOB_ENVIRONMENT
    assert "linuxParameters" not in container  # no EFA devices, no GPU
    logs = container["logConfiguration"]["options"]
    assert (logs["awslogs-group"], logs["awslogs-stream-prefix"]) == (
        # The stack's job log group: Batch's, or on EKS the cluster's application group (Container Insights).
        stack.one(
            "cloudwatch.LogGroup", "-application" if stack.config.orchestrator == "eks" else "-jobs"
        ).inputs["name"],
        "data",
    )
    assert definition.inputs["retryStrategy"]["evaluateOnExits"][0] == {
        "onStatusReason": "Host EC2*",
        "action": "RETRY",
    }


def test_data_spot_false_runs_on_demand(variant):
    stack = variant("prod", **{"trainstack:dataSpot": False})
    resources = environment(stack).inputs["computeResources"]

    assert (resources["type"], resources["allocationStrategy"]) == ("EC2", "BEST_FIT_PROGRESSIVE")
    assert resources["minVcpus"] == 0


@pytest.mark.parametrize(
    "changes",
    [
        {"trainstack:dataSpot": False},
        {"trainstack:dataSourceBuckets": '["corpus-raw"]', "trainstack:dataMaxVcpus": 1024},
    ],
)
def test_the_policy_pack_passes_with_each_data_setting(changes):
    plan = stack_plan("prod", tuple(sorted(changes.items())))

    assert [(v.policy, v.message) for v in mandatory(evaluate(policy_resources(plan), "prod"))] == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["s3://corpus-raw"], "'s3://corpus-raw' is not an S3 bucket name"),
        (["Corpus"], "'Corpus' is not an S3 bucket name"),
        (["a..b"], "'a..b' is not an S3 bucket name"),
    ],
)
def test_a_source_that_is_not_a_bucket_name_is_refused_with_its_key(value, message):
    error = error_for(trainstack__dataSourceBuckets=value)

    assert "trainstack:dataSourceBuckets" in error and message in error
