"""checkov over the Kubernetes objects of an EKS stack (policy/checkov_k8s.py, make policy): the real pinned checkov
(.venv-checkov, requirements/checkov.txt) on the real objects, every finding fixed or accepted with a reason."""

from __future__ import annotations

import copy

import pytest

from policy.checkov_k8s import CHECKOV, Finding, judge, read_baseline, run_checkov

JOB = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "llama-node", "namespace": "team-vision"},
    "spec": {
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 10001,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [
                    {
                        "name": "trainer",
                        "image": "repo:abc",
                        # As the stack's pod asks (trainer/jobs/jobset.py): a memory request, the node's GPUs.
                        "resources": {
                            "requests": {"memory": "32000Mi", "nvidia.com/gpu": "8"},
                            "limits": {"nvidia.com/gpu": "8"},
                        },
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }
                ],
            }
        }
    },
}


def test_the_pinned_checkov_is_installed():
    assert CHECKOV.is_file(), (
        f"{CHECKOV} is missing: make test and make policy install it (requirements/checkov.txt)"
    )


def test_a_privileged_host_network_pod_is_refused_and_the_stacks_own_pod_is_not():
    escaping = copy.deepcopy(JOB)
    escaping["metadata"]["name"] = "escape-node"
    pod = escaping["spec"]["template"]["spec"]
    pod["hostNetwork"] = True
    pod["containers"][0]["securityContext"]["privileged"] = True
    _, refused = judge(run_checkov([JOB, escaping], CHECKOV), read_baseline())
    # checkov's own checks: CKV_K8S_16 "Container should not be privileged", CKV_K8S_19 "Containers should not
    # share the host network namespace"; the stack-shaped Job raises nothing the baseline does not accept.
    assert {(f.check, f.resource) for f in refused} >= {
        ("CKV_K8S_16", "Job.team-vision.escape-node"),
        ("CKV_K8S_19", "Job.team-vision.escape-node"),
    }
    assert {f.resource for f in refused} == {"Job.team-vision.escape-node"}


def test_an_accepted_finding_needs_a_reason(tmp_path):
    baseline = tmp_path / "baseline.yaml"
    baseline.write_text("accepted:\n  - {check: CKV_K8S_22, resource: 'Job.*', reason: ''}\n")
    with pytest.raises(ValueError, match="every accepted finding needs a reason"):
        read_baseline(baseline)


def test_a_baseline_entry_accepts_only_its_check_on_matching_resources():
    entry = {"check": "CKV_K8S_22", "resource": "Job.team-*", "reason": "r"}
    assert Finding("CKV_K8S_22", "n", "Job.team-vision.x").accepted_by(entry)
    assert not Finding("CKV_K8S_16", "n", "Job.team-vision.x").accepted_by(entry)
    assert not Finding("CKV_K8S_22", "n", "Deployment.kube-system.x").accepted_by(entry)


@pytest.mark.slow
def test_eks_dev_has_no_finding_outside_the_reviewed_baseline():
    from policy.checkov_k8s import check_stack

    lines, refused = check_stack("eks-dev", CHECKOV)
    assert refused == [], lines
    # Both teams' JobSets were checked as the Jobs they become, not only the stack's own objects.
    assert any("Job.team-vision." in line for line in lines) and any(
        "Job.team-language." in line for line in lines
    )
