"""A node that fails its preflight takes itself out of service, so that Batch's retry lands on fresh hosts.

The instance asks the instance metadata service (IMDSv2: PUT /latest/api/token, then GET /latest/meta-data/...) for
its id and region. A Batch managed compute environment runs its instances in Auto Scaling groups it creates (AWS
Batch User Guide, "Managed compute environments"); an instance in one is marked Unhealthy, which makes the group
terminate and replace it (EC2 Auto Scaling API SetInstanceHealth; ShouldRespectGracePeriod=False so that a fresh
instance is not spared). An instance outside any group is terminated.
"""

from __future__ import annotations

from trainer.aws.clients import client
from trainer.aws.imds import metadata


def instance_identity(imds: str | None = None, timeout_s: float = 2.0) -> tuple[str, str]:
    """(instance id, region) of this instance, from IMDSv2; raises OSError where there is no IMDS."""
    instance_id, region = metadata("instance-id", "placement/region", endpoint=imds, timeout_s=timeout_s)
    return instance_id, region


def take_out_of_service(instance_id: str, region: str) -> str:
    """Mark the instance Unhealthy in its Auto Scaling group, or terminate it; says which was done."""
    autoscaling = client("autoscaling", region)
    found = autoscaling.describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
    if found:
        autoscaling.set_instance_health(
            InstanceId=instance_id, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False
        )
        return f"{instance_id} marked Unhealthy in Auto Scaling group {found[0]['AutoScalingGroupName']}"
    client("ec2", region).terminate_instances(InstanceIds=[instance_id])
    return f"{instance_id} terminated (in no Auto Scaling group)"
