"""Launch templates: IMDSv2 only, no public IP when a node has several network interfaces (EFA nodes do), and no
subnet on a network interface: the compute environment (or node group) places the nodes.

- Batch ignores a launch template's network interface subnets and uses the compute environment's (Batch user guide,
  "Use Amazon EC2 launch templates with AWS Batch"); EKS managed node groups fail to deploy from a launch template
  that includes SubnetId (EKS API reference, LaunchTemplateSpecification).
"""

from __future__ import annotations

from pulumi_policy import ReportViolation, ResourceValidationArgs, ResourceValidationPolicy

from policy import aws_types


def validate_imdsv2(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type != aws_types.LAUNCH_TEMPLATE:
        return
    metadata = args.props.get("metadataOptions") or {}
    if metadata.get("httpEndpoint") == "disabled":
        return  # no metadata service at all
    if metadata.get("httpTokens") != "required":
        report_violation(
            f"Launch template '{args.name}' lets instances use IMDSv1 (no session token), which a server-side "
            "request forgery can reach: set metadata_options={'http_tokens': 'required', "
            "'http_put_response_hop_limit': 1}.",
            None,
        )


def validate_no_public_ip(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type != aws_types.LAUNCH_TEMPLATE:
        return
    interfaces = args.props.get("networkInterfaces") or []
    if len(interfaces) < 2:
        return
    public = [
        str(n) for n, i in enumerate(interfaces) if str(i.get("associatePublicIpAddress")).lower() == "true"
    ]
    if public:
        report_violation(
            f"Launch template '{args.name}' has {len(interfaces)} network interfaces and asks for a public IP on "
            f"interface(s) {', '.join(public)}; EC2 refuses to launch that: set associate_public_ip_address='false' and reach "
            "the nodes through NAT and SSM.",
            None,
        )


def validate_no_interface_subnet(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type != aws_types.LAUNCH_TEMPLATE:
        return
    named = [str(n) for n, i in enumerate(args.props.get("networkInterfaces") or []) if i.get("subnetId")]
    if named:
        report_violation(
            f"Launch template '{args.name}' names a subnet on network interface(s) {', '.join(named)}: Batch ignores "
            "it and uses the compute environment's subnets, and EKS node groups refuse the template. Remove "
            "subnet_id from network_interfaces; set subnets on the compute environment (infra/cluster.py).",
            None,
        )


imdsv2_required = ResourceValidationPolicy(
    name="imdsv2-required",
    description="Launch templates require IMDSv2 (http_tokens='required').",
    validate=validate_imdsv2,
)

no_public_ip_with_several_interfaces = ResourceValidationPolicy(
    name="no-public-ip-with-several-interfaces",
    description="Launch templates with several network interfaces (EFA nodes) assign no public IP.",
    validate=validate_no_public_ip,
)

no_interface_subnet = ResourceValidationPolicy(
    name="launch-template-interfaces-name-no-subnet",
    description=(
        "Launch templates leave subnets to the compute environment: no network interface names a subnet (Batch user "
        'guide, "Use Amazon EC2 launch templates with AWS Batch"; EKS API reference, LaunchTemplateSpecification).'
    ),
    validate=validate_no_interface_subnet,
)
