"""Bad input catalogue, stack config (docs/bad-inputs.md): each mistake in a `Pulumi.<env>.yaml`, run through
`make preview-offline`'s entry point and the Pulumi program under mocks, gives one message naming the key, the bad
value and what is valid; exit 2; no resource is registered and no stack file changes."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pulumi
import pytest

from infra import preview
from infra.config import ROOT, read_stack_file
from infra.mocks import StackMocks


@dataclass(frozen=True)
class Row:
    stack: str  # the checked-in stack the bad file starts from
    changes: dict[str, Any]  # key -> value (None: the key is removed)
    says: tuple[str, ...]  # fragments of the one message
    exit_status: int = 2


ROWS = {
    "stack-unknown-instance-type": Row(
        "prod",
        {"trainstack:instanceType": "p9.huge"},
        ("trainstack:instanceType = 'p9.huge': unknown instance type; valid: p4d.24xlarge",),
    ),
    "stack-instance-without-efa": Row(
        "prod",
        {"trainstack:instanceType": "g5.xlarge"},
        ("trainstack:instanceType = 'g5.xlarge': has no EFA", "valid: p4d.24xlarge"),
    ),
    "stack-node-count-zero": Row(
        "prod",
        {"trainstack:nodeCount": 0},
        ("trainstack:nodeCount = 0: must be between 1 and 32", "docs/infra.md#quotas"),
    ),
    "stack-node-count-above-quota": Row(
        "prod", {"trainstack:nodeCount": 33}, ("trainstack:nodeCount = 33: must be between 1 and 32",)
    ),
    "stack-node-count-not-a-number": Row(
        "prod",
        {"trainstack:nodeCount": "four"},
        ("trainstack:nodeCount = 'four': Input should be a valid integer",),
    ),
    "stack-vpc-cidr-invalid": Row(
        "prod",
        {"trainstack:vpcCidr": "10.30.0.0/33"},
        ("trainstack:vpcCidr = '10.30.0.0/33': not a valid IPv4 CIDR block", "write it like 10.0.0.0/16"),
    ),
    "stack-vpc-cidr-public": Row(
        "dev",
        {"trainstack:vpcCidr": "8.8.0.0/16"},
        ("trainstack:vpcCidr = '8.8.0.0/16': not a private (RFC 1918)",),
    ),
    "stack-subnet-cidrs-overlap": Row(
        "prod",
        {"trainstack:publicSubnetCidrs": ["10.30.250.0/24", "10.30.40.0/24"]},
        (
            "trainstack:publicSubnetCidrs[1] = '10.30.40.0/24': overlaps "
            "trainstack:privateSubnetCidrs[1] = 10.30.32.0/19",
        ),
    ),
    "stack-subnet-outside-vpc": Row(
        "prod",
        {"trainstack:privateSubnetCidrs": ["10.30.0.0/19", "10.31.0.0/19"]},
        ("trainstack:privateSubnetCidrs[1] = '10.31.0.0/19': outside trainstack:vpcCidr 10.30.0.0/16",),
    ),
    "stack-availability-zones-missing": Row(
        "prod",
        {"trainstack:availabilityZones": None},
        ("trainstack:availabilityZones: required", "the first hosts the GPU nodes and FSx"),
    ),
    "stack-availability-zone-not-in-region": Row(
        "prod",
        {"trainstack:availabilityZones": ["us-west-2b", "us-east-1a"]},
        ("trainstack:availabilityZones = 'us-east-1a': not a zone of region us-west-2 (aws:region)",),
    ),
    "stack-fsx-storage-size": Row(
        "prod",
        {"trainstack:fsxStorageCapacityGib": 3600},
        ("trainstack:fsxStorageCapacityGib = 3600: FSx for Lustre SSD takes 1200 GiB or a multiple of 2400",),
    ),
    "stack-fsx-persistent-2-throughput": Row(
        "prod",
        {"trainstack:fsxThroughputPerTib": 200},
        ("trainstack:fsxThroughputPerTib = 200: PERSISTENT_2 offers 125, 250, 500, 1000 MB/s per TiB",),
    ),
    "stack-fsx-kms-on-scratch": Row(
        "dev",
        {"trainstack:fsxKmsEncryption": True},
        (
            "trainstack:fsxKmsEncryption = True: SCRATCH_2 file systems are always encrypted",
            "use PERSISTENT_2",
        ),
    ),
    "stack-capacity-reservation-with-placement-group": Row(
        "prod",
        {
            "trainstack:capacityReservationId": "cr-0123456789abcdef0",
            "trainstack:reservationPlacementGroup": "odcr-cluster",
            "trainstack:placementGroup": True,
        },
        (
            "trainstack:placementGroup = True: a capacity reservation "
            "(trainstack:capacityReservationId = 'cr-0123456789abcdef0') already fixes placement",
        ),
    ),
    "stack-capacity-reservation-without-its-placement-group": Row(
        "prod",
        {"trainstack:capacityReservationId": "cr-0123456789abcdef0"},
        (
            "trainstack:capacityReservationId = 'cr-0123456789abcdef0': an On-Demand Capacity Reservation for EFA "
            "nodes must be made in a cluster placement group; name it in trainstack:reservationPlacementGroup",
        ),
    ),
    "stack-placement-group-off": Row(
        "dev",
        {"trainstack:placementGroup": False},
        ("trainstack:placementGroup = False: EFA nodes of a multi-node job need a cluster placement group",),
    ),
    "stack-log-retention-days": Row(
        "dev",
        {"trainstack:logRetentionDays": 10},
        ("trainstack:logRetentionDays = 10: CloudWatch Logs allows only 1, 3, 5, 7, 14, 30",),
    ),
    "stack-alarm-email-invalid": Row(
        "prod",
        {"trainstack:alarmEmails": ["oncall"]},
        ("trainstack:alarmEmails = ['oncall']: 'oncall' is not an email address", "oncall@example.com"),
    ),
    "stack-min-mfu-above-one": Row(
        "prod", {"trainstack:minMfu": 1.5}, ("trainstack:minMfu = 1.5: Input should be less than 1",)
    ),
    "stack-serving-min-instances-zero": Row(
        "prod",
        {"trainstack:serving": {"instanceType": "ml.g5.2xlarge", "minInstances": 0, "maxInstances": 2}},
        ("trainstack:serving[minInstances] = 0: an endpoint of production variants keeps one instance",),
    ),
    "stack-serving-max-below-min": Row(
        "prod",
        {"trainstack:serving": {"instanceType": "ml.g5.2xlarge", "minInstances": 2, "maxInstances": 1}},
        ("maxInstances = 1 is below minInstances = 2; raise it",),
    ),
    "stack-serving-canary-over-half-the-fleet": Row(
        "prod",
        {"trainstack:serving": {"instanceType": "ml.g5.2xlarge", "minInstances": 1, "canaryPercent": 10}},
        (
            "canaryPercent = 10: a 10 % canary of 1 instance(s) is 1 instance(s), over the 50 % of the fleet "
            "SageMaker allows (CanarySize)",
        ),
    ),
    "stack-serving-region-without-lmi-image": Row(
        "prod",
        {
            "aws:region": "ap-southeast-5",
            "trainstack:availabilityZones": ["ap-southeast-5b", "ap-southeast-5c"],
            "trainstack:allowedRegions": ["ap-southeast-5"],
            "trainstack:serving": {"instanceType": "ml.g5.2xlarge"},
        },
        ("trainstack:serving: no source names the account that hosts the LMI image in ap-southeast-5",),
    ),
    "stack-serving-unknown-instance-type": Row(
        "prod",
        {"trainstack:serving": {"instanceType": "ml.g9.huge"}},
        (
            "trainstack:serving[instanceType] = 'ml.g9.huge': unknown serving instance type; valid: "
            "ml.g5.2xlarge",
        ),
    ),
    "stack-team-name-invalid": Row(
        "prod",
        {
            "trainstack:teams": [
                {"name": "Vision", "gpuQuota": 8, "members": ["arn:aws:iam::123456789012:root"]}
            ]
        },
        ("trainstack:teams[0][name] = 'Vision': a team name is 2-32 characters of a-z and 0-9",),
    ),
    "stack-team-name-hyphenated": Row(
        "prod",
        {
            "trainstack:teams": [
                {"name": "vision-x", "gpuQuota": 8, "members": ["arn:aws:iam::123456789012:root"]}
            ]
        },
        ("trainstack:teams[0][name] = 'vision-x'", "a Batch share identifier: alphanumeric only"),
    ),
    "stack-team-weight-below-batch-minimum": Row(
        "prod",
        {
            "trainstack:teams": [
                {
                    "name": "vision",
                    "gpuQuota": 8,
                    "weightFactor": 0.00005,
                    "members": ["arn:aws:iam::123456789012:root"],
                }
            ]
        },
        ("trainstack:teams[0][weightFactor] = 5e-05: Input should be greater than or equal to 0.0001",),
    ),
    "stack-team-without-members-or-group": Row(
        "prod",
        {"trainstack:teams": [{"name": "vision", "gpuQuota": 8}]},
        (
            "trainstack:teams: team 'vision' has neither members nor identityCenterGroup",
            "list IAM principal ARNs in members, or give identityCenterGroup {instanceArn, groupId}, or both",
        ),
    ),
    "stack-team-identity-center-group-invalid": Row(
        "prod",
        {
            "trainstack:teams": [
                {
                    "name": "vision",
                    "gpuQuota": 8,
                    "identityCenterGroup": {
                        "instanceArn": "arn:aws:sso:::instance/ssoins-1234567890abcdef",
                        "groupId": "vision-engineers",
                    },
                }
            ]
        },
        (
            "trainstack:teams[0][identityCenterGroup][groupId] = 'vision-engineers': not an identity store group "
            "id; write its GUID, such as f81d4fae-7dec-11d0-a765-00a0c91e6bf6",
        ),
    ),
    "stack-allowed-regions-without-own": Row(
        "prod",
        {"trainstack:allowedRegions": ["eu-west-1"]},
        ("trainstack:allowedRegions = ['eu-west-1']: must include the stack's own region us-west-2",),
    ),
    "stack-organization-trail-invalid": Row(
        "dev",
        {"trainstack:organizationTrail": "org-trail"},
        ("trainstack:organizationTrail = 'org-trail': not a trail ARN like arn:aws:cloudtrail:",),
    ),
    "stack-audit-compliance-unprotected": Row(
        "dev",
        {"trainstack:auditLockMode": "COMPLIANCE"},
        ("trainstack:auditLockMode = 'COMPLIANCE' on a stack without trainstack:protectData",),
    ),
    "stack-unknown-key": Row(
        "dev",
        {"trainstack:nodeCont": 2},
        ("trainstack:nodeCont: unknown key; did you mean trainstack:nodeCount?",),
    ),
    "stack-eks-one-zone": Row(
        "eks-dev",
        {"trainstack:availabilityZones": ["us-east-1a"]},
        (
            "trainstack:availabilityZones = ['us-east-1a']: an EKS cluster needs subnets in at least two zones",
        ),
    ),
    "stack-eks-endpoint-open-to-internet": Row(
        "eks-dev",
        {"trainstack:eksPublicAccessCidrs": ["0.0.0.0/0"]},
        ("trainstack:eksPublicAccessCidrs = '0.0.0.0/0': opens the API endpoint to the internet",),
    ),
}


@pytest.fixture(scope="module", autouse=True)
def stack_files_are_untouched():
    def digest() -> dict[str, str]:
        return {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(ROOT.glob("Pulumi.*.yaml"))
        }

    before = digest()
    yield
    assert digest() == before


@pytest.mark.parametrize("row_id", ROWS)
def test_bad_stack_config_gives_one_message_and_registers_nothing(row_id, monkeypatch, capsys):
    row = ROWS[row_id]
    values = {**read_stack_file(row.stack), **row.changes}
    values = {key: value for key, value in values.items() if value is not None}
    registered = []
    monkeypatch.setattr(
        StackMocks, "new_resource", lambda self, args: registered.append(args.name) or ("", {})
    )
    # `make preview-offline STACK=<env>` with the bad stack file: its reader hands the program these values.
    monkeypatch.setattr(preview, "read_stack_file", lambda stack: values)

    assert preview.main(["--stack", row.stack]) == row.exit_status
    err = capsys.readouterr().err
    assert err.startswith(f"error: stack {row.stack}: 1 problem(s)\n"), err
    assert all(fragment in err for fragment in row.says), err
    assert "Traceback" not in err
    assert registered == []


@pytest.mark.parametrize("row_id", ["stack-instance-without-efa"])
def test_the_pulumi_cli_gets_a_run_error_so_it_prints_the_message_without_a_traceback(row_id):
    row = ROWS[row_id]
    with pytest.raises(pulumi.RunError, match=row.says[0]):
        preview.run_program(row.stack, {**read_stack_file(row.stack), **row.changes})
