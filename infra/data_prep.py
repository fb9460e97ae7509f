"""CPU capacity for data preparation: a Batch compute environment and queue of CPU instances, the data job role
and the job definition `make data STACK=<env>` submits (trainer/jobs/data.py: an array job of `prepare` shards,
then the merge that publishes the dataset).

- Spot by default (`trainstack:dataSpot`): each array child is a single-node job, which Batch runs on Spot; only
  multi-node parallel jobs cannot (Batch user guide, "Multi-node parallel jobs"). An interrupted child is retried
  (`Host EC2*`), and `prepare` is idempotent, so a retry costs only its own shard.
- `SPOT_PRICE_CAPACITY_OPTIMIZED` across several instance families: the pools least likely to be interrupted at the
  lowest price, and no Spot Fleet role (needed only with `BEST_FIT`; Batch user guide, "Instance type allocation
  strategies for AWS Batch").
- min 0 vCPUs: an idle queue runs, and costs, nothing; at most `trainstack:dataMaxVcpus`.
- In every private subnet of the stack (Spot capacity differs by zone), with the S3 gateway endpoint on their route
  tables, so reading the source and writing the datasets bucket never pays NAT.
- The job role reads the datasets bucket and the `trainstack:dataSourceBuckets` and writes the datasets bucket;
  it may not delete, so a published dataset version is never removed by a data job.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_aws as aws

from infra.cluster import RETRY_ON_HOST_FAILURE, placeholder_image, root_volume, template_name
from infra.config import StackConfig
from infra.iam import allow, policy_document, service_trust_policy
from infra.network import https_out_group
from infra.node_bootstrap import ECS_CONFIG, MIME_BOUNDARY, ecs_stop_timeout_seconds

if TYPE_CHECKING:
    from infra.data_lake import DataLake
    from infra.identity import Identity
    from infra.keys import Keys
    from infra.network import Network
    from infra.registry import Registry

# Current compute-optimized and general-purpose families, several Spot pools to draw from; a family stands for each
# of its sizes (Batch API reference, ComputeResource instanceTypes).
DATA_INSTANCE_FAMILIES = ["c6i", "c7i", "m6i", "m7i"]
# The ECS-optimized Amazon Linux 2023 AMI without GPU drivers (Batch API, Ec2Configuration imageType).
DATA_IMAGE_TYPE = "ECS_AL2023"
# c-family instances carry 2 GiB per vCPU; Batch's "Reserve system memory" recommends keeping 5 % for the ECS agent
# and the system, so a job asks for 95 % of that and fits the smallest instance with its vCPUs.
MIB_PER_VCPU = 2048 * 95 // 100
# A data job's container, not a training rank: one process (trainer launch reads these; image/entrypoint.sh) and
# no GPU preflight.
DATA_JOB_ENVIRONMENT = {"NPROC_PER_NODE": "1", "TRAINSTACK_SKIP_PREFLIGHT": "1"}


def data_job_memory_mib(vcpus: int) -> int:
    return vcpus * MIB_PER_VCPU


def data_node_user_data(stop_grace_seconds: int) -> str:
    """The ECS agent's stop timeout, the same as the GPU nodes': the policy pack holds every environment of the
    stack above the longest SIGTERM grace of its job definitions (a data job stops sooner; this only caps it)."""
    script = (
        "#!/bin/bash\nset -euxo pipefail\n"
        f'echo "ECS_CONTAINER_STOP_TIMEOUT={ecs_stop_timeout_seconds(stop_grace_seconds)}s" >> {ECS_CONFIG}\n'
    )
    message = MIMEMultipart(boundary=MIME_BOUNDARY)
    message.attach(MIMEText(script, "x-shellscript"))
    return base64.b64encode(message.as_string().encode()).decode()


@dataclass
class DataPrepArgs:
    config: StackConfig
    account_id: pulumi.Input[str]
    network: Network
    keys: Keys
    lake: DataLake
    identity: Identity
    registry: Registry
    log_group: pulumi.Input[
        str
    ]  # the stack's job log group (Batch's, or the EKS cluster's application group)


class DataPrep(pulumi.ComponentResource):
    """CPU compute environment (Spot, 0..dataMaxVcpus), its queue, the data job role and job definition."""

    def __init__(self, name: str, args: DataPrepArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainstack:data_prep:DataPrep", name, None, opts)
        cfg, child = args.config, pulumi.ResourceOptions(parent=self)
        prefix = f"{cfg.name_prefix}-data"

        self.security_group = https_out_group(
            prefix,
            args.network.vpc.id,
            "CPU data preparation nodes: HTTPS to AWS APIs, S3 and ECR; no ingress",
            child,
        )
        self.launch_template = aws.ec2.LaunchTemplate(
            prefix,
            update_default_version=True,
            metadata_options={
                "http_endpoint": "enabled",
                "http_tokens": "required",  # IMDSv2 only
                # Containers use their job role (the ECS credentials endpoint), never the instance's: one hop.
                "http_put_response_hop_limit": 1,
            },
            block_device_mappings=[
                root_volume(cfg, args.keys.key.arn)
            ],  # a shard's text and tokens are staged on it
            user_data=data_node_user_data(cfg.stop_grace_seconds),
            instance_initiated_shutdown_behavior="terminate",
            tag_specifications=[
                {"resource_type": kind, "tags": cfg.tags}
                for kind in ("instance", "volume", "network-interface")
            ],
            opts=child,
        )
        spot = cfg.data_spot
        self.compute_environment = aws.batch.ComputeEnvironment(
            prefix,
            type="MANAGED",
            state="ENABLED",
            compute_resources={
                "type": "SPOT" if spot else "EC2",
                "allocation_strategy": "SPOT_PRICE_CAPACITY_OPTIMIZED" if spot else "BEST_FIT_PROGRESSIVE",
                "min_vcpus": 0,  # an idle queue runs (and costs) nothing
                "max_vcpus": cfg.data_max_vcpus,
                "instance_types": DATA_INSTANCE_FAMILIES,
                "subnets": [subnet.id for subnet in args.network.private_subnets],
                "security_group_ids": [self.security_group.id],
                "instance_role": args.identity.instance_profile.arn,
                "launch_template": {
                    "launch_template_id": self.launch_template.id,
                    "version": self.launch_template.latest_version.apply(str),
                },
                "ec2_configurations": [{"image_type": DATA_IMAGE_TYPE}],
                "tags": cfg.tags,  # default tags do not reach the instances Batch launches
            },
            opts=child,
        )
        self.job_queue = aws.batch.JobQueue(
            prefix,
            state="ENABLED",
            priority=1,
            compute_environment_orders=[{"order": 1, "compute_environment": self.compute_environment.arn}],
            opts=child,
        )
        self.job_role = self._job_role(prefix, args)
        # A placeholder, as the GPU one's (infra/cluster.py): `make data STACK=` submits to a revision naming the
        # pushed tag, and `make push` registers one (trainer/jobs/submit.py JOB_DEFINITION_OUTPUTS).
        image = placeholder_image(cfg, args.registry)
        self.job_definition = aws.batch.JobDefinition(
            prefix,
            name=template_name(cfg, prefix),
            type="container",
            platform_capabilities=["EC2"],
            propagate_tags=True,
            container_properties=pulumi.Output.json_dumps(
                data_job_container(
                    cfg,
                    image,
                    self.job_role.arn,
                    args.identity.execution_role.arn,
                    args.log_group,
                )
            ),
            retry_strategy=RETRY_ON_HOST_FAILURE,  # a Spot interruption is a host failure: the shard runs again
            timeout={"attempt_duration_seconds": cfg.job_timeout_seconds},
            opts=child,
        )
        self.outputs = {
            "data_job_queue": self.job_queue.name,
            "data_job_definition": self.job_definition.arn,
        }
        self.register_outputs(self.outputs)

    def _job_role(self, prefix: str, args: DataPrepArgs) -> aws.iam.Role:
        """Read the sources and the datasets bucket, write the datasets bucket, use the stack key; nothing else."""
        cfg = args.config
        datasets = args.lake.datasets.arn
        sources = [f"arn:aws:s3:::{bucket}" for bucket in cfg.data_source_buckets]
        statements: list[dict[str, Any]] = [
            allow("ListSourcesAndDatasets", ["s3:ListBucket"], [datasets, *sources]),
            allow(
                "ReadSourcesAndDatasets",
                ["s3:GetObject"],
                [pulumi.Output.concat(datasets, "/*"), *(f"{source}/*" for source in sources)],
            ),
            allow(
                "WriteDatasets",
                ["s3:AbortMultipartUpload", "s3:PutObject"],
                [pulumi.Output.concat(datasets, "/*")],
            ),
            allow(
                "UseStackKey", ["kms:Decrypt", "kms:DescribeKey", "kms:GenerateDataKey"], [args.keys.key.arn]
            ),
        ]
        role = aws.iam.Role(
            f"{prefix}-role",
            assume_role_policy=service_trust_policy("ecs-tasks.amazonaws.com", args.account_id),
            description="Data preparation containers: read the sources, write the datasets bucket",
            opts=pulumi.ResourceOptions(parent=self),
        )
        aws.iam.RolePolicy(
            f"{prefix}-role",
            role=role.id,
            policy=policy_document(*statements),
            opts=pulumi.ResourceOptions(parent=self),
        )
        return role


def data_job_container(
    cfg: StackConfig, image: Any, job_role_arn: Any, execution_role_arn: Any, log_group: Any
) -> dict[str, Any]:
    """The data job's ContainerProperties; the command comes with each submission (trainer/jobs/data.py)."""
    return {
        "image": image,
        "command": ["prepare", "--help"],
        "jobRoleArn": job_role_arn,
        "executionRoleArn": execution_role_arn,
        "resourceRequirements": [
            {"type": "VCPU", "value": str(cfg.data_job_vcpus)},
            {"type": "MEMORY", "value": str(data_job_memory_mib(cfg.data_job_vcpus))},
        ],
        "environment": [{"name": k, "value": v} for k, v in sorted(DATA_JOB_ENVIRONMENT.items())],
        "logConfiguration": {
            "logDriver": "awslogs",
            "options": {
                "awslogs-group": log_group,
                "awslogs-region": cfg.region,
                "awslogs-stream-prefix": "data",
            },
        },
    }
