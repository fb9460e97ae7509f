"""The stack outputs that `make train STACK=<env>` and operators read: the one list of their names."""

from __future__ import annotations

# Every stack exports these (snake_case, the names `pulumi stack output --json` prints), except that an EKS stack
# exports EKS_OUTPUTS in place of BATCH_OUTPUTS (below); `orchestrator` says which.
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
# Only EKS stacks export this (infra/eks.py; a Batch stack's job definitions carry it instead): what its GPU nodes are
# bought as (infra/cluster.py main_purchase_option), which a JobSet's pods hand their ledgers (trainer/jobs/jobset.py).
# A stack from before the output prices at On-Demand, as the ledger does when nothing is said.
PURCHASE_OPTION_OUTPUT = "purchase_option"
EKS_PRICING_OUTPUTS: tuple[str, ...] = (PURCHASE_OPTION_OUTPUT,)
# And on an EKS stack with teams: each team's namespace (infra/eks_teams.py), where its JobSets go.
EKS_TEAM_OUTPUTS: tuple[str, ...] = ("team_namespaces",)


# Only with `trainstack:serving` (infra/serving.py, docs/serving-stack.md): what `make deploy` reads to create and
# update the endpoint it owns, and the rollback alarms Pulumi owns.
SERVING_OUTPUTS: tuple[str, ...] = (
    "serving_endpoint",
    "serving_role_arn",
    "serving_security_group",
    "serving_subnets",
    "serving_image",
    "serving_instance_type",
    "serving_min_instances",
    "serving_max_instances",
    "serving_invocations_per_instance",
    "serving_canary_percent",
    "serving_bake_minutes",
    "serving_alarms",
)


# Which orchestrator runs the stack's jobs (`trainstack:orchestrator`); every stack exports it. A stack from before
# the switch has no such output and is a Batch stack.
ORCHESTRATOR_OUTPUT = "orchestrator"
ORCHESTRATORS: tuple[str, ...] = ("batch", "eks")
# Only AWS Batch stacks export these: the queue and the multi-node job definition.
BATCH_OUTPUTS: tuple[str, ...] = ("job_queue", "job_definition")
# Only EKS stacks export these (infra/eks.py, docs/eks.md): how to reach the API server (the CA as base64 PEM, as
# DescribeCluster returns it), where jobs go (namespace, Kueue LocalQueue, the FSx claim) and the EFA devices a pod
# asks for per node.
EKS_OUTPUTS: tuple[str, ...] = (
    "eks_cluster_name",
    "eks_cluster_endpoint",
    "eks_cluster_ca",
    "k8s_namespace",
    "kueue_local_queue",
    "fsx_claim",
    "efa_devices_per_node",
)


def orchestrator(outputs: dict[str, object]) -> str:
    """The stack's orchestrator from its outputs: `batch` when the stack predates the output."""
    value = str(outputs.get(ORCHESTRATOR_OUTPUT, "batch"))
    if value not in ORCHESTRATORS:
        raise ValueError(
            f"stack output {ORCHESTRATOR_OUTPUT} = {value!r}: expected one of {', '.join(ORCHESTRATORS)}"
        )
    return value


def required_outputs(outputs: dict[str, object]) -> tuple[str, ...]:
    """The outputs a stack of this orchestrator must export, in declaration order (Batch: STACK_OUTPUTS)."""
    if orchestrator(outputs) == "batch":
        return STACK_OUTPUTS
    return (*(name for name in STACK_OUTPUTS if name not in BATCH_OUTPUTS), *EKS_OUTPUTS)


def missing_outputs(outputs: dict[str, object]) -> list[str]:
    """The required output names absent from a `pulumi stack output --json` document, in declaration order; which
    are required depends on the stack's `orchestrator` output (Batch when absent)."""
    return [name for name in required_outputs(outputs) if name not in outputs]
