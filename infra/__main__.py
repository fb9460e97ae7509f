"""trainstack: one environment's infrastructure, composed like the architecture diagram (see docs/infra.md)."""

import sys
from pathlib import Path
from typing import Any

# Pulumi runs this directory as a script; import the program as the package `infra` (it also uses `trainer`).
ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "infra")]

import pulumi  # noqa: E402
import pulumi_aws as aws  # noqa: E402

from infra.audit import Audit, AuditArgs  # noqa: E402
from infra.budget import Budget, BudgetArgs  # noqa: E402
from infra.cluster import Cluster, ClusterArgs  # noqa: E402
from infra.cluster_software import ClusterSoftware, ClusterSoftwareArgs  # noqa: E402
from infra.config import pulumi_stack_config  # noqa: E402
from infra.data_lake import DataLake, DataLakeArgs  # noqa: E402
from infra.data_prep import DataPrep, DataPrepArgs  # noqa: E402
from infra.eks import Eks, EksArgs  # noqa: E402
from infra.eks_teams import EksTeams, EksTeamsArgs  # noqa: E402
from infra.identity import Identity, IdentityArgs  # noqa: E402
from infra.keys import Keys, KeysArgs  # noqa: E402
from infra.lustre import Lustre, LustreArgs  # noqa: E402
from infra.monitoring import Monitoring, MonitoringArgs  # noqa: E402
from infra.network import Network, NetworkArgs  # noqa: E402
from infra.registry import Registry, RegistryArgs  # noqa: E402
from infra.serving import Serving, ServingArgs  # noqa: E402
from infra.teams import Teams, TeamsArgs  # noqa: E402

cfg = pulumi_stack_config()  # validated before any resource is registered
aws_provider = aws.Provider(
    "aws", region=cfg.region, profile=cfg.aws_profile, default_tags={"tags": cfg.tags}
)
opts = pulumi.ResourceOptions(providers=[aws_provider])
account_id = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(provider=aws_provider)).account_id

keys = Keys("keys", KeysArgs(cfg, account_id), opts)
network = Network("network", NetworkArgs(cfg, account_id, keys), opts)
lake = DataLake("data-lake", DataLakeArgs(cfg, keys), opts)
registry = Registry("registry", RegistryArgs(cfg, keys), opts)
identity = Identity("identity", IdentityArgs(cfg, account_id, keys, lake, registry), opts)
lustre = Lustre("lustre", LustreArgs(cfg, network, keys, lake), opts)
teams = Teams(
    "teams", TeamsArgs(cfg, account_id, keys, lake, identity, registry), opts
)  # none: single-tenant, as before
cluster: Cluster | Eks
orchestration: dict[str, Any]
if cfg.orchestrator == "eks":  # JobSet + Kueue on EKS (docs/eks.md)
    cluster = Eks("eks", EksArgs(cfg, account_id, network, keys, lustre), opts)
    software = ClusterSoftware("cluster-software", ClusterSoftwareArgs(cfg, cluster, lustre), opts)
    orchestration = {**cluster.outputs, **software.outputs}
    if cfg.teams:  # a namespace, queue, RBAC and pod identity per team (docs/eks.md#teams)
        eks_teams = EksTeams(
            "eks-teams", EksTeamsArgs(cfg, cluster, software, keys, lake, lustre, teams.roles), opts
        )
        orchestration.update(eks_teams.outputs)
else:
    cluster = Cluster(
        "cluster", ClusterArgs(cfg, network, keys, lustre, identity, registry, teams.scheduling_policy), opts
    )
    orchestration = cluster.outputs
data_prep = DataPrep(
    "data-prep",
    DataPrepArgs(
        cfg,
        account_id,
        network,
        keys,
        lake,
        identity,
        registry,
        cluster.log_groups["application"].name if isinstance(cluster, Eks) else cluster.log_group.name,
    ),
    opts,
)
monitoring = Monitoring("monitoring", MonitoringArgs(cfg, account_id, keys, lustre, cluster), opts)
audit = Audit("audit", AuditArgs(cfg, account_id, keys, lake, monitoring), opts)
budget = Budget("budget", BudgetArgs(cfg, monitoring), opts)  # the month's tagged cost, to the alarm topic
# The inference pool (trainstack:serving): role, security group and rollback alarms; make deploy owns the endpoint.
serving = (
    Serving("serving", ServingArgs(cfg, account_id, network, keys, lake, monitoring), opts)
    if cfg.serving is not None
    else None
)

outputs = {  # the names trainer/contract/outputs.py lists
    "region": cfg.region,
    "ecr_repository_url": registry.repository.repository_url,
    "datasets_bucket": lake.datasets.bucket,
    "checkpoints_bucket": lake.checkpoints.bucket,
    "fsx_file_system_id": lustre.file_system.id,
    "fsx_dns_name": lustre.file_system.dns_name,
    "fsx_mount_name": lustre.file_system.mount_name,
    "kms_key_arn": keys.key.arn,
    "instance_type": cfg.instance_type,
    "node_count": cfg.node_count,
    "gpus_per_node": cfg.instance.gpus,
    "orchestrator": cfg.orchestrator,
    # Batch: job_queue, job_definition, log_group (+ the spot queue and definition); EKS: eks_cluster_name, ...
    **orchestration,
    **monitoring.outputs,  # alarm_topic_arn, dashboard_name
    **data_prep.outputs,  # data_job_queue, data_job_definition
    **audit.outputs,  # audit_trail (+ audit_bucket when the stack has its own trail)
    **teams.outputs,  # teams, team_role_arns (only with trainstack:teams)
    **(serving.outputs if serving is not None else {}),  # serving_* (only with trainstack:serving)
    "allowed_regions": cfg.data_regions,
}
for name, value in outputs.items():
    pulumi.export(name, value)
