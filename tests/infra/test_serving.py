"""The inference pool (infra/serving.py) of every checked-in stack, under the Pulumi mocks: the execution role that
reads only exports, the security group in the stack's VPC, the rollback alarms paging the topic, the endpoint row
of the dashboard and the outputs `make deploy` reads."""

from __future__ import annotations

import json

from infra.serving import ENI_ACTIONS
from trainer.contract.serving import SMOKE_METRIC, SMOKE_NAMESPACE, VARIANT, lmi_image


def statements(stack) -> dict[str, dict]:
    policy = json.loads(stack.one("iam.RolePolicy", "-serving-role").inputs["policy"])
    return {statement["Sid"]: statement for statement in policy["Statement"]}


def test_the_role_is_sagemakers_on_this_accounts_behalf(stack):
    trust = json.loads(stack.one("iam.Role", "-serving-role").inputs["assumeRolePolicy"])
    [statement] = trust["Statement"]
    assert statement["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": "123456789012"}}


def test_the_role_reads_only_exports_of_the_checkpoints_bucket(stack):
    found = statements(stack)
    bucket = stack.one("s3.Bucket", "-checkpoints").outputs["arn"]
    assert found["ReadExports"]["Action"] == ["s3:GetObject"]
    assert found["ReadExports"]["Resource"] == [f"{bucket}/*/export/*"]
    assert found["ListExports"]["Resource"] == [bucket]
    assert found["ListExports"]["Condition"] == {"StringLike": {"s3:prefix": ["*/export/*"]}}
    readable = [
        resource
        for statement in found.values()
        if any(action.startswith("s3:") for action in statement["Action"])
        for resource in statement["Resource"]
    ]
    datasets = stack.one("s3.Bucket", "-datasets").outputs["arn"]
    assert not any(resource.startswith(datasets) for resource in readable)
    assert not any("model-tags" in resource or resource.endswith(":*") for resource in readable)
    # nothing that writes or deletes
    actions = {action for statement in found.values() for action in statement["Action"]}
    assert not any(a.startswith("s3:") and a not in ("s3:GetObject", "s3:ListBucket") for a in actions)
    assert found["DecryptExports"] == {
        "Sid": "DecryptExports",
        "Effect": "Allow",
        "Action": ["kms:Decrypt", "kms:DescribeKey"],
        "Resource": [stack.key_arn],
    }


def test_the_role_pulls_the_pinned_image_and_manages_enis_in_the_private_subnets(stack):
    found = statements(stack)
    region = stack.config.region
    assert found["PullLmiImage"]["Resource"] == [
        f"arn:aws:ecr:{region}:763104351884:repository/djl-inference"  # the stacks' regions' (djl-lmi.json)
    ]
    private = [s.outputs["arn"] for s in stack.all("ec2.Subnet") if "-private-" in s.name]
    assert found["EndpointNetworkInterfaces"]["Action"] == ENI_ACTIONS
    assert found["EndpointNetworkInterfaces"]["Resource"][: len(private)] == private
    assert found["WriteEndpointLogs"]["Resource"][0].endswith(
        f":log-group:/aws/sagemaker/Endpoints/{stack.config.serving_endpoint_name}"
    )
    assert found["WriteEndpointLogs"]["Action"] == ["logs:CreateLogStream", "logs:PutLogEvents"]


def test_the_roles_unscoped_actions_are_only_the_network_lookups_an_endpoint_in_a_vpc_makes(stack):
    """SageMaker Developer Guide, "Give SageMaker AI Hosted Endpoints Access to Resources in Your Amazon VPC": the
    Describe actions an endpoint's role needs; not Karpenter's instance, image and price discovery."""
    unscoped = statements(stack)["AwsRequiresWildcardResource"]
    assert unscoped["Resource"] == ["*"]
    assert sorted(unscoped["Action"]) == [
        "ec2:DescribeDhcpOptions",
        "ec2:DescribeNetworkInterfaces",
        "ec2:DescribeSecurityGroups",
        "ec2:DescribeSubnets",
        "ec2:DescribeVpcs",
        "ecr:GetAuthorizationToken",
    ]


def test_the_role_reads_the_rollback_alarms_deployment_guardrails_watch(stack):
    """SageMaker Developer Guide, "Auto-Rollback Configuration and Monitoring": the execution role needs
    cloudwatch:DescribeAlarms on the auto-rollback alarms; exactly those the outputs name."""
    found = statements(stack)["ReadRollbackAlarms"]
    region, alarms = stack.config.region, stack.plan.outputs["serving_alarms"]
    assert found["Action"] == ["cloudwatch:DescribeAlarms"]
    assert found["Resource"] == [f"arn:aws:cloudwatch:{region}:123456789012:alarm:{name}" for name in alarms]


def test_the_endpoints_log_group_is_the_stacks_with_its_retention_and_key(stack):
    group = stack.one("cloudwatch.LogGroup", stack.config.serving_endpoint_name).inputs
    assert group["name"] == f"/aws/sagemaker/Endpoints/{stack.config.serving_endpoint_name}"
    assert (group["retentionInDays"], group["kmsKeyId"]) == (stack.config.log_retention_days, stack.key_arn)
    policy = json.loads(stack.one("kms.Key").inputs["policy"])
    [logs] = [s for s in policy["Statement"] if s["Sid"] == "CloudWatchLogsForStackLogGroups"]
    scope = logs["Condition"]["ArnLike"]["kms:EncryptionContext:aws:logs:arn"]
    assert any(arn.endswith(f":log-group:{group['name']}") for arn in scope)


def test_the_security_group_is_in_the_stacks_vpc_with_https_out_and_no_ingress(stack):
    group = stack.one("ec2.SecurityGroup", "-serving")
    assert group.inputs["vpcId"] == stack.one("ec2.Vpc").id
    assert "ingress" not in group.inputs
    rules = [r for r in stack.all("vpc.SecurityGroupIngressRule") if r.inputs["securityGroupId"] == group.id]
    assert rules == []
    egress = stack.one("vpc.SecurityGroupEgressRule", "-serving-https").inputs
    assert (egress["securityGroupId"], egress["fromPort"], egress["toPort"]) == (group.id, 443, 443)


def test_the_rollback_alarms_watch_the_variant_and_page_the_topic(stack):
    serving, endpoint = stack.config.serving, stack.config.serving_endpoint_name
    topic = stack.one("sns.Topic").outputs["arn"]
    errors = stack.one("cloudwatch.MetricAlarm", "-serving-errors").inputs
    latency = stack.one("cloudwatch.MetricAlarm", "-serving-latency").inputs
    smoke = stack.one("cloudwatch.MetricAlarm", "-serving-smoke").inputs
    for alarm in (errors, latency, smoke):
        assert alarm["alarmActions"] == [topic] and alarm["treatMissingData"] == "notBreaching"
    on_variant = {"EndpointName": endpoint, "VariantName": VARIANT}
    queries = {q["id"]: q for q in errors["metricQueries"]}
    assert queries["errors"]["metric"]["metricName"] == "Invocation5XXErrors"
    assert queries["invocations"]["metric"]["dimensions"] == on_variant
    assert queries["rate"]["expression"] == "100 * errors / invocations" and queries["rate"]["returnData"]
    assert errors["threshold"] == serving.error_rate_alarm_percent
    assert (latency["metricName"], latency["extendedStatistic"]) == ("ModelLatency", "p99")
    assert latency["dimensions"] == on_variant
    assert latency["threshold"] == serving.latency_p99_alarm_ms * 1000  # microseconds
    assert (smoke["namespace"], smoke["metricName"]) == (SMOKE_NAMESPACE, SMOKE_METRIC)
    assert smoke["comparisonOperator"] == "GreaterThanOrEqualToThreshold" and smoke["threshold"] == 1


def test_the_dashboard_gains_the_endpoints_row(stack):
    body = json.loads(stack.one("cloudwatch.Dashboard").inputs["dashboardBody"])
    endpoint = stack.config.serving_endpoint_name
    series = [
        (m[0], m[1], m[3])
        for widget in body["widgets"]
        if widget["properties"]["title"].startswith(endpoint)
        for m in widget["properties"]["metrics"]
    ]
    assert ("AWS/SageMaker", "Invocations", endpoint) in series
    assert ("AWS/SageMaker", "Invocation4XXErrors", endpoint) in series
    assert ("AWS/SageMaker", "Invocation5XXErrors", endpoint) in series
    assert series.count(("AWS/SageMaker", "ModelLatency", endpoint)) == 2  # p50 and p99
    assert ("/aws/sagemaker/Endpoints", "GPUUtilization", endpoint) in series
    assert ("/aws/sagemaker/Endpoints", "CPUUtilization", endpoint) in series  # its SampleCount: instances


def test_the_outputs_carry_what_make_deploy_reads(stack):
    outputs, serving = stack.plan.outputs, stack.config.serving
    assert outputs["serving_endpoint"] == stack.config.serving_endpoint_name
    assert outputs["serving_role_arn"] == stack.one("iam.Role", "-serving-role").outputs["arn"]
    assert outputs["serving_security_group"] == stack.one("ec2.SecurityGroup", "-serving").id
    assert sorted(outputs["serving_subnets"]) == sorted(
        s.id for s in stack.all("ec2.Subnet") if "-private-" in s.name
    )
    assert outputs["serving_image"] == lmi_image(stack.config.region)
    assert (outputs["serving_min_instances"], outputs["serving_max_instances"]) == (
        serving.min_instances,
        serving.max_instances,
    )
    assert outputs["serving_alarms"] == [
        stack.one("cloudwatch.MetricAlarm", f"-serving-{kind}").inputs["name"]
        for kind in ("errors", "latency", "smoke")
    ]


def test_the_key_lets_sagemaker_encrypt_the_endpoints_volumes(stack):
    policy = json.loads(stack.one("kms.Key").inputs["policy"])
    [through] = [s for s in policy["Statement"] if s["Sid"] == "UseThroughStackServices"]
    assert (
        f"sagemaker.{stack.config.region}.amazonaws.com"
        in through["Condition"]["StringEquals"]["kms:ViaService"]
    )
