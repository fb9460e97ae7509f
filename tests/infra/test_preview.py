"""`make preview-offline`: the table and the JSON a reviewer reads, and its error for bad input."""

from __future__ import annotations

import json

from infra.cluster import efa_network_interfaces
from infra.preview import cli_config, main
from trainer.contract.catalog import instance_type


def test_json_preview_lists_every_resource_with_inputs_and_options(capsys):
    assert main(["--stack", "prod", "--format", "json"]) == 0
    resources = json.loads(capsys.readouterr().out)
    assert all(set(r) == {"type", "name", "inputs", "parent", "protect", "retainOnDelete"} for r in resources)
    by_type = {r["type"]: r for r in resources}
    assert by_type["aws:fsx/lustreFileSystem:LustreFileSystem"]["protect"] is True
    assert by_type["aws:fsx/lustreFileSystem:LustreFileSystem"]["parent"] == "lustre"
    assert by_type["trainstack:cluster:Cluster"]["parent"] is None
    assert (
        by_type["aws:ec2/launchTemplate:LaunchTemplate"]["inputs"]["metadataOptions"]["httpTokens"]
        == "required"
    )


def test_json_preview_is_stable_between_runs(capsys):
    main(["--stack", "dev", "--format", "json"])
    first = capsys.readouterr().out
    main(["--stack", "dev", "--format", "json"])
    assert capsys.readouterr().out == first


def test_table_preview_groups_resources_by_component(capsys):
    assert main(["--stack", "dev"]) == 0
    out = capsys.readouterr().out
    for component in ("trainstack:keys:Keys", "trainstack:network:Network", "trainstack:cluster:Cluster"):
        assert component in out
    assert "EFA interfaces=4" in out and "job_definition = arn:aws:batch:" in out


def test_preview_of_an_unknown_stack_exits_2_and_names_the_stacks(capsys):
    assert main(["--stack", "qa"]) == 2
    assert "no stack file Pulumi.qa.yaml" in capsys.readouterr().err


def test_cli_config_encodes_values_as_the_pulumi_cli_does():
    assert cli_config({"a:list": ["x"], "a:flag": True, "a:count": 4, "a:name": "n"}) == {
        "a:list": '["x"]',
        "a:flag": "true",
        "a:count": "4",
        "a:name": "n",
    }


def test_interface_layout_for_each_catalog_type_has_one_efa_per_card():
    for name in ("p4d.24xlarge", "p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge"):
        layout = efa_network_interfaces(instance_type(name), "sg-1")
        assert [i["network_card_index"] for i in layout] == list(range(instance_type(name).efa_interfaces))
        assert [i["interface_type"] for i in layout].count("efa") == 1


def test_each_registration_records_its_urn_and_the_resources_feeding_each_input(dev):
    rule = dev.one("vpc.SecurityGroupIngressRule", "-efa-from-self")
    assert rule.urn == (
        "urn:pulumi:dev::trainstack::trainstack:cluster:Cluster$"
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule::trainstack-dev-efa-from-self"
    )
    assert rule.property_dependencies["securityGroupId"] == [dev.efa_group.urn]
    assert rule.property_dependencies["referencedSecurityGroupId"] == [dev.efa_group.urn]
    assert rule.property_dependencies["ipProtocol"] == []
