"""Resources that hold data are protected in a prod stack: `pulumi destroy` or a replacing change cannot delete them.

"Protected or retained on delete" is judged as `protect`, the one of the two a policy can see: the analyzer
protocol (pulumi-policy 1.21, `PolicyResourceOptions`) carries `protect` but not `retainOnDelete`. A policy that
accepted retain-on-delete alone would pass offline and fail for real. infra/ sets both (`protectData: true`),
so a deliberate destroy of prod, after `pulumi state unprotect`, still leaves the data in the account.
"""

from __future__ import annotations

from pulumi_policy import ReportViolation, ResourceValidationArgs, ResourceValidationPolicy

from policy import aws_types

PROD_STACKS = frozenset({"prod"})
DATA_RESOURCES = {
    **dict.fromkeys(aws_types.BUCKETS, "S3 bucket"),
    aws_types.LUSTRE_FILE_SYSTEM: "FSx for Lustre file system",
    aws_types.KMS_KEY: "KMS key",  # losing it loses everything it encrypts
    aws_types.REPOSITORY: "ECR repository",
    aws_types.EBS_VOLUME: "EBS volume",
    aws_types.EFS_FILE_SYSTEM: "EFS file system",
}


def stack_of(urn: str) -> str:
    """`urn:pulumi:<stack>::<project>::<type>::<name>` -> `<stack>`."""
    return urn.split("::", 1)[0].removeprefix("urn:pulumi:")


def validate_prod_data_protected(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type not in DATA_RESOURCES or stack_of(args.urn) not in PROD_STACKS:
        return
    if not args.opts.protect:
        report_violation(
            f"{DATA_RESOURCES[args.resource_type]} '{args.name}' holds data in stack {stack_of(args.urn)} but "
            "is not protected: pass opts=pulumi.ResourceOptions(protect=True, retain_on_delete=True) "
            "(infra/ does this for every data resource with trainstack:protectData: true).",
            None,
        )


prod_data_protected = ResourceValidationPolicy(
    name="prod-data-protected",
    description=(
        "In the prod stack, buckets, file systems, volumes, repositories and KMS keys are protected from "
        "deletion (protect=True; retain_on_delete=True too, which analyzers cannot see)."
    ),
    validate=validate_prod_data_protected,
)
