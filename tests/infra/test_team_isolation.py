"""A team's pods on eks-dev stay in the team's part of the cluster: its namespace enforces the restricted Pod Security
level, which its rendered JobSet passes and a privileged, hostNetwork or hostPath pod does not (the document's
controls, tests/infra/pod_security.py), and its mounts reach only its own directories of the file system."""

from __future__ import annotations

import copy

import pytest

from infra.eks_teams import team_namespace
from infra.k8s_versions import KUBERNETES_MINOR
from tests.infra.pod_security import violations
from tests.infra.test_eks_teams import TEAMS, objects
from trainer.aws.outputs import checked_outputs
from trainer.contract.container import FSX_MOUNT
from trainer.contract.teams import team_directories
from trainer.jobs.jobset import JobSettings, jobset_manifest


def team_pod(stack, team: str) -> dict:
    outputs = checked_outputs(stack.stack, stack.plan.outputs, "the offline preview")
    command = ["train", "--config", "trainer/configs/llama3-8b.yaml"]
    manifest = jobset_manifest("llama", 2, "repo:abc", command, {}, outputs, JobSettings(120, 1), team=team)
    return manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def namespace_level(stack, team: str) -> str:
    (namespace,) = [n for n in objects(stack, "Namespace") if n["metadata"]["name"] == team_namespace(team)]
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce-version"] == f"v{KUBERNETES_MINOR}"
    return labels["pod-security.kubernetes.io/enforce"]


@pytest.mark.parametrize("team", TEAMS)
def test_a_teams_namespace_enforces_restricted_and_its_jobset_passes_it(eks_stack, team):
    level = namespace_level(eks_stack, team)
    assert level == "restricted"
    assert violations(team_pod(eks_stack, team), level) == []


@pytest.mark.parametrize(
    ("change", "control"),
    [
        (
            lambda pod: pod["containers"][0]["securityContext"].update(privileged=True),
            "Privileged Containers",
        ),
        (lambda pod: pod.update(hostNetwork=True), "Host Namespaces"),
        (lambda pod: pod["volumes"].append({"name": "root", "hostPath": {"path": "/"}}), "HostPath Volumes"),
        (lambda pod: pod["securityContext"].update(runAsUser=0), "Running as Non-root user"),
        (lambda pod: pod["securityContext"].pop("runAsNonRoot"), "Running as Non-root"),
        (
            lambda pod: pod["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
            "Privilege Escalation",
        ),
        (
            lambda pod: pod["containers"][0]["securityContext"].update(capabilities={"add": ["SYS_ADMIN"]}),
            "Capabilities",
        ),
    ],
)
def test_a_pod_that_escapes_its_node_or_runs_as_root_is_refused_by_the_namespaces_level(
    eks_stack, change, control
):
    pod = copy.deepcopy(team_pod(eks_stack, "vision"))
    change(pod)
    assert control in violations(pod, namespace_level(eks_stack, "vision"))


def reachable(stack, team: str) -> dict[str, str]:
    """The team pod's mount paths -> the file-system directory each shows (its volume's fileset below the file
    system's mount name), following claim -> volume as the API server binds them."""
    pod = team_pod(stack, team)
    claims = {
        (c["metadata"]["namespace"], c["metadata"]["name"]): c["spec"]["volumeName"]
        for c in objects(stack, "PersistentVolumeClaim")
    }
    volumes = {v["metadata"]["name"]: v["spec"] for v in objects(stack, "PersistentVolume")}
    mount_name = stack.one("fsx.LustreFileSystem").outputs["mountName"]
    by_volume = {v["name"]: v for v in pod["volumes"]}
    seen = {}
    for mount in pod["containers"][0]["volumeMounts"]:
        source = by_volume[mount["name"]]
        if "persistentVolumeClaim" not in source:
            assert "emptyDir" in source  # /dev/shm
            continue
        assert "subPath" not in mount and "subPathExpr" not in mount
        volume = volumes[claims[(team_namespace(team), source["persistentVolumeClaim"]["claimName"])]]
        assert volume["claimRef"]["namespace"] == team_namespace(team)  # bound to this namespace's claim only
        fileset = volume["csi"]["volumeAttributes"]["mountname"]
        assert fileset.startswith(f"{mount_name}/")
        seen[mount["mountPath"]] = fileset.removeprefix(f"{mount_name}/")
    return seen


@pytest.mark.parametrize(("team", "other"), [("vision", "language"), ("language", "vision")])
def test_a_team_reaches_its_own_directories_and_no_other_teams(eks_stack, team, other):
    seen = reachable(eks_stack, team)
    # Each at the contract's path, so /fsx/checkpoints/teams/<team>/<run> is where the trainer writes.
    assert seen == {f"{FSX_MOUNT}/{d}": d for d in team_directories(team).values()}
    for directory in team_directories(other).values():
        for shown in seen.values():
            # A fileset mount shows its directory's subtree and nothing above it ("Mounting specific filesets").
            assert (
                not directory.startswith(f"{shown}/")
                and not shown.startswith(directory)
                and shown != directory
            )
    assert all(
        shown.split("/")[:3] != ["checkpoints"] for shown in seen.values()
    )  # not the stack's whole tree
