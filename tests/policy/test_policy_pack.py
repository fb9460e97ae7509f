"""The pack as the Pulumi engine runs it: `python policy/` serves the analyzer over gRPC, fed with unknowns.

This is the one place the pack's real entry point, the SDK's proxy and the engine's request shapes meet: ids are
unknown as in a real `pulumi preview`, and resources are related only through `propertyDependencies`.
"""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

from infra.iam import WILDCARD_RESOURCE_ACTIONS
from policy.pack import PACK_NAME, POLICIES
from tests.conftest import ROOT

GROUP_URN = "urn:pulumi:dev::trainstack::aws:ec2/securityGroup:SecurityGroup::efa"
KEY_ARN = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


@pytest.fixture(scope="module")
def analyzer(tmp_path_factory):
    """The pack started as the CLI starts a Python pack (`python <pack dir>`), from an unrelated directory."""
    process = subprocess.Popen(
        [sys.executable, "-u", str(ROOT / "policy")],
        cwd=tmp_path_factory.mktemp("engine"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    port = process.stdout.readline().strip()  # the pack prints its port once it serves
    if not port.isdigit():
        process.kill()
        pytest.fail(f"the pack did not start: {process.communicate()[1]}")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield analyzer_pb2_grpc.AnalyzerStub(channel)
    channel.close()
    process.terminate()
    process.wait(timeout=10)


def properties(values: dict) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(values)
    return struct


def analyze(analyzer, type_: str, name: str, values: dict) -> list[analyzer_pb2.AnalyzeDiagnostic]:
    request = analyzer_pb2.AnalyzeRequest(
        type=type_,
        name=name,
        urn=f"urn:pulumi:dev::trainstack::{type_}::{name}",
        properties=properties(values),
        options=analyzer_pb2.AnalyzerResourceOptions(),
    )
    return list(analyzer.Analyze(request).diagnostics)


def stack_resource(type_: str, name: str, values: dict, dependencies: dict[str, list[str]] | None = None):
    return analyzer_pb2.AnalyzerResource(
        type=type_,
        name=name,
        urn=f"urn:pulumi:dev::trainstack::{type_}::{name}",
        properties=properties(values),
        options=analyzer_pb2.AnalyzerResourceOptions(),
        propertyDependencies={
            key: analyzer_pb2.AnalyzerPropertyDependencies(urns=urns)
            for key, urns in (dependencies or {}).items()
        },
    )


def test_pack_serves_every_policy_at_mandatory_level_but_the_advisory_one(analyzer):
    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty())
    assert info.name == PACK_NAME
    assert [p.name for p in info.policies] == [p.name for p in POLICIES]
    # cis-alarms-heard warns: a stack without alarm addresses still deploys (policy/audit.py).
    levels = {p.name: p.enforcementLevel for p in info.policies}
    assert levels.pop("cis-alarms-heard") == analyzer_pb2.ADVISORY
    assert set(levels.values()) == {analyzer_pb2.MANDATORY}
    assert len({p.name for p in POLICIES}) == len(POLICIES)


def test_launch_template_allowing_imdsv1_is_a_mandatory_violation(analyzer):
    template = {
        "metadataOptions": {"httpTokens": "optional"},
        "blockDeviceMappings": [
            {"deviceName": "/dev/xvda", "ebs": {"encrypted": "true", "kmsKeyId": KEY_ARN}}
        ],
    }
    [diagnostic] = analyze(analyzer, "aws:ec2/launchTemplate:LaunchTemplate", "gpu", template)
    assert (diagnostic.policyName, diagnostic.policyPackName) == ("imdsv2-required", PACK_NAME)
    assert diagnostic.enforcementLevel == analyzer_pb2.MANDATORY
    assert (
        diagnostic.message.startswith("Launch templates require IMDSv2")
        and "'gpu' lets instances" in diagnostic.message
    )


def test_key_arn_unknown_in_preview_counts_as_a_customer_managed_key(analyzer):
    log_group = {"name": "/trainstack/dev/jobs", "kmsKeyId": UNKNOWN_STRING_VALUE}
    assert analyze(analyzer, "aws:cloudwatch/logGroup:LogGroup", "jobs", log_group) == []


def test_policy_document_unknown_in_preview_is_checked_at_up_instead(analyzer):
    diagnostics = analyze(analyzer, "aws:iam/rolePolicy:RolePolicy", "job", {"policy": UNKNOWN_STRING_VALUE})
    assert {d.policyName for d in diagnostics} == {"iam-no-wildcard-action", "iam-no-wildcard-resource"}
    assert all(
        d.enforcementLevel == analyzer_pb2.ADVISORY and "during preview" in d.message for d in diagnostics
    )


def efa_stack(*rules: str) -> list[analyzer_pb2.AnalyzerResource]:
    """An EFA launch template and its group, every id unknown, plus the named self rules of the group."""
    interface = {"interfaceType": "efa", "securityGroups": [UNKNOWN_STRING_VALUE]}
    resources = [
        stack_resource("aws:ec2/securityGroup:SecurityGroup", "efa", {"description": "EFA"}),
        stack_resource(
            "aws:ec2/launchTemplate:LaunchTemplate",
            "gpu",
            {"networkInterfaces": [interface, {**interface, "interfaceType": "efa-only"}]},
            {"networkInterfaces": [GROUP_URN]},
        ),
    ]
    for rule in rules:
        resources.append(
            stack_resource(
                f"aws:vpc/security{rule}:Security{rule}",
                rule,
                {
                    "ipProtocol": "-1",
                    "securityGroupId": UNKNOWN_STRING_VALUE,
                    "referencedSecurityGroupId": UNKNOWN_STRING_VALUE,
                },
                {"securityGroupId": [GROUP_URN], "referencedSecurityGroupId": [GROUP_URN]},
            )
        )
    return resources


def test_efa_group_related_by_property_dependencies_passes_with_ids_unknown(analyzer):
    request = analyzer_pb2.AnalyzeStackRequest(resources=efa_stack("GroupIngressRule", "GroupEgressRule"))
    assert list(analyzer.AnalyzeStack(request).diagnostics) == []


def test_efa_group_without_self_egress_is_reported_on_the_group(analyzer):
    request = analyzer_pb2.AnalyzeStackRequest(resources=efa_stack("GroupIngressRule"))
    [diagnostic] = analyzer.AnalyzeStack(request).diagnostics
    assert (diagnostic.policyName, diagnostic.urn) == ("efa-security-group-self-traffic", GROUP_URN)
    assert "no all-traffic egress rule to itself" in diagnostic.message
    assert diagnostic.enforcementLevel == analyzer_pb2.MANDATORY


def test_docs_describe_every_policy_and_the_whole_allow_list():
    docs = (ROOT / "docs" / "policy.md").read_text()
    rows = [line for line in docs.splitlines() if line.startswith("| `")]
    policies_table = {row.split("`")[1] for row in rows if "| resource |" in row or "| stack |" in row}
    assert policies_table == {p.name for p in POLICIES}
    allow_list = docs.split('### `Resource: "*"` allow-list')[1].split("## Tests")[0]
    assert {line.split("`")[1] for line in allow_list.splitlines() if line.startswith("| `")} == set(
        WILDCARD_RESOURCE_ACTIONS
    )
