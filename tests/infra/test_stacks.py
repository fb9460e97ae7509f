"""What every checked-in stack (dev, staging, prod, eks-dev) plans, asserted on the inputs the Pulumi engine would
receive; what only the Batch path creates is asserted on the Batch stacks (`batch_stack`), the EKS path in test_eks.py."""

from __future__ import annotations

import base64
import json
import re

import pytest

from infra.iam import WILDCARD_RESOURCE_ACTIONS
from trainer.contract.catalog import instance_type
from trainer.contract.container import CHECKPOINTS_DIR, DEFAULT_COMMAND
from trainer.contract.image import efa_environment, image_pins
from trainer.contract.outputs import (
    BATCH_OUTPUTS,
    DATA_OUTPUTS,
    EKS_OUTPUTS,
    EKS_PRICING_OUTPUTS,
    EKS_TEAM_OUTPUTS,
    GOVERNANCE_OUTPUTS,
    MONITORING_OUTPUTS,
    SERVING_OUTPUTS,
    SPOT_OUTPUTS,
    STACK_OUTPUTS,
    TEAM_OUTPUTS,
    missing_outputs,
)

# --- EFA: launch template, security group, devices ------------------------------------------------------------


def test_launch_template_has_one_efa_interface_per_catalog_efa_card(batch_stack):
    interfaces = batch_stack.launch_template.inputs["networkInterfaces"]
    efa = [i for i in interfaces if i["interfaceType"] in ("efa", "efa-only")]
    assert len(efa) == len(interfaces) == batch_stack.config.instance.efa_interfaces
    assert sorted(i["networkCardIndex"] for i in interfaces) == list(
        range(batch_stack.config.instance.efa_interfaces)
    )


def test_primary_interface_is_efa_on_card_0_and_every_other_card_is_efa_only(batch_stack):
    primary, *others = sorted(
        batch_stack.launch_template.inputs["networkInterfaces"], key=lambda i: i["networkCardIndex"]
    )
    assert (primary["networkCardIndex"], primary["deviceIndex"], primary["interfaceType"]) == (0, 0, "efa")
    assert all(i["interfaceType"] == "efa-only" and i["deviceIndex"] == 0 for i in others)


def test_p5_launch_template_has_32_efa_interfaces(prod):
    assert prod.config.instance_type == "p5.48xlarge"
    assert len(prod.launch_template.inputs["networkInterfaces"]) == 32


def test_p4d_launch_template_has_4_efa_interfaces(dev):
    assert dev.config.instance_type == "p4d.24xlarge"
    assert len(dev.launch_template.inputs["networkInterfaces"]) == 4


def test_every_efa_interface_has_the_efa_group_no_subnet_and_no_public_ip(batch_stack):
    # The compute environment's subnets place the nodes; Batch ignores a template interface's subnet.
    cluster_subnet = batch_stack.one("ec2.Subnet", f"-private-{batch_stack.config.cluster_availability_zone}")
    for environment in batch_stack.all("batch.ComputeEnvironment"):
        if environment.name.endswith("-data"):
            continue  # CPU nodes without EFA, in every zone (tests/infra/test_data_prep.py)
        assert environment.inputs["computeResources"]["subnets"] == [cluster_subnet.id]
    for interface in batch_stack.launch_template.inputs["networkInterfaces"]:
        assert "subnetId" not in interface
        assert interface["securityGroups"] == [batch_stack.efa_group.id]
        assert interface.get("associatePublicIpAddress", "false") == "false"
    assert batch_stack.launch_template.inputs["networkInterfaces"][0]["associatePublicIpAddress"] == "false"


def test_efa_group_allows_all_traffic_from_itself_and_to_itself(stack):
    group = stack.efa_group.id
    own = lambda rules: [r.inputs for r in rules if r.inputs["securityGroupId"] == group]  # noqa: E731
    ingress, egress = (
        own(stack.all("vpc.SecurityGroupIngressRule")),
        own(stack.all("vpc.SecurityGroupEgressRule")),
    )
    assert {"ipProtocol": "-1", "referencedSecurityGroupId": group} in [
        {k: r[k] for k in ("ipProtocol", "referencedSecurityGroupId") if k in r} for r in ingress
    ]
    assert any(r["ipProtocol"] == "-1" and r.get("referencedSecurityGroupId") == group for r in egress)
    # The only egress beyond the group itself: HTTPS to AWS endpoints and Lustre to the file system.
    assert {(r["ipProtocol"], r.get("fromPort"), r.get("toPort")) for r in egress} == {
        ("-1", None, None),
        ("tcp", 443, 443),
        ("tcp", 988, 988),
        ("tcp", 1018, 1023),
    }


def test_no_security_group_admits_the_internet(stack):
    rules = [r.inputs for r in stack.all("vpc.SecurityGroupIngressRule")]
    assert rules, "the stack has ingress rules to check"
    assert not [r for r in rules if r.get("cidrIpv4") == "0.0.0.0/0" or r.get("cidrIpv6") == "::/0"]
    assert not [g.name for g in stack.all("ec2.SecurityGroup") if g.inputs.get("ingress")]
    # The default group (the job containers' group) admits only itself.
    assert [
        {k: r[k] for k in ("protocol", "self")}
        for r in stack.one("ec2.DefaultSecurityGroup").inputs["ingress"]
    ] == [{"protocol": "-1", "self": True}]


def test_job_definition_passes_one_uverbs_device_per_efa_interface(batch_stack):
    devices = batch_stack.node_container["linuxParameters"]["devices"]
    assert [d["hostPath"] for d in devices] == batch_stack.config.instance.uverbs_devices
    assert len(devices) == batch_stack.config.instance.efa_interfaces
    assert all(
        d["containerPath"] == d["hostPath"] and set(d["permissions"]) == {"READ", "WRITE", "MKNOD"}
        for d in devices
    )


def test_job_definition_sizes_each_node_from_the_catalog_with_memory_headroom(batch_stack):
    instance = batch_stack.config.instance
    needs = {r["type"]: int(r["value"]) for r in batch_stack.node_container["resourceRequirements"]}
    assert needs["VCPU"] == instance.vcpus and needs["GPU"] == instance.gpus
    total = instance.memory_gib * 1024
    assert 0.05 <= (total - needs["MEMORY"]) / total < 0.051  # left for the kernel, docker and the ECS agent
    assert batch_stack.node_container["instanceType"] == batch_stack.config.instance_type


def test_job_definition_runs_every_node_of_the_stack(batch_stack):

    job = batch_stack.one("batch.JobDefinition", "-train").inputs
    nodes = json.loads(job["nodeProperties"])
    assert (job["type"], nodes["numNodes"], nodes["mainNode"]) == (
        "multinode",
        batch_stack.config.node_count,
        0,
    )
    assert [r["targetNodes"] for r in nodes["nodeRangeProperties"]] == ["0:"]


def test_a_definition_that_names_the_placeholder_image_is_named_a_template_and_one_with_an_image_is_not(
    batch_stack, variant
):
    """Issue 46 item 9: `:latest` is never pushed to the IMMUTABLE repository, so a definition naming it cannot run;
    its name says it is a template the verbs re-point. With `trainstack:image` it runs and takes Pulumi's name."""
    repository = batch_stack.one("ecr.Repository").outputs["repositoryUrl"]
    definitions = batch_stack.all("batch.JobDefinition")
    assert {d.name.rsplit("-", 1)[-1] for d in definitions} >= {"train", "data"}
    for definition in definitions:
        properties = definition.inputs.get("nodeProperties") or definition.inputs["containerProperties"]
        assert f'"{repository}:latest"' in properties
        assert definition.inputs["name"] == f"{definition.name}-template"
        assert definition.outputs["arn"].endswith(f":job-definition/{definition.name}-template:1")
    image = f"{repository.split('/')[0]}/trainstack@sha256:{'0' * 64}"
    pinned = variant(batch_stack.stack, **{"trainstack:image": image})
    for definition in pinned.all("batch.JobDefinition"):
        properties = definition.inputs.get("nodeProperties") or definition.inputs["containerProperties"]
        assert f'"{image}"' in properties and ":latest" not in properties
        assert "name" not in definition.inputs


def test_job_container_contract(batch_stack):
    container = batch_stack.node_container
    repository = batch_stack.one("ecr.Repository").outputs["repositoryUrl"]
    assert container["image"] == f"{repository}:latest"
    assert container["command"] == DEFAULT_COMMAND
    assert "entryPoint" not in container  # baked into the image
    assert container["volumes"] == [{"name": "fsx", "host": {"sourcePath": "/fsx"}}]
    assert container["mountPoints"] == [{"sourceVolume": "fsx", "containerPath": "/fsx", "readOnly": False}]
    assert {"name": "memlock", "softLimit": -1, "hardLimit": -1} in container["ulimits"]
    assert container["linuxParameters"]["sharedMemorySize"] >= 64 * 1024
    assert container["jobRoleArn"] == batch_stack.one("iam.Role", "-job").outputs["arn"]
    assert container["executionRoleArn"] == batch_stack.one("iam.Role", "-execution").outputs["arn"]


def test_job_environment_is_image_efa_env_plus_the_instance_type_and_checkpoint_root(batch_stack):
    environment = {e["name"]: e["value"] for e in batch_stack.node_container["environment"]}
    assert environment == {
        **efa_environment(),
        "TRAINSTACK_INSTANCE_TYPE": batch_stack.config.instance_type,
        "TRAINSTACK_PURCHASE_OPTION": "on-demand",  # the checked-in stacks reserve no capacity
        "TRAINSTACK_CHECKPOINT_ROOT": "/fsx/checkpoints",
        "TRAINSTACK_STOP_GRACE_SECONDS": str(batch_stack.config.stop_grace_seconds),
    }
    assert CHECKPOINTS_DIR == "/fsx/checkpoints"
    assert environment["NCCL_NET"] == "AWS Libfabric"


def test_jobs_log_to_a_stack_log_group_with_awslogs(batch_stack):
    logging = batch_stack.node_container["logConfiguration"]
    assert logging["logDriver"] == "awslogs"
    assert logging["options"]["awslogs-group"] == f"/trainstack/{batch_stack.stack}/jobs"
    assert logging["options"]["awslogs-region"] == batch_stack.config.region


def test_jobs_retry_when_the_host_fails_or_the_run_asks_but_not_on_application_errors(batch_stack):
    from trainer.contract.retry import RETRY_EXIT_CODE

    strategy = batch_stack.one("batch.JobDefinition", "-train").inputs["retryStrategy"]
    assert strategy["attempts"] > 1
    assert strategy["evaluateOnExits"] == [
        {"onStatusReason": "Host EC2*", "action": "RETRY"},
        {"onExitCode": str(RETRY_EXIT_CODE), "action": "RETRY"},
        {"onReason": "*", "action": "EXIT"},
    ]
    assert len(strategy["evaluateOnExits"]) <= 5  # Batch API RetryStrategy: up to 5 EvaluateOnExit objects


# --- compute environment, launch template -----------------------------------------------------------------------


def test_compute_environment_scales_from_zero_to_the_stack_node_count(batch_stack):
    resources = batch_stack.one("batch.ComputeEnvironment", "-gpu").inputs["computeResources"]
    assert resources["type"] == "EC2"  # multi-node parallel jobs cannot run on Spot
    assert resources["minVcpus"] == 0
    assert resources["maxVcpus"] == batch_stack.config.node_count * batch_stack.config.instance.vcpus
    assert resources["instanceTypes"] == [batch_stack.config.instance_type]
    assert resources["ec2Configurations"] == [{"imageType": "ECS_AL2023_NVIDIA"}]


def test_compute_environment_uses_one_subnet_the_placement_group_and_the_launch_template(batch_stack):
    resources = batch_stack.one("batch.ComputeEnvironment", "-gpu").inputs["computeResources"]
    cluster_subnet = batch_stack.one("ec2.Subnet", f"-private-{batch_stack.config.cluster_availability_zone}")
    assert resources["subnets"] == [cluster_subnet.id]
    # Batch refuses compute environment security groups beside launch template interfaces (aws/aws-cdk#21577).
    assert "securityGroupIds" not in resources
    assert resources["placementGroup"] == batch_stack.one("ec2.PlacementGroup", "-gpu").name
    assert batch_stack.one("ec2.PlacementGroup", "-gpu").inputs["strategy"] == "cluster"
    assert resources["launchTemplate"] == {"launchTemplateId": batch_stack.launch_template.id, "version": "1"}
    assert resources["instanceRole"] == batch_stack.one("iam.InstanceProfile").outputs["arn"]


def test_launch_templates_require_imdsv2(stack):
    for template in stack.all("ec2.LaunchTemplate"):
        options = template.inputs["metadataOptions"]
        assert options["httpTokens"] == "required"
        assert options["httpPutResponseHopLimit"] == 1


def test_root_volumes_are_encrypted_gp3_with_the_stack_key(stack):
    for template in stack.all("ec2.LaunchTemplate"):
        (root,) = template.inputs["blockDeviceMappings"]
        assert root["ebs"]["encrypted"] == "true"
        assert root["ebs"]["kmsKeyId"] == stack.key_arn
        assert root["ebs"]["volumeType"] == "gp3"


def test_user_data_mounts_the_stack_file_system_at_fsx(batch_stack):
    fsx = batch_stack.one("fsx.LustreFileSystem").outputs
    user_data = base64.b64decode(batch_stack.launch_template.inputs["userData"]).decode()
    assert user_data.startswith("Content-Type: multipart/mixed")  # the format Batch merges with its own
    assert f"{fsx['dnsName']}@tcp:/{fsx['mountName']} /fsx lustre" in user_data
    assert "efa_installer.sh --yes --minimal" in user_data
    # the host's EFA driver comes from the same installer version as the image's user space
    assert f"aws-efa-installer-{image_pins()['EFA_INSTALLER_VERSION']}.tar.gz" in user_data


def test_instances_and_volumes_carry_the_stack_tags(batch_stack):
    tags = {
        "project": "trainstack",
        "stack": batch_stack.stack,
        "owner": batch_stack.config.owner,
    }
    specs = {s["resourceType"]: s["tags"] for s in batch_stack.launch_template.inputs["tagSpecifications"]}
    assert specs == {"instance": tags, "volume": tags, "network-interface": tags}
    assert batch_stack.one("batch.ComputeEnvironment", "-gpu").inputs["computeResources"]["tags"] == tags


def test_provider_default_tags_name_project_stack_and_owner(stack):

    (provider,) = [r for r in stack.plan.resources if r.type == "pulumi:providers:aws"]
    assert provider.inputs["region"] == stack.config.region
    assert json.loads(provider.inputs["defaultTags"]) == {
        "tags": {"project": "trainstack", "stack": stack.stack, "owner": stack.config.owner}
    }
    assert all(r.type.startswith(("pulumi:", "trainstack:")) or r.parent for r in stack.plan.resources)


# --- encryption with the stack key ------------------------------------------------------------------------------


def test_key_rotates_and_has_an_alias(stack):
    assert stack.one("kms.Key").inputs["enableKeyRotation"] is True
    assert stack.one("kms.Alias").inputs["name"] == f"alias/trainstack-{stack.stack}"


def test_every_bucket_is_encrypted_with_the_stack_key_and_a_bucket_key(stack):
    buckets = stack.all("s3.Bucket")
    encryption = {
        r.inputs["bucket"]: r.inputs["rules"] for r in stack.all("s3.BucketServerSideEncryptionConfiguration")
    }
    assert len(buckets) == 3 and set(encryption) == {
        b.id for b in buckets
    }  # datasets, checkpoints, audit logs
    for (rule,) in encryption.values():
        assert rule["applyServerSideEncryptionByDefault"] == {
            "sseAlgorithm": "aws:kms",
            "kmsMasterKeyId": stack.key_arn,
        }
        assert rule["bucketKeyEnabled"] is True


def test_every_log_group_uses_the_stack_key_and_the_configured_retention(stack):
    groups = stack.all("cloudwatch.LogGroup")
    # Batch jobs log to the stack's group; on EKS, Container Insights writes the pods' logs under the cluster's name.
    cluster = f"/aws/containerinsights/trainstack-{stack.stack}"
    jobs = (
        {f"{cluster}/application", f"{cluster}/performance", f"/aws/eks/trainstack-{stack.stack}/cluster"}
        if stack.config.orchestrator == "eks"
        else {f"/trainstack/{stack.stack}/jobs"}
    )
    serving = {stack.config.serving_log_group} if stack.config.serving is not None else set()
    assert {g.inputs["name"] for g in groups} == {
        *jobs,
        *serving,  # the inference pool's endpoint (infra/serving.py)
        f"/trainstack/{stack.stack}/vpc-flow-logs",
        f"/trainstack/{stack.stack}/cloudtrail",
    }
    assert all(g.inputs["kmsKeyId"] == stack.key_arn for g in groups)
    assert all(g.inputs["retentionInDays"] == stack.config.log_retention_days for g in groups)


def test_persistent_file_systems_use_the_stack_key_and_scratch_ones_do_not(stack):
    fsx = stack.one("fsx.LustreFileSystem").inputs
    assert fsx["deploymentType"] == stack.config.fsx_deployment_type
    if stack.config.fsx_persistent:
        assert fsx["kmsKeyId"] == stack.key_arn
        assert fsx["perUnitStorageThroughput"] == stack.config.fsx_throughput
    else:
        assert "kmsKeyId" not in fsx and "perUnitStorageThroughput" not in fsx


def test_repository_uses_the_stack_key_immutable_tags_and_scans_on_push(stack):

    repository = stack.one("ecr.Repository").inputs
    assert repository["encryptionConfigurations"] == [{"encryptionType": "KMS", "kmsKey": stack.key_arn}]
    assert repository["imageTagMutability"] == "IMMUTABLE"
    assert repository["imageScanningConfiguration"] == {"scanOnPush": True}
    (rule,) = json.loads(stack.one("ecr.LifecyclePolicy").inputs["policy"])["rules"]
    assert rule["selection"]["countNumber"] == stack.config.ecr_keep_images


def test_key_policy_lets_logs_use_it_only_for_the_stack_log_groups(stack):

    statements = {s["Sid"]: s for s in json.loads(stack.one("kms.Key").inputs["policy"])["Statement"]}
    logs = statements["CloudWatchLogsForStackLogGroups"]
    assert logs["Principal"] == {"Service": f"logs.{stack.config.region}.amazonaws.com"}
    context = logs["Condition"]["ArnLike"]["kms:EncryptionContext:aws:logs:arn"]
    eks = stack.config.orchestrator == "eks"
    contexts = context if isinstance(context, list) else [context]
    assert contexts[0].endswith(f":log-group:/trainstack/{stack.stack}/*")
    base = contexts[0].split(":log-group:")[0]
    assert contexts[1:] == [
        *([f"{base}:log-group:/aws/containerinsights/trainstack-{stack.stack}/*"] if eks else []),
        *([f"{base}:log-group:/aws/eks/trainstack-{stack.stack}/cluster"] if eks else []),
        *([f"{base}:log-group:{stack.config.serving_log_group}"] if stack.config.serving is not None else []),
    ]
    assert not [s for s in statements.values() if "kms:*" in s["Action"]]
    via = statements["UseThroughStackServices"]["Condition"]["StringEquals"]["kms:ViaService"]
    serving = ("sagemaker",) if stack.config.serving is not None else ()  # the inference pool's volumes
    assert {v.split(".")[0] for v in via} == {"s3", "fsx", "ecr", "ec2", *(("eks",) if eks else ()), *serving}


# --- data lake and file system ----------------------------------------------------------------------------------


def test_buckets_are_versioned_private_tls_only_with_lifecycle(stack):
    # The audit log bucket keeps every version under Object Lock instead: tests/infra/test_audit.py.
    for bucket in (b for b in stack.all("s3.Bucket") if b.parent == "data-lake"):

        def of(kind: str, bucket_id: str = bucket.id) -> list[dict]:
            return [r.inputs for r in stack.all(kind) if r.inputs["bucket"] == bucket_id]

        assert of("s3.BucketVersioning") == [
            {"bucket": bucket.id, "versioningConfiguration": {"status": "Enabled"}}
        ]
        (block,) = of("s3.BucketPublicAccessBlock")
        assert all(
            block[k] is True
            for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
        )
        (policy,) = of("s3.BucketPolicy")
        (deny,) = json.loads(policy["policy"])["Statement"]
        assert (deny["Effect"], deny["Condition"]) == ("Deny", {"Bool": {"aws:SecureTransport": "false"}})
        (lifecycle,) = of("s3.BucketLifecycleConfiguration")
        rules = {r["id"]: r for r in lifecycle["rules"]}
        assert (
            rules["abort-incomplete-multipart-uploads"]["abortIncompleteMultipartUpload"][
                "daysAfterInitiation"
            ]
            == 7
        )
        expiry = rules["expire-noncurrent-versions"]["noncurrentVersionExpiration"]["noncurrentDays"]
        assert expiry == stack.config.noncurrent_version_expiration_days


def test_file_system_links_datasets_with_auto_import_and_checkpoints_with_auto_export(stack):
    links = {r.inputs["fileSystemPath"]: r.inputs for r in stack.all("fsx.DataRepositoryAssociation")}
    fsx = stack.one("fsx.LustreFileSystem")
    datasets, checkpoints = stack.one("s3.Bucket", "-datasets").id, stack.one("s3.Bucket", "-checkpoints").id
    assert links["/datasets"]["dataRepositoryPath"] == f"s3://{datasets}/"
    assert links["/datasets"]["s3"] == {"autoImportPolicy": {"events": ["NEW", "CHANGED", "DELETED"]}}
    assert links["/checkpoints"]["dataRepositoryPath"] == f"s3://{checkpoints}/"
    assert links["/checkpoints"]["s3"] == {"autoExportPolicy": {"events": ["NEW", "CHANGED", "DELETED"]}}
    assert all(link["fileSystemId"] == fsx.id for link in links.values())


def test_file_system_sits_in_the_cluster_subnet_with_lz4_and_the_configured_size(stack):
    fsx = stack.one("fsx.LustreFileSystem").inputs
    assert (
        fsx["subnetIds"] == stack.one("ec2.Subnet", f"-private-{stack.config.cluster_availability_zone}").id
    )
    assert fsx["dataCompressionType"] == "LZ4"
    assert fsx["storageCapacity"] == stack.config.fsx_storage_capacity_gib


def test_file_system_admits_lustre_ports_from_the_gpu_nodes(stack):
    fsx_group = stack.one("ec2.SecurityGroup", "-fsx").id
    from_nodes = {
        (r.inputs["fromPort"], r.inputs["toPort"])
        for r in stack.all("vpc.SecurityGroupIngressRule")
        if r.inputs["securityGroupId"] == fsx_group
        and r.inputs.get("referencedSecurityGroupId") == stack.efa_group.id
    }
    assert from_nodes == {(988, 988), (1018, 1023)}
    assert stack.one("fsx.LustreFileSystem").inputs["securityGroupIds"] == [fsx_group]


# --- network ----------------------------------------------------------------------------------------------------


def test_s3_gateway_endpoint_serves_every_private_route_table(stack):
    endpoint = stack.one("ec2.VpcEndpoint", "-s3").inputs
    assert endpoint["serviceName"] == f"com.amazonaws.{stack.config.region}.s3"
    assert endpoint["vpcEndpointType"] == "Gateway"
    private_tables = {r.id for r in stack.all("ec2.RouteTable") if "-private-" in r.name}
    assert set(endpoint["routeTableIds"]) == private_tables and private_tables


def test_interface_endpoints_are_exactly_the_configured_ones(stack):
    interface = [r.inputs for r in stack.all("ec2.VpcEndpoint") if r.inputs["vpcEndpointType"] == "Interface"]
    region = stack.config.region
    assert sorted(e["serviceName"] for e in interface) == sorted(
        f"com.amazonaws.{region}.{s}" for s in stack.config.interface_endpoints
    )
    assert all(e["privateDnsEnabled"] is True for e in interface)


def test_nat_gateways_match_the_config_and_private_subnets_route_through_them(stack):
    nats = stack.all("ec2.NatGateway")
    assert len(nats) == stack.config.nat_gateways
    routes = [r.inputs["routes"] for r in stack.all("ec2.RouteTable") if "-private-" in r.name]
    assert len(routes) == len(stack.config.availability_zones)
    assert {route["natGatewayId"] for (route,) in routes} == {n.id for n in nats}


def test_subnets_cover_each_zone_and_never_map_public_ips(stack):
    subnets = stack.all("ec2.Subnet")
    assert len(subnets) == 2 * len(stack.config.availability_zones)
    assert {s.inputs["availabilityZone"] for s in subnets} == set(stack.config.availability_zones)
    assert all(s.inputs["mapPublicIpOnLaunch"] is False for s in subnets)
    private, public = stack.config.subnet_cidrs
    assert sorted(s.inputs["cidrBlock"] for s in subnets) == sorted(private + public)


def test_vpc_flow_logs_go_to_the_encrypted_log_group(stack):
    flow = stack.one("ec2.FlowLog").inputs
    group = stack.one("cloudwatch.LogGroup", "-flow-logs")
    assert (flow["trafficType"], flow["logDestinationType"]) == ("ALL", "cloud-watch-logs")
    assert flow["logDestination"] == group.outputs["arn"]
    assert flow["vpcId"] == stack.one("ec2.Vpc").id


# The delivery role's permissions policy as the Amazon VPC user guide prints it ("IAM role for publishing flow logs
# to CloudWatch Logs"), copied from the guide: every action it lists must be granted.
FLOW_LOGS_GUIDE_POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Action": [
                "logs:CreateLogGroup",
                "logs:CreateLogStream",
                "logs:PutLogEvents",
                "logs:DescribeLogGroups",
                "logs:DescribeLogStreams",
            ],
            "Resource": "*",
        }
    ],
}


def test_flow_log_role_has_every_action_the_vpc_guide_lists(stack):
    role_arn = stack.one("ec2.FlowLog").inputs["iamRoleArn"]
    role = next(r for r in stack.all("iam.Role") if r.outputs.get("arn") == role_arn)
    [policy] = [p for p in stack.all("iam.RolePolicy") if p.inputs["role"] == role.id]
    granted = {
        action: statement["Resource"]
        for statement in json.loads(policy.inputs["policy"])["Statement"]
        for action in statement["Action"]
    }
    [guide] = FLOW_LOGS_GUIDE_POLICY["Statement"]
    assert set(guide["Action"]) <= set(granted)
    # Scoped tighter than the guide's "*": the stack's log group, and the region's groups for the one list action.
    group = stack.one("cloudwatch.LogGroup", "-flow-logs").outputs["arn"]
    assert granted["logs:PutLogEvents"] == [group, group + ":*"]
    [listed] = granted["logs:DescribeLogGroups"]
    assert re.fullmatch(rf"arn:aws:logs:{stack.config.region}:\d{{12}}:log-group:\*", listed)


# --- identity ---------------------------------------------------------------------------------------------------


def test_no_policy_grants_a_wildcard_action(stack):
    for name, document in stack.policies():
        for statement in document["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            assert "*" not in actions, name
            assert statement["Effect"] == "Deny" or not any(a.endswith(":*") for a in actions), name


def test_iam_policies_use_a_wildcard_resource_only_where_aws_requires_one(stack):
    role_policies = [(r.name, r.inputs["policy"]) for r in stack.all("iam.RolePolicy")]
    assert role_policies

    for name, document in role_policies:
        for statement in json.loads(document)["Statement"]:
            if "*" in statement["Resource"]:
                assert set(statement["Action"]) <= set(WILDCARD_RESOURCE_ACTIONS), name


def test_job_role_reads_datasets_and_writes_only_checkpoints(batch_stack):

    policy = json.loads(batch_stack.one("iam.RolePolicy", "-job").inputs["policy"])
    writes = [s for s in policy["Statement"] if "s3:PutObject" in s["Action"]]
    checkpoints = batch_stack.one("s3.Bucket", "-checkpoints").outputs["arn"]
    assert [s["Resource"] for s in writes] == [[f"{checkpoints}/*"]]
    (kms,) = [s for s in policy["Statement"] if any(a.startswith("kms:") for a in s["Action"])]
    assert kms["Resource"] == [batch_stack.key_arn]


def test_job_role_may_take_only_its_own_stacks_nodes_out_of_service(batch_stack):
    policy = json.loads(batch_stack.one("iam.RolePolicy", "-job").inputs["policy"])
    (quarantine,) = [s for s in policy["Statement"] if "autoscaling:SetInstanceHealth" in s["Action"]]
    assert sorted(quarantine["Action"]) == ["autoscaling:SetInstanceHealth", "ec2:TerminateInstances"]
    assert quarantine["Condition"] == {"StringEquals": {"aws:ResourceTag/stack": batch_stack.stack}}
    assert "*" not in quarantine["Resource"]
    # The nodes carry that tag: the launch template tags each instance, the compute environment too.
    template = batch_stack.one("ec2.LaunchTemplate", "-gpu").inputs
    instance_tags = [t["tags"] for t in template["tagSpecifications"] if t["resourceType"] == "instance"]
    assert instance_tags == [batch_stack.config.tags]


# --- protection, outputs ----------------------------------------------------------------------------------------

DATA_HOLDERS = ("kms.Key", "s3.Bucket", "fsx.LustreFileSystem", "ecr.Repository")


def test_resources_holding_data_are_protected_and_retained_exactly_when_configured(stack):
    for kind in DATA_HOLDERS:
        for resource in stack.all(kind):
            assert (resource.protect, resource.retain_on_delete) == (stack.config.protect_data,) * 2, (
                resource.name
            )


def test_prod_protects_its_data(prod):
    assert prod.config.protect_data
    protected = {r.type for r in prod.plan.resources if r.protect and r.retain_on_delete}
    assert len(protected) == len(DATA_HOLDERS)


def test_stack_exports_the_outputs_the_submit_tool_reads(stack):
    assert missing_outputs(stack.plan.outputs) == []
    eks = stack.config.orchestrator == "eks"
    expected = {
        "orchestrator",
        *(name for name in STACK_OUTPUTS if name not in BATCH_OUTPUTS),
        *(EKS_OUTPUTS if eks else BATCH_OUTPUTS),
        *MONITORING_OUTPUTS,
        *GOVERNANCE_OUTPUTS,
        *DATA_OUTPUTS,
        *(SPOT_OUTPUTS if stack.config.spot else ()),
        *(TEAM_OUTPUTS if stack.config.teams else ()),
        *(EKS_TEAM_OUTPUTS if stack.config.teams and eks else ()),
        *(EKS_PRICING_OUTPUTS if eks else ()),
        *(SERVING_OUTPUTS if stack.config.serving is not None else ()),
    }
    assert set(stack.plan.outputs) == expected
    outputs = stack.plan.outputs
    assert outputs["orchestrator"] == stack.config.orchestrator
    assert (outputs["instance_type"], outputs["node_count"]) == (
        stack.config.instance_type,
        stack.config.node_count,
    )
    assert outputs["gpus_per_node"] == instance_type(stack.config.instance_type).gpus
    if eks:
        assert outputs["eks_cluster_name"] == stack.one("eks.Cluster").inputs["name"]
    else:
        assert outputs["job_definition"] == stack.one("batch.JobDefinition", "-train").outputs["arn"]
    assert outputs["fsx_mount_name"] == stack.one("fsx.LustreFileSystem").outputs["mountName"]
    assert outputs["region"] == stack.config.region


def test_spot_adds_a_single_node_queue_and_job_definition(batch_stack):
    spot = [r for r in batch_stack.plan.resources if r.name.endswith("-spot")]
    if not batch_stack.config.spot:
        assert spot == []
        return
    environment = batch_stack.one("batch.ComputeEnvironment", "-spot").inputs["computeResources"]
    assert environment["type"] == "SPOT" and environment["minVcpus"] == 0
    # Its own cluster placement group: "All instances that use an EFA must be in the same cluster placement group"
    # (Batch user guide, "Elastic Fabric Adapter").
    group = batch_stack.one("ec2.PlacementGroup", "-spot")
    assert environment["placementGroup"] == group.name and group.inputs["strategy"] == "cluster"
    assert group.name != batch_stack.one("ec2.PlacementGroup", "-gpu").name
    spot_interfaces = batch_stack.one("ec2.LaunchTemplate", "-spot").inputs["networkInterfaces"]
    assert (
        spot_interfaces == batch_stack.launch_template.inputs["networkInterfaces"]
    )  # the container needs its devices
    definition = batch_stack.one("batch.JobDefinition", "-spot").inputs
    assert definition["type"] == "container" and "nodeProperties" not in definition


@pytest.mark.parametrize("kind", ["trainstack:keys:Keys", "cluster", "trainstack:lustre:Lustre"])
def test_components_parent_their_resources(stack, kind):
    if kind == "cluster":  # the orchestrator's component
        kind = "trainstack:eks:Eks" if stack.config.orchestrator == "eks" else "trainstack:cluster:Cluster"
    (component,) = [r for r in stack.plan.resources if r.type == kind]
    assert component.custom is False
    assert [r for r in stack.plan.resources if r.parent == component.name]
