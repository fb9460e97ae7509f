"""The pack's contents: its name, its default enforcement level and every policy, in the order docs/policy.md lists.

Kept apart from `policy/__main__.py`, which serves the pack: constructing `PolicyPack` starts a gRPC server and
blocks, so tests and the offline runner import the policies from here.
"""

from pulumi_policy import EnforcementLevel, Policy

from policy import (
    audit,
    aws_rules,
    cost,
    eks,
    encryption,
    iam,
    kueue,
    launch_templates,
    monitoring,
    network,
    protection,
    rbac,
    residency,
    s3,
    serving,
)

PACK_NAME = "trainstack-guardrails"
# Every policy blocks a deployment unless the pack's config (pulumi up --policy-pack-config) says otherwise.
ENFORCEMENT_LEVEL = EnforcementLevel.MANDATORY

POLICIES: list[Policy] = [
    encryption.encryption_at_rest,
    s3.bucket_encryption,
    s3.public_access_blocked,
    s3.tls_only,
    s3.versioning,
    network.efa_self_traffic,
    launch_templates.no_public_ip_with_several_interfaces,
    launch_templates.no_interface_subnet,
    network.no_internet_ingress,
    launch_templates.imdsv2_required,
    iam.no_wildcard_action,
    iam.no_wildcard_resource,
    encryption.key_rotation,
    network.s3_gateway_endpoint,
    protection.prod_data_protected,
    # AWS's own cross-resource rules (policy/aws_rules.py), each citing the document or API error it encodes.
    aws_rules.security_groups_one_place,
    aws_rules.mnp_default_group,
    aws_rules.user_data_mime,
    aws_rules.at_most_five_groups,
    aws_rules.efa_placement,
    aws_rules.mnp_on_demand,
    aws_rules.efa_only_not_primary,
    aws_rules.lustre_both_ways,
    aws_rules.job_timeout,
    aws_rules.stop_timeout,
    aws_rules.create_grant_for_services,
    monitoring.alarm_has_action,
    monitoring.topic_encrypted,
    monitoring.fsx_free_capacity_period,
    residency.data_residency,
    audit.audit_trail_recorded,
    audit.cloudtrail_key_policy,
    audit.locked_logs_kept,
    audit.cis_metric_filters,
    audit.config_recording,
    audit.cis_alarms_heard,
    cost.cost_allocation_tags,
    cost.cost_tags_activated_later,
    # EKS stacks (policy/eks.py): catalog, launch template, Kueue quota and JobSet agree; grace; fixed versions.
    eks.efa_agree,
    eks.node_templates,
    eks.jobset_grace,
    eks.fixed_versions,
    eks.capacity_block_groups,
    eks.grants_before_use,
    eks.audit_logs,
    # EKS teams and queues: RBAC as the API server decides it (policy/rbac.py), Kueue's semantics (policy/kueue.py).
    rbac.team_rbac,
    kueue.queues_whole_nodes,
    kueue.pods_ready,
    # The inference pool (policy/serving.py): encryption, VPC placement and rollback alarms on every endpoint.
    serving.endpoint_guarded,
    serving.serving_rollback_alarms,
    serving.serving_canary_fits,
]
