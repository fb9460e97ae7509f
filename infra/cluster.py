"""The GPU cluster on AWS Batch: EFA security group, placement, launch template, compute environment, queue, jobs.

Everything that depends on the instance type (EFA interfaces, uverbs devices, vCPUs, memory, GPUs) is read from
`trainer.contract.catalog`. The job definition is the container contract the image is built to:

- image: `trainstack:image`, else `<ecr repository url>:latest`, a placeholder the IMMUTABLE repository never
  receives; such a definition is named `<name>-template` (template_name) to say so in the console and the CLI. Batch
  cannot override a job's image at submission, so the submit tools register or reuse a revision with the tag they
  run, under `<name>-run` (trainer/contract/container.py runnable_definition_name), and `make push` one of every
  exported definition (trainer/jobs/submit.py JOB_DEFINITION_OUTPUTS);
- entrypoint: baked into the image (`/opt/trainstack/image/entrypoint.sh`); the job definition sets only the
  command, by default `train --config trainer/configs/llama3-8b.yaml`;
- `/fsx` from the host (user data mounts FSx there): datasets under /fsx/datasets, checkpoints under
  /fsx/checkpoints/<run>; the NCCL/EFA environment from image/efa.env;
- retries only when the host failed (`Host EC2*` status reasons); an application error ends the job;
- a timeout per attempt (`trainstack:jobTimeoutHours`) and the trainer's SIGTERM grace
  (`TRAINSTACK_STOP_GRACE_SECONDS`), which the ECS agent's stop timeout on the nodes exceeds.

Security groups live on the launch template's network interfaces only: Batch refuses a compute environment that
names security groups when its launch template defines network interfaces. The containers of a multi-node job
get their own network interface (awsvpc), which then uses the VPC's default security group (infra/network.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, Unpack

import pulumi
import pulumi_aws as aws

from infra.config import StackConfig
from infra.lustre import LUSTRE_PORTS, Lustre
from infra.node_bootstrap import node_user_data
from trainer.contract.catalog import InstanceType
from trainer.contract.container import (
    CHECKPOINTS_DIR,
    DEFAULT_COMMAND,
    FSX_MOUNT,
    PURCHASE_OPTION_ENV,
    TEMPLATE_SUFFIX,
)
from trainer.contract.image import efa_environment
from trainer.contract.retry import RETRY_ATTEMPTS, RETRY_EXIT_CODE

if TYPE_CHECKING:
    from infra.identity import Identity
    from infra.keys import Keys
    from infra.network import Network
    from infra.registry import Registry

# The ECS-optimized Amazon Linux 2023 AMI with NVIDIA drivers; Batch picks its newest release.
IMAGE_TYPE = "ECS_AL2023_NVIDIA"
ROOT_DEVICE = "/dev/xvda"


def root_volume(
    cfg: StackConfig, key_arn: pulumi.Input[str]
) -> aws.ec2.LaunchTemplateBlockDeviceMappingArgsDict:
    """A node's root volume (the AMI's root device): gp3, encrypted with the stack key, gone with the node. Every
    launch template of the stack uses it (Batch GPU, EKS nodes, the CPU data nodes)."""
    return {
        "device_name": ROOT_DEVICE,
        "ebs": {
            "volume_size": cfg.root_volume_gib,
            "volume_type": "gp3",
            "encrypted": "true",
            "kms_key_id": key_arn,
            "delete_on_termination": "true",
        },
    }


# IMDSv2 token responses travel one hop. Enough for a multi-node job's containers: they run in awsvpc mode, where the
# task has its own network interface with "the same networking properties as Amazon EC2 instances" (ECS developer
# guide, "Amazon ECS task networking options for the EC2 launch type") and reaches IMDS unless the agent sets
# ECS_AWSVPC_BLOCK_IMDS (ECS developer guide, "Amazon ECS container instance IAM role"); bridge-mode containers, one
# hop further, get no token. docs/cluster.md and docs/infra.md state this number (tests/infra/test_imds_hop_limit.py).
IMDS_HOP_LIMIT = 1


def container_memory_mib(instance: InstanceType) -> int:
    """What a job may ask for: ECS registers less than EC2 advertises (kernel, page tables, agent, docker).

    Rule: keep back 5 % of the instance's memory, at least 2 GiB; asking for more leaves a job RUNNABLE forever.
    """
    total = instance.memory_gib * 1024
    return min(total * 95 // 100, total - 2048)


def efa_network_interfaces(
    instance: InstanceType, security_group_id: Any
) -> list[aws.ec2.LaunchTemplateNetworkInterfaceArgsDict]:
    """One interface per EFA card: the primary `efa` (card 0, device 0, the node's IP) and `efa-only` on the rest.

    No subnet: the compute environment's `subnets` place the nodes. Batch ignores a launch template's network
    interface subnets (Batch user guide, "Use Amazon EC2 launch templates with AWS Batch"), and EKS managed node
    groups refuse a launch template whose interfaces name one (EKS user guide, "Customize managed nodes with
    launch templates").
    """
    common: aws.ec2.LaunchTemplateNetworkInterfaceArgsDict = {
        "security_groups": [security_group_id],
        "delete_on_termination": "true",
    }
    primary: aws.ec2.LaunchTemplateNetworkInterfaceArgsDict = {
        **common,
        "network_card_index": 0,
        "device_index": 0,
        "interface_type": "efa",
    }
    efa_only: list[aws.ec2.LaunchTemplateNetworkInterfaceArgsDict] = [
        {**common, "network_card_index": card, "device_index": 0, "interface_type": "efa-only"}
        for card in range(1, instance.efa_interfaces)
    ]
    return [{**primary, "associate_public_ip_address": "false"}, *efa_only]


def main_purchase_option(cfg: StackConfig) -> str:
    """What the GPU environment's nodes (an EKS stack's GPU nodes alike: infra/eks.py) are bought as: its launch template's Capacity Block (market type
    capacity-block) or On-Demand Capacity Reservation (_reserved_capacity), else On-Demand (type EC2: "EC2 On-Demand
    Instances", Batch User Guide, "Managed compute environments")."""
    if cfg.capacity_reservation_id is None:
        return "on-demand"
    return "capacity-block" if cfg.capacity_block else "reservation"


def placeholder_image(cfg: StackConfig, registry: Any) -> pulumi.Input[str]:
    """`trainstack:image`, else the repository's `:latest`, which no push writes (ECR User Guide, "Image tag
    mutability": the repository is IMMUTABLE and `make push` pushes commit tags)."""
    return cfg.image or pulumi.Output.concat(registry.repository.repository_url, ":latest")


def template_name(cfg: StackConfig, logical: str) -> str | None:
    """A job definition's name: `<logical>-template` while it names the placeholder image, so nobody mistakes it
    for one that runs (issue 46 item 9); Pulumi's auto-name (`<logical>-<suffix>`) once `trainstack:image` is set.
    Either matches the team policy's `<name prefix>-train-*` and `-spot-*` patterns (infra/teams.py)."""
    return None if cfg.image else f"{logical}{TEMPLATE_SUFFIX}"


def job_container(
    cfg: StackConfig,
    image: Any,
    job_role_arn: Any,
    execution_role_arn: Any,
    log_group: Any,
    purchase_option: str,
) -> dict[str, Any]:
    """The container every node runs (Batch's ContainerProperties), sized and wired from the catalog, on nodes bought
    as `purchase_option`."""
    instance = cfg.instance
    memory = container_memory_mib(instance)
    # The preflight checks GPUs and EFA devices against the catalog entry TRAINSTACK_INSTANCE_TYPE names.
    environment = {
        **efa_environment(),
        "TRAINSTACK_INSTANCE_TYPE": cfg.instance_type,
        PURCHASE_OPTION_ENV: purchase_option,
        "TRAINSTACK_CHECKPOINT_ROOT": CHECKPOINTS_DIR,
        # The grace the ECS agent's stop timeout (node user data) is derived from: one number for both.
        "TRAINSTACK_STOP_GRACE_SECONDS": str(cfg.stop_grace_seconds),
    }
    return {
        "image": image,
        "command": DEFAULT_COMMAND,
        "jobRoleArn": job_role_arn,
        "executionRoleArn": execution_role_arn,
        "resourceRequirements": [
            {"type": "VCPU", "value": str(instance.vcpus)},
            {"type": "MEMORY", "value": str(memory)},
            {"type": "GPU", "value": str(instance.gpus)},
        ],
        "linuxParameters": {
            "devices": [
                {"hostPath": device, "containerPath": device, "permissions": ["READ", "WRITE", "MKNOD"]}
                for device in instance.uverbs_devices
            ],
            # PyTorch data workers and NCCL's intra-node transport live in /dev/shm.
            "sharedMemorySize": memory // 8,
        },
        # EFA registers (pins) GPU and host buffers with the NIC.
        "ulimits": [{"name": "memlock", "softLimit": -1, "hardLimit": -1}],
        "volumes": [{"name": "fsx", "host": {"sourcePath": FSX_MOUNT}}],
        "mountPoints": [{"sourceVolume": "fsx", "containerPath": FSX_MOUNT, "readOnly": False}],
        "environment": [{"name": k, "value": v} for k, v in sorted(environment.items())],
        "logConfiguration": {
            "logDriver": "awslogs",
            "options": {
                "awslogs-group": log_group,
                "awslogs-region": cfg.region,
                "awslogs-stream-prefix": "train",
            },
        },
    }


RETRY_ON_HOST_FAILURE: aws.batch.JobDefinitionRetryStrategyArgsDict = {
    "attempts": RETRY_ATTEMPTS,
    "evaluate_on_exits": [
        {"on_status_reason": "Host EC2*", "action": "RETRY"},
        # A run that ended for a reason fresh hosts cure (a hang, a node that failed its health checks) exits with
        # this code (trainer/contract/retry.py). onExitCode: digits, optionally ending in * (Batch API, EvaluateOnExit).
        {"on_exit_code": str(RETRY_EXIT_CODE), "action": "RETRY"},
        {"on_reason": "*", "action": "EXIT"},
    ],
}


class _SecurityGroupSide(TypedDict):
    """The arguments every rule of the EFA group shares: which group the rule belongs to, and its parent."""

    security_group_id: pulumi.Output[str]
    opts: pulumi.ResourceOptions


class _LustreRule(TypedDict):
    """One Lustre port range, the same in both directions."""

    ip_protocol: str
    from_port: int
    to_port: int
    opts: pulumi.ResourceOptions


class _EnvironmentCapacity(TypedDict):
    """What differs between the GPU and the Spot compute environments."""

    type: str
    allocation_strategy: str
    placement_group: NotRequired[pulumi.Input[str] | None]


def efa_security_group(
    cfg: StackConfig, network: Network, file_system: Lustre, child: pulumi.ResourceOptions
) -> aws.ec2.SecurityGroup:
    """The GPU nodes' group (Batch and EKS alike): EFA needs all traffic from AND to its own group, 0.0.0.0/0 egress
    does not cover EFA's SRD traffic; HTTPS out; Lustre both ways with the file system."""
    prefix = cfg.name_prefix
    group = aws.ec2.SecurityGroup(
        f"{prefix}-efa",
        vpc_id=network.vpc.id,
        description="GPU nodes: EFA, NCCL bootstrap, FSx client",
        opts=child,
    )
    own: _SecurityGroupSide = {"security_group_id": group.id, "opts": child}
    aws.vpc.SecurityGroupIngressRule(
        f"{prefix}-efa-from-self",
        referenced_security_group_id=group.id,
        ip_protocol="-1",
        description="EFA and NCCL between nodes",
        **own,
    )
    aws.vpc.SecurityGroupEgressRule(
        f"{prefix}-efa-to-self",
        referenced_security_group_id=group.id,
        ip_protocol="-1",
        description="EFA and NCCL between nodes",
        **own,
    )
    aws.vpc.SecurityGroupEgressRule(
        f"{prefix}-efa-https",
        cidr_ipv4="0.0.0.0/0",
        ip_protocol="tcp",
        from_port=443,
        to_port=443,
        description="AWS APIs, ECR, S3, package repositories",
        **own,
    )
    # Lustre both ways between clients and servers (FSx for Lustre user guide, "File system access control with
    # Amazon VPC"): security group rules are per direction, and Pulumi removes the default allow-all egress.
    fsx = file_system.security_group.id
    for low, high in LUSTRE_PORTS:
        lustre: _LustreRule = {"ip_protocol": "tcp", "from_port": low, "to_port": high, "opts": child}
        aws.vpc.SecurityGroupEgressRule(
            f"{prefix}-efa-to-fsx-{low}",
            security_group_id=group.id,
            referenced_security_group_id=fsx,
            description="Lustre client to FSx",
            **lustre,
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{prefix}-efa-from-fsx-{low}",
            security_group_id=group.id,
            referenced_security_group_id=fsx,
            description="Lustre: FSx servers to their clients",
            **lustre,
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{prefix}-fsx-from-efa-{low}",
            security_group_id=fsx,
            referenced_security_group_id=group.id,
            description="Lustre clients: the GPU nodes",
            **lustre,
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{prefix}-fsx-to-efa-{low}",
            security_group_id=fsx,
            referenced_security_group_id=group.id,
            description="Lustre: FSx servers to their clients",
            **lustre,
        )
    return group


@dataclass
class ClusterArgs:
    config: StackConfig
    network: Network
    keys: Keys
    lustre: Lustre
    identity: Identity
    registry: Registry
    # With teams (infra/teams.py): the fair-share policy of the GPU and Spot queues (a team's jobs and sweeps carry
    # its share to either); None keeps first-in-first-out queues.
    scheduling_policy: aws.batch.SchedulingPolicy | None = None


class Cluster(pulumi.ComponentResource):
    """Managed EC2 Batch environment scaling 0..N nodes, its queue, and the multi-node training job definition."""

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainstack:cluster:Cluster", name, None, opts)
        cfg, child = args.config, pulumi.ResourceOptions(parent=self)
        prefix = cfg.name_prefix

        self.security_group = efa_security_group(cfg, args.network, args.lustre, child)
        self.launch_template = self._launch_template(f"{prefix}-gpu", args, **self._reserved_capacity(cfg))
        self.compute_environment = self._environment(
            f"{prefix}-gpu",
            args,
            self.launch_template,
            type="EC2",
            allocation_strategy="BEST_FIT_PROGRESSIVE",
            placement_group=self._placement_group(cfg, child),
        )
        self.job_queue = self._queue(f"{prefix}-gpu", self.compute_environment, args.scheduling_policy)
        self.job_queues = {"gpu": self.job_queue}  # every queue the stack creates (monitoring watches each)

        self.log_group = aws.cloudwatch.LogGroup(
            f"{prefix}-jobs",
            name=cfg.jobs_log_group,
            retention_in_days=cfg.log_retention_days,
            kms_key_id=args.keys.key.arn,
            opts=child,
        )
        image = placeholder_image(cfg, args.registry)
        roles = (args.identity.job_role.arn, args.identity.execution_role.arn)
        container = job_container(cfg, image, *roles, self.log_group.name, main_purchase_option(cfg))
        self.job_definition = aws.batch.JobDefinition(
            f"{prefix}-train",
            name=template_name(cfg, f"{prefix}-train"),
            type="multinode",
            platform_capabilities=["EC2"],
            propagate_tags=True,
            node_properties=pulumi.Output.json_dumps(
                {
                    "mainNode": 0,
                    "numNodes": cfg.node_count,
                    "nodeRangeProperties": [
                        {"targetNodes": "0:", "container": {**container, "instanceType": cfg.instance_type}}
                    ],
                }
            ),
            retry_strategy=RETRY_ON_HOST_FAILURE,
            timeout={"attempt_duration_seconds": cfg.job_timeout_seconds},
            opts=child,
        )
        outputs = {
            "job_queue": self.job_queue.name,
            "job_definition": self.job_definition.arn,
            "log_group": self.log_group.name,
        }
        if cfg.spot:
            # The Spot environment's nodes are Spot Instances (type SPOT: Batch User Guide, "Managed compute
            # environments"), and its jobs' ledgers price them so.
            spot_container = job_container(cfg, image, *roles, self.log_group.name, "spot")
            outputs.update(self._spot(args, spot_container))
        self.outputs = outputs
        self.register_outputs(outputs)

    @staticmethod
    def _placement_group(cfg: StackConfig, child: pulumi.ResourceOptions) -> pulumi.Input[str] | None:
        """The cluster placement group Batch launches EFA nodes into (Batch guide, "Compute environment
        considerations for MNP"): the stack's own; an On-Demand Capacity Reservation's, which must be the group
        the reservation was made in (EC2 guide, "Capacity Reservations for cluster placement groups"); none for a
        Capacity Block, which places its instances itself."""
        if cfg.creates_placement_group:
            return aws.ec2.PlacementGroup(cfg.name_prefix + "-gpu", strategy="cluster", opts=child).name
        return cfg.reservation_placement_group

    @staticmethod
    def _reserved_capacity(cfg: StackConfig) -> dict[str, Any]:
        """Launch into the configured On-Demand Capacity Reservation or Capacity Block, if any."""
        if cfg.capacity_reservation_id is None:
            return {}
        reserved: dict[str, Any] = {
            "capacity_reservation_specification": {
                "capacity_reservation_target": {"capacity_reservation_id": cfg.capacity_reservation_id}
            }
        }
        if cfg.capacity_block:
            reserved["instance_market_options"] = {"market_type": "capacity-block"}
        return reserved

    def _launch_template(self, name: str, args: ClusterArgs, **extra: Any) -> aws.ec2.LaunchTemplate:
        cfg = args.config
        return aws.ec2.LaunchTemplate(
            name,
            update_default_version=True,
            network_interfaces=efa_network_interfaces(cfg.instance, self.security_group.id),
            metadata_options={
                "http_endpoint": "enabled",
                "http_tokens": "required",  # IMDSv2 only
                "http_put_response_hop_limit": IMDS_HOP_LIMIT,
            },
            block_device_mappings=[root_volume(cfg, args.keys.key.arn)],
            user_data=pulumi.Output.all(
                args.lustre.file_system.dns_name, args.lustre.file_system.mount_name
            ).apply(lambda fsx: node_user_data(fsx[0], fsx[1], cfg.stop_grace_seconds)),
            # A node whose bootstrap fails shuts itself down: terminate it rather than keep a stopped instance.
            instance_initiated_shutdown_behavior="terminate",
            tag_specifications=[
                {"resource_type": kind, "tags": cfg.tags}
                for kind in ("instance", "volume", "network-interface")
            ],
            opts=pulumi.ResourceOptions(parent=self),
            **extra,
        )

    def _environment(
        self,
        name: str,
        args: ClusterArgs,
        template: aws.ec2.LaunchTemplate,
        **resources: Unpack[_EnvironmentCapacity],
    ) -> aws.batch.ComputeEnvironment:
        """A managed environment of the stack's instance type in the cluster subnet, from 0 to `nodeCount` nodes."""
        cfg = args.config
        return aws.batch.ComputeEnvironment(
            name,
            type="MANAGED",
            state="ENABLED",
            compute_resources={
                "min_vcpus": 0,  # an idle cluster runs (and costs) nothing
                "max_vcpus": cfg.node_count * cfg.instance.vcpus,
                "instance_types": [cfg.instance_type],
                "subnets": [args.network.cluster_subnet.id],
                # No security_group_ids: the launch template's interfaces carry them. CreateComputeEnvironment
                # answers 400 "Either compute environment Security Groups or Network Interfaces in Launch
                # template are exclusively allowed" to both (aws/aws-cdk#21577).
                "instance_role": args.identity.instance_profile.arn,
                # A pinned version: a changed template rolls the instances instead of drifting silently.
                "launch_template": {
                    "launch_template_id": template.id,
                    "version": template.latest_version.apply(str),
                },
                "ec2_configurations": [{"image_type": IMAGE_TYPE}],
                "tags": cfg.tags,  # default tags do not reach the instances Batch launches
                **resources,
            },
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _queue(
        self,
        name: str,
        environment: aws.batch.ComputeEnvironment,
        scheduling_policy: aws.batch.SchedulingPolicy | None = None,
    ) -> aws.batch.JobQueue:
        return aws.batch.JobQueue(
            name,
            state="ENABLED",
            priority=1,
            scheduling_policy_arn=scheduling_policy.arn if scheduling_policy is not None else None,
            compute_environment_orders=[{"order": 1, "compute_environment": environment.arn}],
            # botocore batch model, CreateJobQueue.schedulingPolicyArn: "A job queue without a fair-share scheduling
            # policy is scheduled as a FIFO job queue and can't have a fair-share scheduling policy added";
            # UpdateJobQueue: "the fair-share scheduling policy can be replaced but not removed". pulumi-aws plans
            # either as an in-place update, which Batch refuses: turning trainstack:teams on or off replaces the
            # queue instead (a new name; the old one is disabled and deleted, and Batch terminates the jobs still
            # in it: DeleteJobQueue, same model; docs/security.md#teams).
            opts=pulumi.ResourceOptions(parent=self, replace_on_changes=["schedulingPolicyArn"]),
        )

    def _spot(self, args: ClusterArgs, container: dict[str, Any]) -> dict[str, pulumi.Output[str]]:
        """Single-node Spot jobs (evaluations, data preparation): multi-node parallel jobs cannot run on Spot.

        Same template without the reservation: the nodes keep their EFA devices, so the same container runs; their
        own cluster placement group, as every Batch environment of EFA nodes needs one.
        """
        cfg, child = args.config, pulumi.ResourceOptions(parent=self)
        template = self._launch_template(f"{cfg.name_prefix}-spot", args)
        environment = self._environment(
            f"{cfg.name_prefix}-spot",
            args,
            template,
            type="SPOT",
            allocation_strategy="SPOT_PRICE_CAPACITY_OPTIMIZED",
            # "All instances that use an EFA must be in the same cluster placement group" (Batch user guide, "Elastic
            # Fabric Adapter"); a group of its own, so Spot nodes never take room from the multi-node jobs' group.
            placement_group=aws.ec2.PlacementGroup(
                f"{cfg.name_prefix}-spot", strategy="cluster", opts=child
            ).name,
        )
        # With teams the Spot queue takes the same fair-share policy as the GPU queue: a team's sweep workers
        # (trainer/jobs/sweep.py) carry its share identifier, which SubmitJob refuses on a queue without one and
        # requires on a queue with one (Batch API Reference, SubmitJob `shareIdentifier`); shares are counted per
        # queue, not across queues (Batch User Guide, "Use share identifiers to identify workloads").
        queue = self.job_queues["spot"] = self._queue(
            f"{cfg.name_prefix}-spot", environment, args.scheduling_policy
        )
        definition = aws.batch.JobDefinition(
            f"{cfg.name_prefix}-spot",
            name=template_name(cfg, f"{cfg.name_prefix}-spot"),
            type="container",
            platform_capabilities=["EC2"],
            propagate_tags=True,
            container_properties=pulumi.Output.json_dumps(container),
            retry_strategy=RETRY_ON_HOST_FAILURE,
            timeout={"attempt_duration_seconds": cfg.job_timeout_seconds},
            opts=child,
        )
        return {"spot_job_queue": queue.name, "spot_job_definition": definition.arn}
