"""FSx for Lustre in the cluster subnet: the cache in front of the data lake, mounted at /fsx on every GPU node.

`/datasets` links to the datasets bucket (auto-import of new, changed and deleted objects: data is read lazily
from S3 on first access) and `/checkpoints` to the checkpoints bucket (auto-export: a checkpoint written to
/fsx/checkpoints reaches S3 without a copy step). LZ4 compression; persistent file systems use the stack key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pulumi
import pulumi_aws as aws

from infra.config import StackConfig

if TYPE_CHECKING:
    from infra.data_lake import DataLake
    from infra.keys import Keys
    from infra.network import Network

# Lustre clients reach the file servers on TCP 988 (LNET) and 1018-1023.
LUSTRE_PORTS = ((988, 988), (1018, 1023))
LUSTRE_VERSION = "2.15"
ALL_EVENTS = ["NEW", "CHANGED", "DELETED"]


@dataclass
class LustreArgs:
    config: StackConfig
    network: Network
    keys: Keys
    lake: DataLake


class Lustre(pulumi.ComponentResource):
    """The file system, its security group (clients are admitted by the cluster) and two S3 links."""

    def __init__(self, name: str, args: LustreArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainstack:lustre:Lustre", name, None, opts)
        cfg, child = args.config, pulumi.ResourceOptions(parent=self)
        prefix = cfg.name_prefix

        self.security_group = aws.ec2.SecurityGroup(
            f"{prefix}-fsx", vpc_id=args.network.vpc.id, description="FSx for Lustre file servers", opts=child
        )
        # FSx refuses to create a file system whose group does not admit Lustre traffic between its own servers.
        server_rules = [
            rule(
                f"{prefix}-fsx-{direction}-servers-{low}",
                security_group_id=self.security_group.id,
                referenced_security_group_id=self.security_group.id,
                ip_protocol="tcp",
                from_port=low,
                to_port=high,
                description="Lustre between file servers",
                opts=child,
            )
            for low, high in LUSTRE_PORTS
            for direction, rule in (
                ("from", aws.vpc.SecurityGroupIngressRule),
                ("to", aws.vpc.SecurityGroupEgressRule),
            )
        ]

        self.file_system = aws.fsx.LustreFileSystem(
            f"{prefix}-fsx",
            deployment_type=cfg.fsx_deployment_type,
            storage_type="SSD",
            storage_capacity=cfg.fsx_storage_capacity_gib,
            per_unit_storage_throughput=cfg.fsx_throughput,
            kms_key_id=args.keys.key.arn if cfg.fsx_uses_stack_key else None,
            subnet_ids=args.network.cluster_subnet.id,  # pulumi-aws 7 takes the one subnet as a string
            security_group_ids=[self.security_group.id],
            file_system_type_version=LUSTRE_VERSION,
            data_compression_type="LZ4",
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=server_rules,
                protect=cfg.protect_data,
                retain_on_delete=cfg.protect_data,
            ),
        )
        self.datasets = self._link(
            prefix, "datasets", args.lake.datasets, {"auto_import_policy": {"events": ALL_EVENTS}}
        )
        self.checkpoints = self._link(
            prefix, "checkpoints", args.lake.checkpoints, {"auto_export_policy": {"events": ALL_EVENTS}}
        )
        self.register_outputs(
            {
                "file_system_id": self.file_system.id,
                "dns_name": self.file_system.dns_name,
                "mount_name": self.file_system.mount_name,
                "security_group_id": self.security_group.id,
            }
        )

    def _link(
        self,
        prefix: str,
        directory: str,
        bucket: aws.s3.Bucket,
        policy: aws.fsx.DataRepositoryAssociationS3ArgsDict,
    ) -> aws.fsx.DataRepositoryAssociation:
        """`/<directory>` <-> the bucket's root."""
        return aws.fsx.DataRepositoryAssociation(
            f"{prefix}-fsx-{directory}",
            file_system_id=self.file_system.id,
            file_system_path=f"/{directory}",
            data_repository_path=pulumi.Output.concat("s3://", bucket.bucket, "/"),
            # What the bucket already holds appears at creation: a rebuilt file system sees old data and checkpoints.
            batch_import_meta_data_on_create=True,
            s3=policy,
            opts=pulumi.ResourceOptions(parent=self),
        )
