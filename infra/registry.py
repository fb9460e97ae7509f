"""The trainer image repository: ECR with the stack key, immutable tags, scan on push, the last N images kept."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.config import StackConfig
from infra.keys import Keys


@dataclass
class RegistryArgs:
    config: StackConfig
    keys: Keys


class Registry(pulumi.ComponentResource):
    """Immutable tags: a job names the exact image it ran, and a push can never change a running job's image."""

    def __init__(self, name: str, args: RegistryArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainstack:registry:Registry", name, None, opts)
        cfg = args.config
        self.repository = aws.ecr.Repository(
            f"{cfg.name_prefix}-trainer",
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration={"scan_on_push": True},
            encryption_configurations=[{"encryption_type": "KMS", "kms_key": args.keys.key.arn}],
            opts=pulumi.ResourceOptions(
                parent=self, protect=cfg.protect_data, retain_on_delete=cfg.protect_data
            ),
        )
        keep_last = {
            "rulePriority": 1,
            "description": f"keep the last {cfg.ecr_keep_images} images",
            "selection": {
                "tagStatus": "any",
                "countType": "imageCountMoreThan",
                "countNumber": cfg.ecr_keep_images,
            },
            "action": {"type": "expire"},
        }
        aws.ecr.LifecyclePolicy(
            f"{cfg.name_prefix}-trainer",
            repository=self.repository.name,
            policy=json.dumps({"rules": [keep_last]}),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"repository_url": self.repository.repository_url})
