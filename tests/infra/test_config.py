"""The stack config model: every checked-in stack validates, and each mistake gets one message naming key and fix."""

from __future__ import annotations

import subprocess
import sys

import pytest

from infra.config import (
    MAX_NODE_COUNT,
    ROOT,
    StackConfig,
    StackConfigError,
    load_stack_config,
    parse_stack_config,
    read_stack_file,
    stack_names,
)

STACKS = stack_names()

VALID = {
    "aws:region": "us-east-1",
    "trainstack:owner": "ml-platform",
    "trainstack:availabilityZones": ["us-east-1a", "us-east-1b"],
}


def error_for(**changes) -> str:
    """The StackConfigError message for VALID with `changes` (key with ':' -> '__'; None removes a key)."""
    values = dict(VALID)
    for key, value in changes.items():
        key = key.replace("__", ":")
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value
    with pytest.raises(StackConfigError) as raised:
        parse_stack_config("test", values)
    return str(raised.value)


def test_checked_in_stacks_are_the_three_environments_and_the_eks_one():
    assert STACKS == ["dev", "eks-dev", "prod", "staging"]


@pytest.mark.parametrize("name", STACKS)
def test_every_stack_file_validates(name):
    config = load_stack_config(name)
    assert config.stack == name and config.owner
    assert config.region in ("us-east-1", "us-west-2")
    assert config.cluster_availability_zone == config.availability_zones[0]


def test_prod_runs_four_or_more_p5_class_nodes_on_persistent_fsx_with_a_nat_per_zone():
    prod = load_stack_config("prod")
    assert prod.node_count >= 4 and prod.instance.gpus == 8 and prod.instance.efa_interfaces >= 16
    assert prod.fsx_deployment_type == "PERSISTENT_2" and prod.protect_data
    assert prod.nat_gateways == len(prod.availability_zones) > 1


def test_dev_is_one_node_scratch_one_nat_short_retention():
    dev = load_stack_config("dev")
    assert (dev.node_count, dev.fsx_deployment_type, dev.nat_gateways) == (1, "SCRATCH_2", 1)
    assert dev.log_retention_days <= 14 and not dev.protect_data


def test_staging_runs_two_p5_nodes():
    staging = load_stack_config("staging")
    assert (staging.node_count, staging.instance_type) == (2, "p5.48xlarge")


def test_defaults_fill_in_a_minimal_stack():
    config = parse_stack_config("test", VALID)
    assert (config.instance_type, config.node_count, config.fsx_deployment_type) == (
        "p5.48xlarge",
        1,
        "SCRATCH_2",
    )
    assert config.subnet_cidrs == (["10.0.0.0/20", "10.0.16.0/20"], ["10.0.240.0/24", "10.0.241.0/24"])
    assert config.creates_placement_group and not config.fsx_uses_stack_key
    assert (config.stop_grace_seconds, config.job_timeout_seconds) == (120, 72 * 3600)
    assert config.tags == {"project": "trainstack", "stack": "test", "owner": "ml-platform"}


def test_cli_strings_parse_like_yaml_values():
    """The Pulumi CLI hands every value to the program as a string, lists as JSON."""
    from_cli = {
        "aws:region": "us-east-1",
        "trainstack:owner": "ml-platform",
        "trainstack:availabilityZones": '["us-east-1a", "us-east-1b"]',
        "trainstack:nodeCount": "4",
        "trainstack:spot": "true",
    }
    config = parse_stack_config("test", from_cli)
    assert (config.availability_zones, config.node_count, config.spot) == (
        ["us-east-1a", "us-east-1b"],
        4,
        True,
    )


# --- each mistake, its message ----------------------------------------------------------------------------------


def test_unknown_instance_type_lists_the_efa_types():
    message = error_for(trainstack__instanceType="p9.huge")
    assert "trainstack:instanceType = 'p9.huge': unknown instance type; valid: p4d.24xlarge" in message
    assert "p5.48xlarge" in message and "g5.xlarge" not in message


def test_instance_type_without_efa_is_refused():
    assert "trainstack:instanceType = 'g5.xlarge': has no EFA" in error_for(
        trainstack__instanceType="g5.xlarge"
    )


@pytest.mark.parametrize("count", [0, -1, MAX_NODE_COUNT + 1])
def test_node_count_outside_one_to_the_quota_is_refused(count):
    message = error_for(trainstack__nodeCount=count)
    assert f"trainstack:nodeCount = {count}: must be between 1 and {MAX_NODE_COUNT}" in message
    assert "docs/infra.md#quotas" in message


def test_node_count_at_the_quota_is_accepted():
    assert (
        parse_stack_config("test", {**VALID, "trainstack:nodeCount": MAX_NODE_COUNT}).node_count
        == MAX_NODE_COUNT
    )


@pytest.mark.parametrize(
    ("cidr", "why"),
    [
        ("10.0.0.1/16", "has host bits set"),
        ("10.0.0.0/33", "not a valid IPv4 CIDR block"),
        ("ten.0.0.0/16", "not a valid IPv4 CIDR block"),
        ("8.8.0.0/16", "not a private (RFC 1918) range"),
        ("10.0.0.0/24", "prefix between /16 and /20"),
    ],
)
def test_invalid_vpc_cidr_is_refused(cidr, why):
    message = error_for(trainstack__vpcCidr=cidr)
    assert f"trainstack:vpcCidr = '{cidr}'" in message and why in message


def test_overlapping_subnets_name_both():
    message = error_for(
        trainstack__privateSubnetCidrs=["10.0.0.0/20", "10.0.16.0/20"],
        trainstack__publicSubnetCidrs=["10.0.240.0/24", "10.0.8.0/24"],
    )
    assert (
        "trainstack:publicSubnetCidrs[1] = '10.0.8.0/24': overlaps trainstack:privateSubnetCidrs[0] = 10.0.0.0/20"
        in message
    )


def test_subnet_outside_the_vpc_is_refused():
    message = error_for(trainstack__privateSubnetCidrs=["10.0.0.0/20", "10.1.0.0/20"])
    assert (
        "trainstack:privateSubnetCidrs[1] = '10.1.0.0/20': outside trainstack:vpcCidr 10.0.0.0/16" in message
    )


def test_one_subnet_cidr_per_zone_is_required():
    message = error_for(trainstack__privateSubnetCidrs=["10.0.0.0/20"])
    assert (
        "trainstack:privateSubnetCidrs = ['10.0.0.0/20']: give one CIDR per availability zone (2)" in message
    )


def test_missing_availability_zones_say_what_to_write():
    message = error_for(trainstack__availabilityZones=None)
    assert "trainstack:availabilityZones: required" in message and "the first hosts the GPU nodes" in message


def test_empty_availability_zones_are_refused():
    assert "give at least one availability zone" in error_for(trainstack__availabilityZones=[])


def test_availability_zone_of_another_region_is_refused():
    message = error_for(trainstack__availabilityZones=["us-east-1a", "us-west-2a"])
    assert (
        "trainstack:availabilityZones = 'us-west-2a': not a zone of region us-east-1 (aws:region)" in message
    )


def test_missing_region_is_reported():
    assert "aws:region: required" in error_for(aws__region=None)


@pytest.mark.parametrize("gib", [1000, 1800, 3600, 0])
def test_fsx_storage_not_1200_or_a_multiple_of_2400_is_refused(gib):
    message = error_for(trainstack__fsxStorageCapacityGib=gib)
    assert (
        f"trainstack:fsxStorageCapacityGib = {gib}: FSx for Lustre SSD takes 1200 GiB or a multiple of 2400"
        in message
    )


@pytest.mark.parametrize("gib", [1200, 2400, 4800, 9600])
def test_fsx_storage_steps_are_accepted(gib):
    assert (
        parse_stack_config("t", {**VALID, "trainstack:fsxStorageCapacityGib": gib}).fsx_storage_capacity_gib
        == gib
    )


def test_fsx_throughput_outside_the_persistent_2_tiers_is_refused():
    message = error_for(trainstack__fsxDeploymentType="PERSISTENT_2", trainstack__fsxThroughputPerTib=200)
    assert (
        "trainstack:fsxThroughputPerTib = 200: PERSISTENT_2 offers 125, 250, 500, 1000 MB/s per TiB"
        in message
    )


def test_fsx_throughput_on_scratch_is_refused():
    assert "only PERSISTENT_2 takes a throughput tier" in error_for(trainstack__fsxThroughputPerTib=250)


def test_kms_on_a_scratch_file_system_is_refused():
    message = error_for(trainstack__fsxKmsEncryption=True)
    assert (
        "trainstack:fsxKmsEncryption = True: SCRATCH_2 file systems are always encrypted with an FSx-managed key"
        in message
    )


def test_unknown_fsx_deployment_type_lists_the_valid_ones():
    message = error_for(trainstack__fsxDeploymentType="PERSISTENT_1")
    assert (
        "trainstack:fsxDeploymentType = 'PERSISTENT_1'" in message
        and "'SCRATCH_2' or 'PERSISTENT_2'" in message
    )


def test_capacity_reservation_with_a_placement_group_is_refused():
    message = error_for(
        trainstack__capacityReservationId="cr-0123456789abcdef0", trainstack__placementGroup=True
    )
    assert "trainstack:placementGroup = True: a capacity reservation" in message
    assert "trainstack:capacityReservationId = 'cr-0123456789abcdef0'" in message


def test_capacity_block_needs_its_reservation_id():
    assert "trainstack:capacityBlock = True: needs trainstack:capacityReservationId" in error_for(
        trainstack__capacityBlock=True
    )


def test_malformed_capacity_reservation_id_is_refused():
    assert "not a capacity reservation id like cr-" in error_for(
        trainstack__capacityReservationId="reservation-1"
    )


@pytest.mark.parametrize("days", [2, 10, 0, 4000])
def test_log_retention_not_allowed_by_cloudwatch_is_refused(days):
    message = error_for(trainstack__logRetentionDays=days)
    assert f"trainstack:logRetentionDays = {days}: CloudWatch Logs allows only 1, 3, 5, 7, 14, 30" in message


def test_unknown_key_suggests_the_nearest_valid_key():
    assert "trainstack:nodeCont: unknown key; did you mean trainstack:nodeCount?" in error_for(
        trainstack__nodeCont=2
    )


def test_misspelled_namespace_suggests_the_right_key():
    assert "trainstak:instanceType: unknown key; did you mean trainstack:instanceType?" in error_for(
        trainstak__instanceType="p5.48xlarge"
    )


def test_unrelated_unknown_key_lists_the_valid_keys():
    message = error_for(trainstack__colour="blue")
    assert "trainstack:colour: unknown key; valid keys: aws:profile, aws:region" in message


def test_unknown_interface_endpoint_lists_the_valid_ones():
    message = error_for(trainstack__interfaceEndpoints=["ecr.api", "s3"])
    assert "unknown endpoint 's3'; valid: ecr.api, ecr.dkr, sts, logs, ssm" in message


def test_more_nat_gateways_than_zones_is_refused():
    assert (
        "trainstack:natGateways = 3: must be between 1 and the number of availability zones (2)"
        in error_for(trainstack__natGateways=3)
    )


def test_non_commercial_region_is_refused():
    assert "aws:region = 'cn-north-1': not a commercial AWS region" in error_for(aws__region="cn-north-1")


def test_every_problem_is_reported_at_once():
    message = error_for(trainstack__nodeCount=0, trainstack__logRetentionDays=2, trainstack__nodeCont=1)
    assert message.startswith("stack config: 3 problem(s)")


def test_missing_stack_file_lists_the_stacks(tmp_path):
    (tmp_path / "Pulumi.dev.yaml").write_text("config: {}\n")
    with pytest.raises(StackConfigError, match=r"no stack file Pulumi.qa.yaml in .*; stacks: dev"):
        read_stack_file("qa", tmp_path)


def test_stack_file_errors_name_the_file(tmp_path):
    (tmp_path / "Pulumi.qa.yaml").write_text("config:\n  aws:region: us-east-1\n  trainstack:owner: me\n")
    with pytest.raises(
        StackConfigError, match=r"^Pulumi.qa.yaml: 1 problem\(s\)\n  trainstack:availabilityZones"
    ):
        load_stack_config("qa", tmp_path)


def test_config_and_outputs_import_without_pulumi():
    """`python -m trainer plan` and the submit tool read stacks with only the training requirements installed."""
    code = (
        "import sys, infra.config, trainer.contract.outputs; "
        "infra.config.load_stack_config('prod'); "
        "assert not [m for m in sys.modules if m.startswith('pulumi')], 'pulumi imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_every_config_key_is_documented():
    documented = (ROOT / "docs" / "infra.md").read_text()
    keys = [f.alias for f in StackConfig.model_fields.values() if f.alias != "pulumi:stack"]
    assert [key for key in keys if f"| `{key}` |" not in documented] == []


def test_cross_key_problems_are_counted_one_each():
    message = error_for(trainstack__natGateways=3, trainstack__fsxThroughputPerTib=250)
    assert message.startswith("stack config: 2 problem(s)")


# --- orchestrator ----------------------------------------------------------------------------------------------


def test_orchestrator_defaults_to_batch_and_takes_eks():
    assert parse_stack_config("test", VALID).orchestrator == "batch"
    assert parse_stack_config("test", {**VALID, "trainstack:orchestrator": "eks"}).orchestrator == "eks"


def test_an_unknown_orchestrator_names_the_valid_ones():
    message = error_for(trainstack__orchestrator="kubernetes")
    assert "trainstack:orchestrator" in message and "'batch'" in message and "'eks'" in message


def test_eks_needs_two_zones():
    message = error_for(trainstack__orchestrator="eks", trainstack__availabilityZones=["us-east-1a"])
    assert (
        "trainstack:availabilityZones = ['us-east-1a']: an EKS cluster needs subnets in at least two zones"
        in (message)
    )


def test_batch_only_keys_are_refused_on_eks():
    message = error_for(trainstack__orchestrator="eks", trainstack__spot=True)
    assert "trainstack:spot = True: the single-node Spot queue is an AWS Batch queue" in message


def test_eks_keys_are_refused_on_batch():
    message = error_for(trainstack__eksAdminArns=["arn:aws:iam::123456789012:role/admin"])
    assert (
        "trainstack:eksAdminArns = ['arn:aws:iam::123456789012:role/admin']: only EKS stacks take it"
        in message
    )


def test_eks_admins_are_iam_role_or_user_arns():
    message = error_for(trainstack__orchestrator="eks", trainstack__eksAdminArns=["admin"])
    assert "trainstack:eksAdminArns = 'admin': not an IAM role or user ARN" in message


def test_a_public_endpoint_open_to_the_internet_is_refused():
    message = error_for(trainstack__orchestrator="eks", trainstack__eksPublicAccessCidrs=["0.0.0.0/0"])
    assert "trainstack:eksPublicAccessCidrs = '0.0.0.0/0': opens the API endpoint to the internet" in message
    assert "not an IPv4 CIDR block" in error_for(
        trainstack__orchestrator="eks", trainstack__eksPublicAccessCidrs=["10.0.0.1/8"]
    )
