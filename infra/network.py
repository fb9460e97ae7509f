"""The VPC: private subnets for GPU nodes and FSx, public subnets for NAT, endpoints, and encrypted flow logs.

Per availability zone a private and a public subnet; the first zone's private subnet is the cluster subnet (every GPU
node and the file system, so EFA and Lustre traffic never crosses zones). `natGateways` NAT gateways sit in the
first zones' public subnets; each private route table uses its own zone's NAT when there is one. The S3 gateway
endpoint is always there: dataset and checkpoint traffic, and ECR image layers, never pay NAT processing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pulumi
import pulumi_aws as aws

from infra.config import StackConfig
from infra.iam import allow, policy_document, service_trust_policy

# What the role that publishes flow logs to CloudWatch Logs must allow (Amazon VPC user guide, "IAM role for
# publishing flow logs to CloudWatch Logs"): without CreateLogGroup and DescribeLogGroups delivery can fail.
FLOW_LOGS_DELIVERY_ACTIONS = (
    "logs:CreateLogGroup",
    "logs:CreateLogStream",
    "logs:PutLogEvents",
    "logs:DescribeLogGroups",
    "logs:DescribeLogStreams",
)

if TYPE_CHECKING:
    from infra.keys import Keys


# The default group is what the containers of a multi-node job use: Batch runs them in awsvpc mode, and their network
# interface takes the compute environment's security groups or, with none, the VPC's default group (Batch guide,
# "Compute environment considerations for MNP"); our compute environment may name none, since its launch template
# defines network interfaces. So it admits exactly what those containers need, from and to each other (the
# rendezvous and NCCL's bootstrap over the main node's container address) and HTTPS out (AWS endpoints, S3, ECR).
# Lustre and EFA traffic leave from the host's own interfaces (the EFA group), never from a container's.
TASK_SELF_RULE: aws.ec2.DefaultSecurityGroupIngressArgsDict = {
    "protocol": "-1",
    "from_port": 0,
    "to_port": 0,
    "self": True,
    "description": "Multi-node job containers (awsvpc) to each other",
}
TASK_HTTPS_RULE: aws.ec2.DefaultSecurityGroupEgressArgsDict = {
    "protocol": "tcp",
    "from_port": 443,
    "to_port": 443,
    "cidr_blocks": ["0.0.0.0/0"],
    "description": "Multi-node job containers to AWS endpoints, S3 and ECR",
}


@dataclass
class NetworkArgs:
    config: StackConfig
    account_id: pulumi.Input[str]
    keys: Keys


class Network(pulumi.ComponentResource):
    """VPC, subnets, NAT, S3 gateway and interface endpoints, the job containers' default security group, flow logs."""

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainstack:network:Network", name, None, opts)
        cfg, child = args.config, pulumi.ResourceOptions(parent=self)
        prefix = cfg.name_prefix
        private_cidrs, public_cidrs = cfg.subnet_cidrs

        self.vpc = aws.ec2.Vpc(
            f"{prefix}-vpc",
            cidr_block=cfg.vpc_cidr,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            opts=child,
        )
        self.default_security_group = aws.ec2.DefaultSecurityGroup(
            f"{prefix}-default",
            vpc_id=self.vpc.id,
            ingress=[TASK_SELF_RULE],
            egress=[TASK_SELF_RULE, TASK_HTTPS_RULE],
            opts=child,
        )
        gateway = aws.ec2.InternetGateway(f"{prefix}-igw", vpc_id=self.vpc.id, opts=child)

        public_routes = aws.ec2.RouteTable(
            f"{prefix}-public",
            vpc_id=self.vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": gateway.id}],
            opts=child,
        )
        self.public_subnets, self.private_subnets, private_routes, nat_gateways = [], [], [], []
        for i, zone in enumerate(cfg.availability_zones):
            public = self._subnet(f"{prefix}-public-{zone}", zone, public_cidrs[i], public_routes)
            self.public_subnets.append(public)
            if i < cfg.nat_gateways:
                address = aws.ec2.Eip(f"{prefix}-nat-{zone}", domain="vpc", opts=child)
                nat_gateways.append(
                    aws.ec2.NatGateway(
                        f"{prefix}-nat-{zone}",
                        subnet_id=public.id,
                        allocation_id=address.id,
                        opts=pulumi.ResourceOptions(parent=self, depends_on=[gateway]),
                    )
                )

        for i, zone in enumerate(cfg.availability_zones):
            nat = nat_gateways[i] if i < len(nat_gateways) else nat_gateways[0]
            routes = aws.ec2.RouteTable(
                f"{prefix}-private-{zone}",
                vpc_id=self.vpc.id,
                routes=[{"cidr_block": "0.0.0.0/0", "nat_gateway_id": nat.id}],
                opts=child,
            )
            self.private_subnets.append(
                self._subnet(f"{prefix}-private-{zone}", zone, private_cidrs[i], routes)
            )
            private_routes.append(routes)
        self.cluster_subnet = self.private_subnets[0]

        self.s3_endpoint = aws.ec2.VpcEndpoint(
            f"{prefix}-s3",
            vpc_id=self.vpc.id,
            service_name=f"com.amazonaws.{cfg.region}.s3",
            vpc_endpoint_type="Gateway",
            route_table_ids=[r.id for r in private_routes],
            opts=child,
        )
        self._interface_endpoints(cfg, child)
        self._flow_logs(cfg, args, child)

        self.register_outputs(
            {
                "vpc_id": self.vpc.id,
                "cluster_subnet_id": self.cluster_subnet.id,
                "private_subnet_ids": [s.id for s in self.private_subnets],
            }
        )

    def _subnet(self, name: str, zone: str, cidr: str, routes: aws.ec2.RouteTable) -> aws.ec2.Subnet:
        subnet = aws.ec2.Subnet(
            name,
            vpc_id=self.vpc.id,
            cidr_block=cidr,
            availability_zone=zone,
            map_public_ip_on_launch=False,  # nothing here gets a public IP; NAT gateways have their own
            opts=pulumi.ResourceOptions(parent=self),
        )
        aws.ec2.RouteTableAssociation(
            name, subnet_id=subnet.id, route_table_id=routes.id, opts=pulumi.ResourceOptions(parent=self)
        )
        return subnet

    def _interface_endpoints(self, cfg: StackConfig, child: pulumi.ResourceOptions) -> None:
        if not cfg.interface_endpoints:
            return
        group = aws.ec2.SecurityGroup(
            f"{cfg.name_prefix}-endpoints",
            vpc_id=self.vpc.id,
            description="HTTPS from the VPC to AWS endpoints",
            opts=child,
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{cfg.name_prefix}-endpoints-https",
            security_group_id=group.id,
            ip_protocol="tcp",
            from_port=443,
            to_port=443,
            cidr_ipv4=cfg.vpc_cidr,
            description="HTTPS from inside the VPC",
            opts=child,
        )
        for service in cfg.interface_endpoints:
            aws.ec2.VpcEndpoint(
                f"{cfg.name_prefix}-{service.replace('.', '-')}",
                vpc_id=self.vpc.id,
                service_name=f"com.amazonaws.{cfg.region}.{service}",
                vpc_endpoint_type="Interface",
                private_dns_enabled=True,
                subnet_ids=[s.id for s in self.private_subnets],
                security_group_ids=[group.id],
                opts=child,
            )

    def _flow_logs(self, cfg: StackConfig, args: NetworkArgs, child: pulumi.ResourceOptions) -> None:
        log_group = aws.cloudwatch.LogGroup(
            f"{cfg.name_prefix}-flow-logs",
            name=f"{cfg.log_group_prefix}/vpc-flow-logs",
            retention_in_days=cfg.log_retention_days,
            kms_key_id=args.keys.key.arn,
            opts=child,
        )
        role = aws.iam.Role(
            f"{cfg.name_prefix}-flow-logs",
            assume_role_policy=service_trust_policy("vpc-flow-logs.amazonaws.com", args.account_id),
            opts=child,
        )
        # DescribeLogGroups lists the account's groups: it names no one group (Service Authorization Reference,
        # Amazon CloudWatch Logs), so it gets the region's log groups rather than the stack's one.
        account_log_groups = pulumi.Output.concat(
            "arn:aws:logs:", cfg.region, ":", args.account_id, ":log-group:*"
        )
        aws.iam.RolePolicy(
            f"{cfg.name_prefix}-flow-logs",
            role=role.id,
            policy=policy_document(
                allow(
                    "WriteFlowLogs",
                    [a for a in FLOW_LOGS_DELIVERY_ACTIONS if a != "logs:DescribeLogGroups"],
                    [log_group.arn, pulumi.Output.concat(log_group.arn, ":*")],
                ),
                allow("FindFlowLogGroup", ["logs:DescribeLogGroups"], [account_log_groups]),
            ),
            opts=child,
        )
        aws.ec2.FlowLog(
            f"{cfg.name_prefix}-vpc",
            vpc_id=self.vpc.id,
            traffic_type="ALL",
            log_destination_type="cloud-watch-logs",
            log_destination=log_group.arn,
            iam_role_arn=role.arn,
            opts=child,
        )


def https_out_group(
    name: str, vpc_id: pulumi.Input[str], description: str, opts: pulumi.ResourceOptions
) -> aws.ec2.SecurityGroup:
    """A security group with no ingress and HTTPS out (AWS APIs, ECR, S3 through the gateway endpoint): what the
    stack's non-EFA compute (data preparation nodes, the SageMaker endpoint's instances) uses."""
    group = aws.ec2.SecurityGroup(name, vpc_id=vpc_id, description=description, opts=opts)
    aws.vpc.SecurityGroupEgressRule(
        f"{name}-https",
        security_group_id=group.id,
        cidr_ipv4="0.0.0.0/0",
        ip_protocol="tcp",
        from_port=443,
        to_port=443,
        description="AWS APIs, ECR, S3 (through the gateway endpoint)",
        opts=opts,
    )
    return group
