"""The stack outputs that `make train STACK=<env>` and operators read: the one list of their names."""

from __future__ import annotations

# Every stack exports these (snake_case, the names `pulumi stack output --json` prints).
STACK_OUTPUTS: tuple[str, ...] = (
    "region",
    "job_queue",
    "job_definition",
    "ecr_repository_url",
    "datasets_bucket",
    "checkpoints_bucket",
    "fsx_file_system_id",
    "fsx_dns_name",
    "fsx_mount_name",
    "log_group",
    "kms_key_arn",
    "instance_type",
    "node_count",
    "gpus_per_node",
)

# Exported only when `trainstack:spot` is true: the Spot queue and a single-node job definition for it
# (multi-node parallel jobs cannot run on Spot).
SPOT_OUTPUTS: tuple[str, ...] = ("spot_job_queue", "spot_job_definition")


# Data preparation on CPU (infra/data_prep.py): the queue and job definition `make data STACK=<env>` submits to.
DATA_OUTPUTS: tuple[str, ...] = ("data_job_queue", "data_job_definition")


# Alerting and the dashboard (infra/monitoring.py); not required by the job tools.
MONITORING_OUTPUTS: tuple[str, ...] = ("alarm_topic_arn", "dashboard_name")


# Governance (infra/audit.py, infra/teams.py, docs/security.md): the trail (the stack's own or the organisation's),
# its log bucket when the stack has its own, and the regions data may live in; read by make audit and make train.
GOVERNANCE_OUTPUTS: tuple[str, ...] = ("audit_trail", "audit_bucket", "allowed_regions")
# Only with `trainstack:teams`: the team names (share identifiers), each team's role and GPU quota.
TEAM_OUTPUTS: tuple[str, ...] = ("teams", "team_role_arns", "team_gpu_quotas")


def missing_outputs(outputs: dict[str, object]) -> list[str]:
    """The required output names absent from a `pulumi stack output --json` document, in declaration order."""
    return [name for name in STACK_OUTPUTS if name not in outputs]
