"""The stack configuration: one typed model, read once from `Pulumi.<stack>.yaml`, validated before any resource.

Keys are written as in the stack file (`trainstack:instanceType`, `aws:region`). `parse_stack_config` is a pure
function over that mapping, so `python -m trainer plan` and the job-submission tool read a stack's config through
the same model as the Pulumi program (`load_stack_config("prod")`), without Pulumi running. Every problem is
reported in one `StackConfigError` that names the key, the bad value and what would be valid.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from trainer.contract.catalog import EFA_INSTANCE_TYPES, INSTANCE_TYPES, InstanceType

# The SIGTERM grace the launcher gives the ranks by default (the container contract, image/container.env).
from trainer.contract.container import STOP_GRACE_SECONDS as DEFAULT_STOP_GRACE_SECONDS
from trainer.contract.serving import (
    DEFAULT_MAX_INSTANCES,
    DEFAULT_MIN_INSTANCES,
    DEFAULT_SERVING_INSTANCE,
    LMI_ACCOUNTS,
    SERVING_INSTANCES,
    canary_problem,
    lmi_problem,
)
from trainer.contract.stack import (
    DEFAULT_FSX_DEPLOYMENT_TYPE,
    DEFAULT_FSX_PERSISTENT_2_MB_S_PER_TIB,
    DEFAULT_INSTANCE_TYPE,
    DEFAULT_JOB_TIMEOUT_HOURS,
    DEFAULT_NODE_COUNT,
    FSX_FIRST_STEP_GIB,
    FSX_PERSISTENT_2_THROUGHPUTS,
    FSX_STEP_GIB,
    NAMESPACE,
    ROOT,
    StackFileError,
    stack_names,  # noqa: F401  (infra's tools and tests list the stacks through infra.config)
)
from trainer.contract.stack import read_stack_file as _read_stack_file

# The project's ceiling on nodes per stack: 32 x 8 = 256 GPUs in one cluster placement group. Past it, ask EC2 for
# the capacity (a Capacity Block or an ODCR) and raise the account's "Running On-Demand P instances" vCPU quota
# (L-417A185B; 32 p5.48xlarge = 6,144 vCPUs) first, then this number. Documented in docs/infra.md#quotas.
MAX_NODE_COUNT = 32

# CloudWatch Logs accepts only these retention periods (PutRetentionPolicy).
# fmt: off
LOG_RETENTION_DAYS = (
    1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653,
)
# fmt: on

# VPC interface endpoints a stack may ask for (S3 always gets a free gateway endpoint).
INTERFACE_ENDPOINTS = ("ecr.api", "ecr.dkr", "sts", "logs", "ssm", "ssmmessages")

# A one-minute alarm looks back at most a day (CloudWatch PutMetricAlarm: EvaluationPeriods x Period <= 86,400 s).
MAX_ALARM_MINUTES = 1440
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")

# Commercial-partition regions: the launch template and key policy build `arn:aws:` ARNs.
_REGION = re.compile(r"^(us|eu|ap|ca|sa|me|af|il|mx)-[a-z]+-\d$")
_CAPACITY_RESERVATION = re.compile(r"^cr-[0-9a-f]{8,17}$")
# EC2 CreatePlacementGroup: a name of up to 255 ASCII characters.
_PLACEMENT_GROUP_NAME = re.compile(r"^[\x21-\x7e]{1,255}$")


class StackConfigError(ValueError):
    """Stack config that would not deploy; the message lists every offending key, its value and what is valid."""


def _key(field: str) -> str:
    return f"{NAMESPACE}:{to_camel(field)}"


def _problem(why: str) -> PydanticCustomError:
    return PydanticCustomError("stack_config", "{why}", {"why": why})


# An IAM principal that may assume a team's role: a user or role of some account (IAM User Guide, "IAM identifiers").
_PRINCIPAL_ARN = re.compile(r"^arn:aws:iam::\d{12}:(root|(user|role)/[\w+=,.@/-]+)$")
# CloudTrail trail ARNs: arn:aws:cloudtrail:<region>:<account>:trail/<name> (CloudTrail API reference, Trail).
_TRAIL_ARN = re.compile(r"^arn:aws:cloudtrail:[a-z0-9-]+:\d{12}:trail/[\w.-]{3,128}$")
# A team name becomes a tag value, an S3 prefix, a Kubernetes namespace and a Batch share identifier; the strictest
# rules it: a share identifier "is limited to 255 alphanumeric characters" (botocore 1.44.8 batch model,
# ShareAttributes.shareIdentifier and SubmitJob's shareIdentifier), so no '-' (issue 46 item 13).
_TEAM_NAME = re.compile(r"^[a-z][a-z0-9]{1,31}$")
# SSO Admin API shapes InstanceArn and PrincipalId (botocore 1.44.8 data/sso-admin/2020-07-20/service-2.json.gz),
# the instance in the commercial partition only, as every other ARN of a stack.
_IDENTITY_CENTER_INSTANCE_ARN = re.compile(r"^arn:aws:sso:::instance/(sso)?ins-[a-zA-Z0-9-.]{16}$")
_IDENTITY_STORE_GROUP_ID = re.compile(
    r"^([0-9a-f]{10}-|)[A-Fa-f0-9]{8}-[A-Fa-f0-9]{4}-[A-Fa-f0-9]{4}-[A-Fa-f0-9]{4}-[A-Fa-f0-9]{12}$"
)
# S3 user guide, "General purpose bucket naming rules": 3-63 lowercase letters, digits, dots and hyphens, beginning
# and ending with a letter or digit, no two adjacent dots.
_BUCKET_NAME = re.compile(r"^(?!.*\.\.)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# SSO Admin API shape PermissionSetName: 1-32 characters (same service model).
MAX_PERMISSION_SET_NAME = 32


def permission_set_name(stack: str, team: str) -> str:
    """The team's permission set in the Identity Center instance, which every stack of the organisation shares."""
    return f"{stack}-{team}"


class IdentityCenterGroup(BaseModel):
    """An IAM Identity Center group whose users may assume a team's role: docs/security.md#teams."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel)

    instance_arn: str = Field(description="the Identity Center instance ARN (sso-admin list-instances)")
    group_id: str = Field(description="the group's id in the instance's identity store")

    @field_validator("instance_arn")
    @classmethod
    def _instance(cls, arn: str) -> str:
        if not _IDENTITY_CENTER_INSTANCE_ARN.match(arn):
            raise _problem(
                "not an IAM Identity Center instance ARN; write arn:aws:sso:::instance/ssoins-0123456789abcdef "
                "(aws sso-admin list-instances prints it)"
            )
        return arn

    @field_validator("group_id")
    @classmethod
    def _group(cls, group_id: str) -> str:
        if not _IDENTITY_STORE_GROUP_ID.match(group_id):
            raise _problem(
                "not an identity store group id; write its GUID, such as f81d4fae-7dec-11d0-a765-00a0c91e6bf6 "
                "(aws identitystore list-groups prints GroupId)"
            )
        return group_id


class TeamConfig(BaseModel):
    """One tenant of a shared stack (`trainstack:teams` entries): docs/security.md#teams."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel)

    name: str = Field(
        description="lower-case name: the role's team tag, the S3 prefix teams/<name>/, the share"
    )
    gpu_quota: int = Field(ge=1, description="GPUs the team's jobs may hold at once (checked at submit)")
    # Batch ShareAttributes.weightFactor: a lower factor gets a larger share of the queue; "The smallest supported
    # value is 0.0001, and the largest supported value is 999.9999" (botocore 1.44.8 batch model, ShareAttributes).
    weight_factor: float = Field(default=1.0, ge=0.0001, le=999.9999)
    # A team needs members, an identity-centre group, or both (StackConfig._governance_problems).
    members: list[str] = Field(
        default_factory=list, min_length=1, description="IAM principal ARNs allowed to assume the team's role"
    )
    identity_center_group: IdentityCenterGroup | None = None

    @field_validator("name")
    @classmethod
    def _team_name(cls, name: str) -> str:
        if not _TEAM_NAME.match(name):
            raise _problem(
                "a team name is 2-32 characters of a-z and 0-9, starting with a letter"
                " (it is a Batch share identifier: alphanumeric only)"
            )
        return name

    @field_validator("members")
    @classmethod
    def _principals(cls, members: list[str]) -> list[str]:
        bad = [m for m in members if not _PRINCIPAL_ARN.match(m)]
        if bad:
            raise _problem(
                f"{bad[0]!r} is not an IAM principal ARN; write arn:aws:iam::123456789012:role/name or :user/name"
            )
        return members


# Application Auto Scaling's ceiling for an endpoint variant's instances is the account's quota per instance type
# (SageMaker "Endpoint quotas"); the project keeps a pool small and asks for more first, as for training nodes.
MAX_SERVING_INSTANCES = 8


class ServingConfig(BaseModel):
    """The inference pool (`trainstack:serving`): a SageMaker real-time endpoint, docs/serving-stack.md."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel)

    instance_type: str = Field(default=DEFAULT_SERVING_INSTANCE, description="a SageMaker ML instance type")
    # An endpoint of production variants keeps at least one instance: scaling to zero needs inference components
    # (SageMaker Developer Guide, "Scale an endpoint to zero instances"), whose updates roll (botocore sagemaker
    # InferenceComponentDeploymentConfig: RollingUpdatePolicy only) without an endpoint's blue/green canary;
    # docs/serving-stack.md says what scaling to zero would cost in cold start.
    min_instances: int = Field(
        default=DEFAULT_MIN_INSTANCES, description="instances at the least (1 or more)"
    )
    max_instances: int = Field(default=DEFAULT_MAX_INSTANCES, ge=1, le=MAX_SERVING_INSTANCES)
    # Target tracking on SageMakerVariantInvocationsPerInstance: invocations per instance per minute.
    invocations_per_instance: int = Field(default=60, ge=1)
    # Rollback alarms (trainer/deploy/ rolls back when any fires during the canary's baking time).
    error_rate_alarm_percent: float = Field(default=1.0, gt=0, le=100)
    latency_p99_alarm_ms: int = Field(default=10_000, ge=1)
    # 0: no canary (all traffic at once, still baked and rolled back on the alarms); else a share of the green fleet,
    # which must hold at most half of it (trainer/contract/serving.py canary_problem).
    canary_percent: int = Field(default=0, ge=0, le=50)
    bake_minutes: int = Field(default=10, ge=1, le=60)

    @field_validator("instance_type")
    @classmethod
    def _known_instance(cls, name: str) -> str:
        if name not in SERVING_INSTANCES:
            raise _problem(f"unknown serving instance type; valid: {', '.join(SERVING_INSTANCES)}")
        return name

    @field_validator("min_instances")
    @classmethod
    def _at_least_one(cls, count: int) -> int:
        if count < 1:
            raise _problem(
                "an endpoint of production variants keeps one instance at the least; scaling to zero needs "
                "SageMaker inference components, which update without the canary (docs/serving-stack.md)"
            )
        return count

    @model_validator(mode="after")
    def _range(self) -> ServingConfig:
        if self.max_instances < self.min_instances:
            raise _problem(
                f"maxInstances = {self.max_instances} is below minInstances = {self.min_instances}; raise it"
            )
        # The green fleet is as large as the blue one, never smaller than minInstances (trainer/deploy/endpoint.py).
        if problem := canary_problem(self.canary_percent, self.min_instances):
            raise _problem(f"canaryPercent = {self.canary_percent}: {problem}")
        return self


class StackConfig(BaseModel):
    """One environment's settings. Field `foo_bar` is the stack file's `trainstack:fooBar`; `region` is `aws:region`."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=_key)

    stack: str = Field(
        alias="pulumi:stack", description="the stack name (from the file name, not a config key)"
    )
    region: str = Field(alias="aws:region", description="the AWS region, such as us-east-1")
    aws_profile: str | None = Field(default=None, alias="aws:profile")
    owner: str = Field(min_length=1, description="the team or person tagged as owner of every resource")
    instance_type: str = DEFAULT_INSTANCE_TYPE
    node_count: int = DEFAULT_NODE_COUNT
    availability_zones: list[str] = Field(
        description="the zones for subnets, such as [us-east-1a, us-east-1b]; the first hosts the GPU nodes and FSx"
    )
    vpc_cidr: str = "10.0.0.0/16"
    private_subnet_cidrs: list[str] | None = None
    public_subnet_cidrs: list[str] | None = None
    nat_gateways: int = 1
    interface_endpoints: list[str] = []
    fsx_deployment_type: Literal["SCRATCH_2", "PERSISTENT_2"] = DEFAULT_FSX_DEPLOYMENT_TYPE
    fsx_storage_capacity_gib: int = FSX_FIRST_STEP_GIB
    fsx_throughput_per_tib: int | None = None
    fsx_kms_encryption: bool | None = None
    placement_group: bool | None = None
    capacity_reservation_id: str | None = None
    reservation_placement_group: str | None = None
    capacity_block: bool = False
    spot: bool = False
    log_retention_days: int = 30
    noncurrent_version_expiration_days: int = Field(default=30, ge=1)
    ecr_keep_images: int = Field(default=30, ge=1)
    root_volume_gib: int = Field(default=200, ge=100)
    protect_data: bool = False
    image: str | None = None
    stop_grace_seconds: int = Field(default=DEFAULT_STOP_GRACE_SECONDS, ge=1)
    job_timeout_hours: int = Field(default=DEFAULT_JOB_TIMEOUT_HOURS, ge=1)
    # Alerting (infra/monitoring.py, docs/monitoring.md): who the alarm topic emails, and when alarms fire.
    alarm_emails: list[str] = []
    stall_alarm_minutes: int = Field(default=15, ge=2, le=MAX_ALARM_MINUTES)
    min_mfu: float | None = Field(default=None, gt=0, lt=1)
    min_tokens_per_second: float | None = Field(default=None, gt=0)
    throughput_alarm_minutes: int = Field(default=30, ge=1, le=MAX_ALARM_MINUTES)
    fsx_free_capacity_alarm_percent: int = Field(default=10, ge=1, le=50)
    # Cost (infra/budget.py, docs/cost.md): the AWS Budgets monthly limit on the stack's tagged cost; none: no budget.
    monthly_budget_usd: float | None = Field(default=None, gt=0)
    # Governance (infra/audit.py, infra/teams.py, docs/security.md).
    organization_trail: str | None = None
    audit_retention_days: int = Field(default=365, ge=1, le=36500)
    # The log bucket's Object Lock mode; unset: COMPLIANCE with protectData, else GOVERNANCE (`audit_lock`).
    audit_lock_mode: Literal["COMPLIANCE", "GOVERNANCE"] | None = None
    teams: list[TeamConfig] = []
    allowed_regions: list[str] | None = None
    security_hub: bool = False
    # Orchestration (docs/eks.md): AWS Batch, or an EKS cluster with JobSet and Kueue on the same nodes and data.
    orchestrator: Literal["batch", "eks"] = "batch"
    # EKS only: who administers the cluster (IAM role/user ARNs, each given an access entry with cluster-admin), and
    # the CIDRs that may reach the public API endpoint (none: the endpoint is private, reachable from the VPC only).
    eks_admin_arns: list[str] = []
    eks_public_access_cidrs: list[str] = []
    # Data preparation on CPU (infra/data_prep.py, docs/data.md): Spot or On-Demand, its size, the buckets it reads.
    data_spot: bool = True
    data_max_vcpus: int = Field(default=256, ge=1, le=10_000)
    data_job_vcpus: int = Field(default=8, ge=1, le=96)
    data_source_buckets: list[str] = []
    # The inference pool (infra/serving.py, docs/serving-stack.md); none: the stack serves no model.
    serving: ServingConfig | None = None

    @field_validator("data_source_buckets")
    @classmethod
    def _bucket_names(cls, names: list[str]) -> list[str]:
        bad = [name for name in names if not _BUCKET_NAME.match(name)]
        if bad:
            raise _problem(
                f"{bad[0]!r} is not an S3 bucket name (3-63 lowercase letters, digits, dots, hyphens; a bucket "
                f"name, not an s3:// URL)"
            )
        return names

    @field_validator("region")
    @classmethod
    def _commercial_region(cls, region: str) -> str:
        if not _REGION.match(region):
            raise _problem("not a commercial AWS region; use one such as us-east-1 or us-west-2")
        return region

    @field_validator("instance_type")
    @classmethod
    def _efa_instance_type(cls, name: str) -> str:
        if name not in INSTANCE_TYPES:
            raise _problem(f"unknown instance type; valid: {', '.join(EFA_INSTANCE_TYPES)}")
        if not INSTANCE_TYPES[name].has_efa:
            raise _problem(
                f"has no EFA, which multi-node training needs; valid: {', '.join(EFA_INSTANCE_TYPES)}"
            )
        return name

    @field_validator("node_count")
    @classmethod
    def _within_quota(cls, count: int) -> int:
        if not 1 <= count <= MAX_NODE_COUNT:
            raise _problem(f"must be between 1 and {MAX_NODE_COUNT} (the node quota in docs/infra.md#quotas)")
        return count

    @field_validator("availability_zones")
    @classmethod
    def _some_zones(cls, zones: list[str]) -> list[str]:
        if not zones:
            raise _problem("give at least one availability zone; the first one hosts the GPU nodes and FSx")
        if len(set(zones)) != len(zones):
            raise _problem("lists an availability zone twice")
        return zones

    @field_validator("vpc_cidr")
    @classmethod
    def _vpc_cidr(cls, cidr: str) -> str:
        network = _cidr(cidr)
        if not 16 <= network.prefixlen <= 20:
            raise _problem("the VPC needs a prefix between /16 and /20, such as 10.0.0.0/16")
        return cidr

    @field_validator("private_subnet_cidrs", "public_subnet_cidrs")
    @classmethod
    def _subnet_cidrs(cls, cidrs: list[str] | None) -> list[str] | None:
        for cidr in cidrs or ():
            _cidr(cidr)
        return cidrs

    @field_validator("interface_endpoints")
    @classmethod
    def _known_endpoints(cls, names: list[str]) -> list[str]:
        unknown = [n for n in names if n not in INTERFACE_ENDPOINTS]
        if unknown:
            raise _problem(f"unknown endpoint {unknown[0]!r}; valid: {', '.join(INTERFACE_ENDPOINTS)}")
        return names

    @field_validator("fsx_storage_capacity_gib")
    @classmethod
    def _fsx_capacity(cls, gib: int) -> int:
        if gib != FSX_FIRST_STEP_GIB and (gib <= 0 or gib % FSX_STEP_GIB):
            raise _problem(
                f"FSx for Lustre SSD takes {FSX_FIRST_STEP_GIB} GiB or a multiple of {FSX_STEP_GIB} GiB"
            )
        return gib

    @field_validator("capacity_reservation_id")
    @classmethod
    def _reservation_id(cls, reservation: str | None) -> str | None:
        if reservation is not None and not _CAPACITY_RESERVATION.match(reservation):
            raise _problem("not a capacity reservation id like cr-0123456789abcdef0")
        return reservation

    @field_validator("reservation_placement_group")
    @classmethod
    def _placement_group_name(cls, name: str | None) -> str | None:
        if name is not None and not _PLACEMENT_GROUP_NAME.match(name):
            raise _problem("not a placement group name (1 to 255 printable ASCII characters, no spaces)")
        return name

    @field_validator("alarm_emails")
    @classmethod
    def _emails(cls, emails: list[str]) -> list[str]:
        bad = [email for email in emails if not _EMAIL.match(email)]
        if bad:
            raise _problem(f"{bad[0]!r} is not an email address; list addresses such as oncall@example.com")
        return emails

    @field_validator("organization_trail")
    @classmethod
    def _trail_arn(cls, arn: str | None) -> str | None:
        if arn is not None and not _TRAIL_ARN.match(arn):
            raise _problem("not a trail ARN like arn:aws:cloudtrail:us-east-1:123456789012:trail/org-trail")
        return arn

    @field_validator("allowed_regions")
    @classmethod
    def _regions(cls, regions: list[str] | None) -> list[str] | None:
        bad = [r for r in regions or () if not _REGION.match(r)]
        if bad:
            raise _problem(f"{bad[0]!r} is not a commercial AWS region; list regions such as us-east-1")
        if regions is not None and not regions:
            raise _problem(
                "list at least the stack's region, or remove the key (default: the stack's region)"
            )
        return regions

    @field_validator("teams")
    @classmethod
    def _unique_teams(cls, teams: list[TeamConfig]) -> list[TeamConfig]:
        names = [t.name for t in teams]
        if len(set(names)) != len(names):
            raise _problem(f"team names must be unique; got {names}")
        return teams

    @field_validator("log_retention_days")
    @classmethod
    def _cloudwatch_retention(cls, days: int) -> int:
        if days not in LOG_RETENTION_DAYS:
            raise _problem(f"CloudWatch Logs allows only {', '.join(map(str, LOG_RETENTION_DAYS))}")
        return days

    @model_validator(mode="after")
    def _consistent(self) -> StackConfig:
        problems = [
            *self._zone_problems(),
            *self._subnet_problems(),
            *self._fsx_problems(),
            *self._capacity_problems(),
            *self._governance_problems(),
            *self._orchestrator_problems(),
            *self._serving_problems(),
        ]
        if problems:
            raise _problem("\n".join(problems))
        return self

    def _zone_problems(self) -> list[str]:
        problems = [
            f"{_key('availability_zones')} = {zone!r}: not a zone of region {self.region} "
            f"(aws:region); zones there are named {self.region}a, {self.region}b, ..."
            for zone in self.availability_zones
            if not re.fullmatch(re.escape(self.region) + r"[a-z]", zone)
        ]
        if not 1 <= self.nat_gateways <= len(self.availability_zones):
            problems.append(
                f"{_key('nat_gateways')} = {self.nat_gateways!r}: must be between 1 and the number of "
                f"availability zones ({len(self.availability_zones)}); one per zone survives a zone outage"
            )
        return problems

    def _subnet_problems(self) -> list[str]:
        vpc = ipaddress.IPv4Network(self.vpc_cidr)  # _vpc_cidr and _subnet_cidrs admitted IPv4 blocks only
        problems: list[str] = []
        seen: list[tuple[str, ipaddress.IPv4Network]] = []
        for field in ("private_subnet_cidrs", "public_subnet_cidrs"):
            given = getattr(self, field)
            if given is not None and len(given) != len(self.availability_zones):
                problems.append(
                    f"{_key(field)} = {given!r}: give one CIDR per availability zone "
                    f"({len(self.availability_zones)}), in the order of {_key('availability_zones')}"
                )
            for i, cidr in enumerate(given or ()):
                where, subnet = f"{_key(field)}[{i}]", ipaddress.IPv4Network(cidr)
                if not subnet.subnet_of(vpc):
                    problems.append(f"{where} = {cidr!r}: outside {_key('vpc_cidr')} {self.vpc_cidr}")
                problems += [
                    f"{where} = {cidr!r}: overlaps {other_where} = {other!s}"
                    for other_where, other in seen
                    if subnet.overlaps(other)
                ]
                seen.append((where, subnet))
        return problems

    def _fsx_problems(self) -> list[str]:
        problems = []
        throughput = self.fsx_throughput_per_tib
        if self.fsx_persistent and throughput is not None and throughput not in FSX_PERSISTENT_2_THROUGHPUTS:
            problems.append(
                f"{_key('fsx_throughput_per_tib')} = {throughput!r}: PERSISTENT_2 offers "
                f"{', '.join(map(str, FSX_PERSISTENT_2_THROUGHPUTS))} MB/s per TiB"
            )
        if not self.fsx_persistent and throughput is not None:
            problems.append(
                f"{_key('fsx_throughput_per_tib')} = {throughput!r}: only PERSISTENT_2 takes a throughput tier; "
                f"remove it or set {_key('fsx_deployment_type')} to PERSISTENT_2"
            )
        if not self.fsx_persistent and self.fsx_kms_encryption:
            problems.append(
                f"{_key('fsx_kms_encryption')} = True: {self.fsx_deployment_type} file systems are always encrypted "
                f"with an FSx-managed key; use PERSISTENT_2 for the stack's KMS key, or remove the key"
            )
        return problems

    def _capacity_problems(self) -> list[str]:
        """EFA nodes of a multi-node job need a cluster placement group (Batch guide, "Compute environment
        considerations for MNP"); an On-Demand Capacity Reservation made in a cluster placement group launches
        only into that group (EC2 guide, "Capacity Reservations for cluster placement groups"); a Capacity
        Block places its instances itself."""
        problems = []
        reservation, block = self.capacity_reservation_id, self.capacity_block
        if reservation and self.placement_group:
            problems.append(
                f"{_key('placement_group')} = True: a capacity reservation ({_key('capacity_reservation_id')} = "
                f"{reservation!r}) already fixes placement; remove {_key('placement_group')}"
            )
        if self.placement_group is False and not reservation:
            problems.append(
                f"{_key('placement_group')} = False: EFA nodes of a multi-node job need a cluster placement group "
                f"(or a reservation that fixes placement, {_key('capacity_reservation_id')}); remove the key"
            )
        if block and not reservation:
            problems.append(
                f"{_key('capacity_block')} = True: needs {_key('capacity_reservation_id')}, the Capacity Block's "
                "reservation id (cr-...)"
            )
        if reservation and not block and self.reservation_placement_group is None:
            problems.append(
                f"{_key('capacity_reservation_id')} = {reservation!r}: an On-Demand Capacity Reservation for EFA "
                f"nodes must be made in a cluster placement group; name it in {_key('reservation_placement_group')} "
                "(aws ec2 describe-capacity-reservations: PlacementGroupArn)"
            )
        if self.reservation_placement_group is not None and (not reservation or block):
            why = (
                "a Capacity Block places its instances itself" if block else "no capacity reservation is set"
            )
            problems.append(
                f"{_key('reservation_placement_group')} = {self.reservation_placement_group!r}: {why}; "
                f"remove {_key('reservation_placement_group')}"
            )
        return problems

    def _governance_problems(self) -> list[str]:
        problems = []
        if self.region not in self.data_regions:
            problems.append(
                f"{_key('allowed_regions')} = {self.allowed_regions!r}: must include the stack's own region "
                f"{self.region} (aws:region), where its buckets and cluster live"
            )
        if self.audit_lock == "COMPLIANCE" and not self.protect_data:
            # S3 User Guide, "Locking objects with Object Lock": in compliance mode no user, root included, can
            # delete a locked version before its retention ends, so `pulumi destroy` could not remove the bucket,
            # and the key its logs are encrypted with must outlive them.
            problems.append(
                f"{_key('audit_lock_mode')} = 'COMPLIANCE' on a stack without {_key('protect_data')}: compliance-"
                f"locked logs outlive `pulumi destroy` for {_key('audit_retention_days')}, so the stack must protect "
                f"and keep their bucket and key; set {_key('protect_data')}: true, or {_key('audit_lock_mode')}: "
                "GOVERNANCE (destroy then deletes the logs)"
            )
        if self.security_hub and self.organization_trail:
            problems.append(
                f"{_key('security_hub')} = True: the stack's Security Hub and AWS Config belong with its own audit "
                f"trail, which a stack on the organisation trail ({_key('organization_trail')}) does not have; "
                "enable Security Hub and Config from the organisation instead, or remove one of the keys"
            )
        gpus = self.instance.gpus * self.node_count
        problems += [
            f"{_key('teams')}: team {t.name!r} gpuQuota = {t.gpu_quota}: below one node of "
            f"{self.instance_type} ({self.instance.gpus} GPUs), so it could never run a job; "
            f"use {self.instance.gpus}..{gpus}"
            for t in self.teams
            if t.gpu_quota < self.instance.gpus
        ]
        problems += [
            f"{_key('teams')}: team {t.name!r} has neither members nor identityCenterGroup, so nobody could assume "
            "its role; list IAM principal ARNs in members, or give identityCenterGroup {instanceArn, groupId}, or both"
            for t in self.teams
            if not t.members and t.identity_center_group is None
        ]
        problems += [
            f"{_key('teams')}: team {t.name!r} identityCenterGroup: its permission set name "
            f"{permission_set_name(self.stack, t.name)!r} is {len(permission_set_name(self.stack, t.name))} "
            f"characters; IAM Identity Center allows {MAX_PERMISSION_SET_NAME}: shorten the team name"
            for t in self.teams
            if t.identity_center_group is not None
            and len(permission_set_name(self.stack, t.name)) > MAX_PERMISSION_SET_NAME
        ]
        return problems

    def _serving_problems(self) -> list[str]:
        """The inference pool's image must exist in the stack's region (trainer/contract/serving.py LMI_ACCOUNTS)."""
        if self.serving is None or self.region in LMI_ACCOUNTS:
            return []
        return [f"{_key('serving')}: {lmi_problem(self.region)}"]

    def _orchestrator_problems(self) -> list[str]:
        """Keys that belong to one orchestrator, and what EKS needs that Batch does not."""
        problems = []
        if self.orchestrator == "batch":
            problems += [
                f"{_key(field)} = {getattr(self, field)!r}: only EKS stacks take it; set "
                f"{_key('orchestrator')}: eks, or remove the key"
                for field in ("eks_admin_arns", "eks_public_access_cidrs")
                if getattr(self, field)
            ]
            return problems
        # CreateCluster needs subnets in at least two Availability Zones (EKS user guide, "View Amazon EKS networking
        # requirements for VPC and subnets").
        if len(self.availability_zones) < 2:
            problems.append(
                f"{_key('availability_zones')} = {self.availability_zones!r}: an EKS cluster needs subnets in at "
                "least two zones; list a second zone (the GPU nodes stay in the first)"
            )
        if self.spot:
            problems.append(
                f"{_key('spot')} = True: the single-node Spot queue is an AWS Batch queue; an EKS stack has none "
                "(remove the key)"
            )
        problems += [
            f"{_key('eks_admin_arns')} = {arn!r}: not an IAM role or user ARN; write arn:aws:iam::123456789012:role/name"
            for arn in self.eks_admin_arns
            if not re.fullmatch(r"arn:aws:iam::\d{12}:(role|user)/[\w+=,.@/-]+", arn)
        ]
        for cidr in self.eks_public_access_cidrs:
            try:
                network = ipaddress.IPv4Network(cidr, strict=True)
            except ValueError as e:
                problems.append(f"{_key('eks_public_access_cidrs')} = {cidr!r}: not an IPv4 CIDR block ({e})")
                continue
            if network.prefixlen == 0:
                problems.append(
                    f"{_key('eks_public_access_cidrs')} = {cidr!r}: opens the API endpoint to the internet; name "
                    "the office or VPN ranges, or leave the list empty for a private endpoint"
                )
        return problems

    # --- derived settings: what the components read -------------------------------------------------------------

    @property
    def instance(self) -> InstanceType:
        return INSTANCE_TYPES[self.instance_type]

    @property
    def cluster_availability_zone(self) -> str:
        """The zone that hosts every GPU node and the file system: the first of `availabilityZones`."""
        return self.availability_zones[0]

    @property
    def fsx_persistent(self) -> bool:
        return self.fsx_deployment_type.startswith("PERSISTENT")

    @property
    def fsx_uses_stack_key(self) -> bool:
        return self.fsx_persistent and self.fsx_kms_encryption is not False

    @property
    def fsx_throughput(self) -> int | None:
        """MB/s per TiB for persistent file systems (their default tier where none is set), None for scratch ones."""
        if not self.fsx_persistent:
            return None
        return self.fsx_throughput_per_tib or DEFAULT_FSX_PERSISTENT_2_MB_S_PER_TIB

    @property
    def creates_placement_group(self) -> bool:
        """The stack creates its cluster placement group, unless a capacity reservation decides placement."""
        return self.capacity_reservation_id is None

    @property
    def job_timeout_seconds(self) -> int:
        """Batch's attemptDurationSeconds for every job definition."""
        return self.job_timeout_hours * 3600

    @property
    def subnet_cidrs(self) -> tuple[list[str], list[str]]:
        """(private, public) CIDRs per zone: as configured, or carved from the VPC (/20s private, /24s public)."""
        vpc = ipaddress.IPv4Network(self.vpc_cidr)  # _vpc_cidr admitted an IPv4 block only
        blocks = list(vpc.subnets(new_prefix=vpc.prefixlen + 4))
        public_blocks = blocks[-1].subnets(new_prefix=vpc.prefixlen + 8)
        zones = range(len(self.availability_zones))
        private = self.private_subnet_cidrs or [str(blocks[i]) for i in zones]
        public = self.public_subnet_cidrs or [str(next(public_blocks)) for _ in zones]
        return private, public

    @property
    def name_prefix(self) -> str:
        """Prefix of every resource name; the instance role finds Batch's ECS clusters by it."""
        return f"{NAMESPACE}-{self.stack}"

    @property
    def eks_cluster_name(self) -> str:
        """The EKS cluster's name (EKS stacks): the stack's prefix, so IAM and logs can be scoped to it."""
        return self.name_prefix

    @property
    def eks_cluster_role(self) -> str:
        """The logical name of the EKS control plane's role; Pulumi names it `<this>-<7 hex>`, which the key policy
        matches before the role exists (infra/keys.py)."""
        return f"{self.name_prefix}-eks-cluster"

    @property
    def eks_log_group(self) -> str:
        """Where EKS sends the control plane's logs: /aws/eks/<cluster>/cluster (EKS user guide, "Send control plane
        logs to CloudWatch Logs"); the stack creates it first, under its key and retention."""
        return f"/aws/eks/{self.eks_cluster_name}/cluster"

    @property
    def log_group_prefix(self) -> str:
        """Every log group of the stack lives under this path; the key policy and the roles are scoped to it."""
        return f"/{NAMESPACE}/{self.stack}"

    @property
    def jobs_log_group(self) -> str:
        """The Batch jobs' log group (infra/cluster.py), which the team roles read (infra/teams.py)."""
        return f"{self.log_group_prefix}/jobs"

    @property
    def data_regions(self) -> list[str]:
        """Where this stack's data may live (`allowedRegions`, default: the stack's region)."""
        return self.allowed_regions or [self.region]

    @property
    def audit_lock(self) -> Literal["COMPLIANCE", "GOVERNANCE"]:
        """The log bucket's Object Lock mode: `auditLockMode`, else COMPLIANCE where data is protected (prod), and
        GOVERNANCE elsewhere, which `pulumi destroy` can tear down (docs/security.md#what-pulumi-destroy-does)."""
        if self.audit_lock_mode is not None:
            return self.audit_lock_mode
        return "COMPLIANCE" if self.protect_data else "GOVERNANCE"

    @property
    def audit_trail_name(self) -> str:
        """The stack's own trail; its ARN is known before it exists, so the key policy can name it."""
        return f"{self.name_prefix}-audit"

    @property
    def serving_endpoint_name(self) -> str:
        """The endpoint `make deploy` creates and updates; the alarms and the dashboard name it before it exists."""
        return f"{self.name_prefix}-serving"

    @property
    def serving_log_group(self) -> str:
        """Where SageMaker writes the endpoint's container logs (SageMaker Developer Guide, "Log Amazon SageMaker AI
        Events with Amazon CloudWatch": /aws/sagemaker/Endpoints/<endpoint name>); the stack creates it first, with
        its retention and key."""
        return f"/aws/sagemaker/Endpoints/{self.serving_endpoint_name}"

    @property
    def tags(self) -> dict[str, str]:
        return {"project": NAMESPACE, "stack": self.stack, "owner": self.owner}


def _cidr(cidr: str) -> ipaddress.IPv4Network:
    try:
        network = ipaddress.IPv4Network(cidr, strict=True)
    except ValueError as e:
        raise _problem(f"not a valid IPv4 CIDR block ({e}); write it like 10.0.0.0/16") from None
    if not network.is_private:
        raise _problem(
            "not a private (RFC 1918) range; use one inside 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16"
        )
    return network


# The alias generator gives every field its key; `is not None` tells the type checker so.
_FIELDS = {
    f.alias: f for f in StackConfig.model_fields.values() if f.alias is not None and f.alias != "pulumi:stack"
}


def parse_stack_config(stack: str, values: Mapping[str, Any], source: str = "stack config") -> StackConfig:
    """Validate a stack's `namespace:key -> value` config (YAML values, or the CLI's strings) into a StackConfig.

    Keys of the `pulumi:` namespace belong to the CLI and are ignored; any other unknown key is an error.
    """
    given = {k: _decode(k, v) for k, v in values.items() if not k.startswith("pulumi:")}
    try:
        return StackConfig.model_validate({**given, "pulumi:stack": stack})
    except ValidationError as e:
        problems = [problem for error in e.errors() for problem in _describe(error)]
    raise StackConfigError(f"{source}: {len(problems)} problem(s)\n  " + "\n  ".join(problems))


def read_stack_file(stack: str, root: Path = ROOT) -> dict[str, Any]:
    """The `config:` mapping of `Pulumi.<stack>.yaml`, unvalidated."""
    try:
        return _read_stack_file(stack, root)
    except StackFileError as error:
        raise StackConfigError(str(error)) from None


def load_stack_config(stack: str, root: Path = ROOT) -> StackConfig:
    """Read and validate `Pulumi.<stack>.yaml` from the repository root."""
    return parse_stack_config(stack, read_stack_file(stack, root), source=f"Pulumi.{stack}.yaml")


def pulumi_stack_config() -> StackConfig:
    """The running Pulumi program's config (the CLI's, or the one the offline preview set), validated; bad config
    raises pulumi.RunError with the StackConfigError's message."""
    import pulumi
    from pulumi.runtime.config import CONFIG, get_config_env

    try:
        return parse_stack_config(
            pulumi.get_stack(), {**get_config_env(), **CONFIG.get()}, f"stack {pulumi.get_stack()}"
        )
    except StackConfigError as error:
        # The Pulumi CLI prints a RunError's message alone; any other exception comes with a traceback.
        raise pulumi.RunError(str(error)) from None


def _decode(key: str, value: Any) -> Any:
    """The CLI hands every value to the program as a string (lists as JSON); read numbers, booleans and lists back
    as the stack file has them, so that a message shows `nodeCount = 0`, not `nodeCount = '0'`."""
    field = _FIELDS.get(key)
    if not isinstance(value, str) or (field is not None and field.annotation in (str, str | None)):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _describe(error: Mapping[str, Any]) -> list[str]:
    if not error["loc"]:  # cross-key problems, one a line, each naming its keys
        return error["msg"].splitlines()
    key = str(error["loc"][0]) + "".join(f"[{part}]" for part in error["loc"][1:])
    if error["type"] == "extra_forbidden":
        # Compare the part after the namespace, so that `trainstack:` itself does not make every key look close.
        by_name = {valid.partition(":")[2]: valid for valid in _FIELDS}
        near = difflib.get_close_matches(key.partition(":")[2], by_name, n=1, cutoff=0.6)
        hint = f"did you mean {by_name[near[0]]}?" if near else f"valid keys: {', '.join(sorted(_FIELDS))}"
        return [f"{key}: unknown key; {hint}"]
    if error["type"] == "missing":
        field = _FIELDS.get(key)  # a nested key (trainstack:teams[0][gpuQuota]) has no entry of its own
        what = f": {field.description}" if field else ""
        return [f"{key}: required{what} (docs/infra.md#configuration)"]
    return [f"{key} = {error['input']!r}: {error['msg']}"]
