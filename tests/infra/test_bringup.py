"""What a first `pulumi up` and the first multi-node job depend on (issue 13), asserted on each stack's plan.

Each rule here comes from an AWS document or API error, cited beside the code in infra/ and the policy in
policy/aws_rules.py. The node's user data is also run for real by bash, with the commands that touch the machine
(modinfo, curl, dnf, mount, findmnt, systemctl, shutdown) replaced by recording stand-ins and its paths moved into a
temporary root: the script's own control flow (the EFA check, the failure trap) is what runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from infra.config import DEFAULT_STOP_GRACE_SECONDS, StackConfig
from infra.keys import ADMIN_ACTIONS
from infra.lustre import LUSTRE_PORTS
from infra.node_bootstrap import ECS_CONFIG, FSTAB, FSX_MOUNT, ecs_stop_timeout_seconds, node_script
from policy.aws_rules import configured_stop_timeout, user_data_script
from trainer.contract.container import CHECKPOINTS_DIR, CONTAINER_UID, DATASETS_DIR
from trainer.distributed.torchrun import add_supervision_arguments

# --- defect 3: security groups on the interfaces only; the job containers' default group ------------------------


def test_compute_environments_name_no_security_groups_their_templates_carry_them(batch_stack):
    # The CPU data environment's template defines no interfaces, so it names its group (tests/infra/test_data_prep.py).
    efa = [e for e in batch_stack.all("batch.ComputeEnvironment") if not e.name.endswith("-data")]
    assert efa
    for environment in efa:
        assert "securityGroupIds" not in environment.inputs["computeResources"], environment.name
    for template in batch_stack.all("ec2.LaunchTemplate"):
        if template.name.endswith("-data"):
            continue
        assert all(
            i["securityGroups"] == [batch_stack.efa_group.id] for i in template.inputs["networkInterfaces"]
        )
        assert "vpcSecurityGroupIds" not in template.inputs


def test_default_group_lets_job_containers_reach_each_other_and_https_only(stack):
    group = stack.one("ec2.DefaultSecurityGroup").inputs
    assert group["vpcId"] == stack.one("ec2.Vpc").id
    assert [(r["protocol"], r.get("self"), r.get("cidrBlocks")) for r in group["ingress"]] == [
        ("-1", True, None)
    ]
    assert sorted(
        (r["protocol"], r["fromPort"], r["toPort"], r.get("self"), r.get("cidrBlocks"))
        for r in group["egress"]
    ) == [
        ("-1", 0, 0, True, None),
        ("tcp", 443, 443, None, ["0.0.0.0/0"]),
    ]


# --- defect 5: Lustre both ways ----------------------------------------------------------------------------------


def _rules(stack, kind: str, group: str, peer: str) -> set[tuple[int, int]]:
    return {
        (r.inputs["fromPort"], r.inputs["toPort"])
        for r in stack.all(kind)
        if r.inputs["securityGroupId"] == group
        and r.inputs.get("referencedSecurityGroupId") == peer
        and r.inputs["ipProtocol"] == "tcp"
    }


def test_lustre_ports_are_open_both_ways_between_the_nodes_and_the_file_system(stack):
    nodes, fsx = stack.efa_group.id, stack.one("ec2.SecurityGroup", "-fsx").id
    ports = set(LUSTRE_PORTS)
    assert ports == {
        (988, 988),
        (1018, 1023),
    }  # FSx for Lustre user guide, "File system access control with Amazon VPC"
    assert _rules(stack, "vpc.SecurityGroupEgressRule", nodes, fsx) == ports
    assert _rules(stack, "vpc.SecurityGroupIngressRule", nodes, fsx) == ports
    assert _rules(stack, "vpc.SecurityGroupIngressRule", fsx, nodes) == ports
    assert _rules(stack, "vpc.SecurityGroupEgressRule", fsx, nodes) == ports
    assert _rules(stack, "vpc.SecurityGroupIngressRule", fsx, fsx) == ports
    assert _rules(stack, "vpc.SecurityGroupEgressRule", fsx, fsx) == ports


# --- defect 7: the key policy ------------------------------------------------------------------------------------


def test_key_policy_lists_admin_actions_and_grants_only_for_aws_services(stack):
    statements = json.loads(stack.one("kms.Key").inputs["policy"])["Statement"]
    assert not [a for a in ADMIN_ACTIONS if "*" in a]
    for statement in statements:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert "kms:Create*" not in actions and "kms:*" not in actions
        if "kms:CreateGrant" in actions:
            conditions = {key for test in statement["Condition"].values() for key in test}
            assert conditions & {"kms:ViaService", "kms:GrantIsForAWSResource"}, statement["Sid"]


# --- defect 8: stop timeout above the grace, a timeout on every job ---------------------------------------------


def test_stack_default_stop_grace_is_the_trainers_own_default(monkeypatch):
    monkeypatch.delenv("TRAINSTACK_STOP_GRACE_SECONDS", raising=False)
    parser = argparse.ArgumentParser()
    add_supervision_arguments(parser)
    assert parser.parse_args([]).stop_grace_seconds == DEFAULT_STOP_GRACE_SECONDS
    assert StackConfig.model_fields["stop_grace_seconds"].default == DEFAULT_STOP_GRACE_SECONDS


def test_ecs_stop_timeout_on_every_node_outlasts_the_jobs_stop_grace(batch_stack):
    grace = {e["name"]: e["value"] for e in batch_stack.node_container["environment"]}[
        "TRAINSTACK_STOP_GRACE_SECONDS"
    ]
    assert int(grace) == batch_stack.config.stop_grace_seconds
    for template in batch_stack.all("ec2.LaunchTemplate"):
        timeout = configured_stop_timeout(user_data_script(template.inputs["userData"]))
        assert (
            timeout == ecs_stop_timeout_seconds(int(grace)) and timeout > int(grace) > 30
        )  # ECS default 30 s


def test_every_job_definition_has_a_timeout_and_a_retry_strategy(batch_stack):
    for definition in batch_stack.all("batch.JobDefinition"):
        assert definition.inputs["timeout"] == {
            "attemptDurationSeconds": batch_stack.config.job_timeout_seconds
        }
        assert definition.inputs["retryStrategy"]["attempts"] >= 1


def test_job_timeout_follows_the_stack_config(variant):
    planned = variant("dev", **{"trainstack:jobTimeoutHours": 6, "trainstack:stopGraceSeconds": 600})
    assert planned.one("batch.JobDefinition", "-train").inputs["timeout"] == {"attemptDurationSeconds": 21600}
    script = user_data_script(planned.launch_template.inputs["userData"])
    assert configured_stop_timeout(script) == 660


# --- defect 6 and 11: the node bootstrap, run ----------------------------------------------------------------------

STAND_INS = {
    # name: shell body; every call is logged as "<name> <args>"
    "modinfo": 'exit "${FAKE_MODINFO_RC:-0}"',
    "curl": 'while [ $# -gt 0 ]; do [ "$1" = -o ] && touch "$2"; shift; done',
    "tar": (
        'while [ $# -gt 0 ]; do [ "$1" = -C ] && dir="$2"; shift; done\n'
        'mkdir -p "$dir/aws-efa-installer"\n'
        'printf "#!/bin/bash\\necho efa_installer.sh \\"\\$@\\" >> \\"$LOG\\"\\n" > "$dir/aws-efa-installer/efa_installer.sh"\n'
        'chmod +x "$dir/aws-efa-installer/efa_installer.sh"'
    ),
    "dnf": "exit 0",
    "mount": 'exit "${FAKE_MOUNT_RC:-0}"',
    "findmnt": 'exit "${FAKE_FINDMNT_RC:-0}"',
    "chown": "exit 0",
    "systemctl": "exit 0",
    "shutdown": "exit 0",
}


def run_node_script(
    tmp_path: Path, replaced: dict[str, str] | None = None, **fakes: int
) -> tuple[int, list[str], Path]:
    """Run the real script under bash in a temporary root; returns (exit status, calls, root).

    `replaced` swaps a stand-in's body; `name=rc` makes a stand-in that reads FAKE_<NAME>_RC exit with `rc`."""
    root, bin_dir, log = tmp_path / "root", tmp_path / "bin", tmp_path / "calls.log"
    (root / "etc" / "ecs").mkdir(parents=True)
    (root / "tmp").mkdir()
    bin_dir.mkdir()
    for name, body in {**STAND_INS, **(replaced or {})}.items():
        path = bin_dir / name
        path.write_text(f'#!/bin/bash\necho "{name} $*" >> "$LOG"\n{body}\n')
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    script = node_script("fs-1.fsx.us-east-1.amazonaws.com", "abcdefgh", 120)
    # One pass, so that a path already moved (under pytest's /tmp) is not moved again.
    moved = {path: f"{root}{path}" for path in ("/tmp/", ECS_CONFIG, FSTAB)}
    moved[f" {FSX_MOUNT}"] = f" {root}{FSX_MOUNT}"  # the mount point, not the DNS name's ".fsx."
    moved["-C /tmp\n"] = f"-C {root}/tmp\n"
    script = re.sub("|".join(map(re.escape, moved)), lambda m: moved[m.group(0)], script)
    environment = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "LOG": str(log),
        **{f"FAKE_{k.upper()}_RC": str(v) for k, v in fakes.items()},
    }
    done = subprocess.run(["bash", "-c", script], env=environment, capture_output=True, text=True, timeout=30)
    calls = log.read_text().splitlines() if log.exists() else []
    return done.returncode, calls, root


def test_node_with_the_amis_efa_module_skips_the_installer_mounts_and_sets_the_stop_timeout(tmp_path):
    status, calls, root = run_node_script(tmp_path, modinfo=0)
    assert status == 0
    assert [c.split()[0] for c in calls] == ["modinfo", "dnf", "mount", "findmnt", "chown"]
    # The data repositories' roots, for the image's non-root user (image/Dockerfile USER).
    assert calls[-1] == f"chown {CONTAINER_UID}:{CONTAINER_UID} {root}{DATASETS_DIR} {root}{CHECKPOINTS_DIR}"
    assert (root / ECS_CONFIG.lstrip("/")).read_text() == "ECS_CONTAINER_STOP_TIMEOUT=180s\n"
    assert "@tcp:/abcdefgh" in (root / FSTAB.lstrip("/")).read_text()


def test_node_without_the_efa_module_installs_it_first(tmp_path):
    status, calls, _ = run_node_script(tmp_path, modinfo=1)
    assert status == 0
    assert [c.split()[0] for c in calls][:4] == ["modinfo", "curl", "tar", "efa_installer.sh"]
    assert "efa_installer.sh --yes --minimal" in calls


@pytest.mark.parametrize(
    ("replaced", "fakes"),
    [({}, {"mount": 32}), ({}, {"findmnt": 1}), ({"tar": "exit 2"}, {"modinfo": 1})],
    ids=["mount-fails", "fsx-not-lustre", "efa-install-fails"],
)
def test_failed_bootstrap_masks_the_ecs_agent_and_shuts_the_node_down(tmp_path, replaced, fakes):
    status, calls, _ = run_node_script(tmp_path, replaced, **fakes)
    assert status != 0
    assert calls[-3:] == [
        "systemctl mask --runtime ecs.service",
        "systemctl stop --no-block ecs.service",
        "shutdown -h now",
    ]


def test_launch_templates_terminate_a_node_that_shuts_itself_down(batch_stack):
    for template in batch_stack.all("ec2.LaunchTemplate"):
        assert template.inputs["instanceInitiatedShutdownBehavior"] == "terminate"
