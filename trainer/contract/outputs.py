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


# Alerting and the dashboard (infra/monitoring.py); not required by the job tools.
MONITORING_OUTPUTS: tuple[str, ...] = ("alarm_topic_arn", "dashboard_name")


# Governance (infra/audit.py, infra/teams.py, docs/security.md): the trail (the stack's own or the organisation's),
# its log bucket when the stack has its own, and the regions data may live in; read by make audit and make train.
GOVERNANCE_OUTPUTS: tuple[str, ...] = ("audit_trail", "audit_bucket", "allowed_regions")
# Only with `trainstack:teams`: the team names (share identifiers), each team's role and GPU quota.
TEAM_OUTPUTS: tuple[str, ...] = ("teams", "team_role_arns", "team_gpu_quotas")


# `trainstack:orchestrator`: who runs the jobs. A stack without the output is a Batch stack (exported before EKS).
ORCHESTRATORS: tuple[str, ...] = ("batch", "eks")
# Only a Batch stack has these; an EKS stack submits a JobSet to its LocalQueue instead.
BATCH_OUTPUTS: tuple[str, ...] = ("job_queue", "job_definition")
# An EKS stack exports these beside STACK_OUTPUTS less BATCH_OUTPUTS (docs/eks.md): the cluster the token is for,
# its API endpoint and CA (base64 PEM), the namespace, Kueue LocalQueue and FSx claim the JobSet uses, and the EFA
# devices each pod asks for.
EKS_OUTPUTS: tuple[str, ...] = (
    "orchestrator",
    "eks_cluster_name",
    "eks_cluster_endpoint",
    "eks_cluster_ca",
    "k8s_namespace",
    "kueue_local_queue",
    "fsx_claim",
    "efa_devices_per_node",
)


def orchestrator(outputs: dict[str, object]) -> str:
    """The stack's orchestrator; a bad value is a ValueError naming it and the valid ones."""
    value = outputs.get("orchestrator", "batch")
    if value not in ORCHESTRATORS:
        raise ValueError(f"output orchestrator = {value!r}: expected one of {', '.join(ORCHESTRATORS)}")
    return str(value)


def required_outputs(orchestrator_name: str) -> tuple[str, ...]:
    """The outputs the job tools need from a stack run by `orchestrator_name`."""
    if orchestrator_name == "eks":
        return tuple(n for n in STACK_OUTPUTS if n not in BATCH_OUTPUTS) + EKS_OUTPUTS
    return STACK_OUTPUTS


def missing_outputs(outputs: dict[str, object]) -> list[str]:
    """The required output names absent from a `pulumi stack output --json` document, in declaration order."""
    return [name for name in required_outputs(orchestrator(outputs)) if name not in outputs]
