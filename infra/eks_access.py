"""Who administers an EKS stack's cluster: the admins' access entries, and the deployer checked to be one of them.

The cluster is created without admin for its creator (`bootstrapClusterCreatorAdminPermissions: false`), so the
Kubernetes provider that installs the charts and objects (infra/cluster_software.py) acts with whatever the deployer's
access entry grants: only `eksAdminArns` get one. Two things follow, both kept here:

- the provider depends on every admin access entry and its policy association, so that `pulumi up` creates them
  before the first Kubernetes call and `pulumi destroy` deletes them only after the last object and release (Pulumi
  deletes in reverse dependency order; a resource depends on its provider). Without it a destroy may delete the
  association in parallel with the releases, whose deletes then get 401/403;
- the provider's credential is the deployer's, through `aws eks get-token` (`kubeconfig`);
- the deployer (STS GetCallerIdentity of the stack's AWS provider) must be one of `eksAdminArns`, or every
  Kubernetes call fails after the AWS half of the stack was built: refused before any resource is created.
"""

from __future__ import annotations

import json
import re

import pulumi
import pulumi_aws as aws

from infra.config import StackConfig

# Cluster-wide admin through an access entry (EKS user guide, "Associate access policies with access entries").
CLUSTER_ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
# A role session's ARN (IAM User Guide, "IAM identifiers": arn:aws:sts::account:assumed-role/role-name/session-name;
# the role's path is not part of it).
ASSUMED_ROLE = re.compile(
    r"arn:(?P<partition>[\w-]+):sts::(?P<account>\d{12}):assumed-role/(?P<role>[^/]+)/.+"
)
ROLE = re.compile(r"arn:(?P<partition>[\w-]+):iam::(?P<account>\d{12}):role/(?:.*/)?(?P<role>[^/]+)")


class DeployerNotAdmin(pulumi.RunError):
    """The deployer has no access entry: every Kubernetes resource of the stack would be refused."""


def is_admin(caller_arn: str, admin_arns: list[str]) -> bool:
    """Whether the caller (an IAM user, or a session of an IAM role) is one of the admins (IAM ARNs)."""
    if caller_arn in admin_arns:  # an IAM user calls as itself
        return True
    session = ASSUMED_ROLE.fullmatch(caller_arn)
    if session is None:
        return False
    roles = [m for m in (ROLE.fullmatch(arn) for arn in admin_arns) if m is not None]
    return any(
        (m["partition"], m["account"], m["role"])
        == (session["partition"], session["account"], session["role"])
        for m in roles
    )


def deployer_problem(caller_arn: str, admin_arns: list[str]) -> str | None:
    """Why the deployer could not install the cluster's software, or None."""
    if is_admin(caller_arn, admin_arns):
        return None
    return (
        f"trainstack:eksAdminArns = {admin_arns!r}: the deployer {caller_arn} is not among them, so the Kubernetes "
        "provider (which acts as the deployer; the cluster gives its creator no admin) would be refused on every "
        "object; add the deployer's IAM role or user ARN to trainstack:eksAdminArns in Pulumi.<stack>.yaml, or "
        "deploy as one of the admins"
    )


def checked_deployer(caller_arn: str, admin_arns: list[str]) -> str:
    if problem := deployer_problem(caller_arn, admin_arns):
        raise DeployerNotAdmin(problem)
    return caller_arn


def admin_access(
    cfg: StackConfig, cluster: aws.eks.Cluster, parent: pulumi.Resource
) -> list[pulumi.Resource]:
    """Per admin an access entry and its cluster-admin association; the list is what the provider depends on."""
    child = pulumi.ResourceOptions(parent=parent)
    access: list[pulumi.Resource] = []
    for index, arn in enumerate(cfg.eks_admin_arns):
        entry = aws.eks.AccessEntry(
            f"{cfg.name_prefix}-eks-admin-{index}",
            cluster_name=cluster.name,
            principal_arn=arn,
            type="STANDARD",
            opts=child,
        )
        association = aws.eks.AccessPolicyAssociation(
            f"{cfg.name_prefix}-eks-admin-{index}",
            cluster_name=cluster.name,
            principal_arn=entry.principal_arn,
            policy_arn=CLUSTER_ADMIN_POLICY,
            access_scope={"type": "cluster"},
            opts=child,
        )
        access += [entry, association]
    return access


def deployer(cfg: StackConfig, parent: pulumi.Resource) -> pulumi.Output[str]:
    """The deployer's ARN once checked to be an admin (the stack's AWS provider's caller)."""
    caller = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=parent))
    return caller.arn.apply(lambda arn: checked_deployer(arn, list(cfg.eks_admin_arns)))


def kubeconfig(region: str, cluster_name: str, endpoint: str, ca_data: str) -> str:
    """The kubeconfig Pulumi's Kubernetes provider applies the releases with: `aws eks get-token` as the credential
    plugin, as `aws eks update-kubeconfig` writes it (aws/aws-cli awscli/customizations/eks/update_kubeconfig.py)."""
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "aws",
            "args": [
                "--region",
                region,
                "eks",
                "get-token",
                "--cluster-name",
                cluster_name,
                "--output",
                "json",
            ],
        }
    }
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": cluster_name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}
            ],
            "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
            "current-context": cluster_name,
            "users": [{"name": cluster_name, "user": user}],
        }
    )
