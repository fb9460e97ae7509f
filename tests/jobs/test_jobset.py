"""The JobSet an EKS stack receives: accepted by the pinned CRD schema with unknown fields rejected, and wired to
the catalog, the container contract and the retry code."""

from __future__ import annotations

import copy
import json

import pytest

from trainer.aws.outputs import StackOutputs
from trainer.config.schema import BudgetConfig
from trainer.contract.catalog import instance_type
from trainer.contract.container import FSX_MOUNT, STOP_GRACE_SECONDS
from trainer.contract.image import efa_environment
from trainer.contract.jobset import leader_host
from trainer.contract.retry import RETRY_ATTEMPTS, RETRY_EXIT_CODE
from trainer.cost.ledger import local_rate
from trainer.jobs.jobset import (
    EFA_RESOURCE,
    GPU_RESOURCE,
    QUEUE_LABEL,
    JobSettings,
    RenderError,
    jobset_manifest,
)

from .jobset_schema import jobset_errors

EKS_OUTPUTS = {
    "orchestrator": "eks",
    "region": "us-east-1",
    "ecr_repository_url": "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainstack-eks-dev-trainer",
    "datasets_bucket": "trainstack-eks-dev-datasets",
    "checkpoints_bucket": "trainstack-eks-dev-checkpoints",
    "fsx_file_system_id": "fs-0123456789abcdef0",
    "fsx_dns_name": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
    "fsx_mount_name": "abcdefgh",
    "log_group": "/trainstack/eks-dev/jobs",
    "kms_key_arn": "arn:aws:kms:us-east-1:123456789012:key/k",
    "instance_type": "p5.48xlarge",
    "node_count": 4,
    "gpus_per_node": 8,
    "eks_cluster_name": "trainstack-eks-dev",
    "eks_cluster_endpoint": "https://127.0.0.1:1",
    "eks_cluster_ca": "",
    "k8s_namespace": "trainstack",
    "kueue_local_queue": "training",
    "fsx_claim": "fsx",
    "efa_devices_per_node": 32,
}
SETTINGS = JobSettings(stop_grace_seconds=STOP_GRACE_SECONDS, job_timeout_hours=72)


def outputs(**changes) -> StackOutputs:
    return StackOutputs("eks-dev", {**EKS_OUTPUTS, **changes})


def render(run: str = "llama-8b", nodes: int = 4, stack: StackOutputs | None = None) -> dict:
    command = ["train", "--config", "trainer/configs/llama3-8b.yaml"]
    return jobset_manifest(
        run, nodes, "repo:abc", command, {"TRAINSTACK_RUN": run}, stack or outputs(), SETTINGS
    )


def pod_spec(manifest: dict) -> dict:
    return manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def test_the_pinned_crd_accepts_the_jobset_with_unknown_fields_rejected():
    assert jobset_errors(render()) == []


def test_the_strict_schema_rejects_a_misspelt_key_and_a_bad_action():
    misspelt = render()
    misspelt["spec"]["failurPolicy"] = misspelt["spec"].pop("failurePolicy")
    assert any("failurPolicy" in error for error in jobset_errors(misspelt))
    nested = render()
    container = pod_spec(nested)["containers"][0]
    container["resourcez"] = container.pop("resources")
    assert any("resourcez" in error for error in jobset_errors(nested))
    bad_action = render()
    bad_action["spec"]["failurePolicy"]["rules"][0]["action"] = "Restart"
    assert any("'Restart' is not one of" in error for error in jobset_errors(bad_action))


@pytest.mark.parametrize(("instance", "efa", "gpus"), [("p5.48xlarge", 32, 8), ("p4d.24xlarge", 4, 8)])
def test_the_pod_asks_for_every_gpu_and_the_catalogs_efa_devices(instance, efa, gpus):
    assert instance_type(instance).efa_interfaces == efa
    manifest = render(stack=outputs(instance_type=instance, efa_devices_per_node=efa, gpus_per_node=gpus))
    resources = pod_spec(manifest)["containers"][0]["resources"]
    for side in ("requests", "limits"):
        assert resources[side][EFA_RESOURCE] == str(efa)
        assert resources[side][GPU_RESOURCE] == str(gpus)
        assert resources[side]["hugepages-2Mi"] == "5120Mi"
    assert pod_spec(manifest)["nodeSelector"] == {"node.kubernetes.io/instance-type": instance}
    assert jobset_errors(manifest) == []


def test_a_stack_whose_efa_output_differs_from_the_catalog_is_refused():
    with pytest.raises(RenderError, match=r"efa_devices_per_node = 16, but a p5\.48xlarge has 32"):
        render(stack=outputs(efa_devices_per_node=16))


def test_one_indexed_pod_per_node_no_pod_retries_and_the_job_timeout():
    job = render(nodes=3)["spec"]["replicatedJobs"][0]
    assert job["replicas"] == 1
    spec = job["template"]["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    assert spec["backoffLimit"] == 0
    assert spec["activeDeadlineSeconds"] == 72 * 3600
    assert pod_spec(render())["restartPolicy"] == "Never"


def test_exit_75_and_node_disruption_restart_the_jobset_anything_else_fails_it():
    manifest = render()
    pod_rules = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"]
    assert pod_rules[0]["onExitCodes"]["values"] == [RETRY_EXIT_CODE]
    assert pod_rules[0]["onExitCodes"]["containerName"] == pod_spec(manifest)["containers"][0]["name"]
    assert pod_rules[1]["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    assert all(rule["action"] == "FailJob" for rule in pod_rules)
    policy = manifest["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == RETRY_ATTEMPTS - 1  # attempts = the first run + restarts
    first, last = policy["rules"]
    assert (first["action"], first["onJobFailureReasons"]) == ("RestartJobSet", ["PodFailurePolicy"])
    # JobSet's own default for an unmatched failure is RestartJobSet: the catch-all must say FailJobSet.
    assert last["action"] == "FailJobSet" and "onJobFailureReasons" not in last


def test_termination_grace_exceeds_the_trainers_stop_grace():
    assert pod_spec(render())["terminationGracePeriodSeconds"] > STOP_GRACE_SECONDS
    longer = jobset_manifest("r", 2, "i", ["train"], {}, outputs(), JobSettings(600, 1))
    assert pod_spec(longer)["terminationGracePeriodSeconds"] > 600
    env = {e["name"]: e.get("value") for e in pod_spec(longer)["containers"][0]["env"]}
    assert env["TRAINSTACK_STOP_GRACE_SECONDS"] == "600"


def test_the_container_gets_the_efa_environment_the_fsx_claim_and_the_queue():
    manifest = render()
    container = pod_spec(manifest)["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    for key, value in efa_environment().items():
        assert env[key]["value"] == value
    assert env["TRAINSTACK_NUM_NODES"]["value"] == "4"
    assert env["JOBSET_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['jobset.sigs.k8s.io/jobset-name']"
    )
    assert {"name": "fsx", "mountPath": FSX_MOUNT} in container["volumeMounts"]
    assert {"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx"}} in pod_spec(manifest)["volumes"]
    assert manifest["metadata"]["labels"][QUEUE_LABEL] == "training"
    assert manifest["metadata"]["namespace"] == "trainstack"
    assert not any(
        "hostPath" in volume for volume in pod_spec(manifest)["volumes"]
    )  # devices come from plugins


def test_the_jobset_api_is_the_one_the_stack_pins():
    # The trainer cannot import infra/; the two names of the pinned API must agree.
    from infra.k8s_versions import JOBSET_API_VERSION as PINNED

    assert render()["apiVersion"] == PINNED


def test_rendering_is_deterministic_json():
    assert json.dumps(render(), sort_keys=True) == json.dumps(copy.deepcopy(render()), sort_keys=True)
    assert leader_host("llama-8b") == "llama-8b-node-0-0.llama-8b"


# The JobSet v0.12.0 admission webhook (pkg/webhooks/jobset_webhook.go): the longest pod name
# `<run>-node-0-<nodes-1>` + "-abcde" must be a DNS-1035 label (a letter first, 63 characters at most). render()
# has 4 nodes: "-node-0-3-abcde" is 15 characters, so 48 is the longest run; with 10 nodes too ("-node-0-9").
@pytest.mark.parametrize(
    ("run", "nodes", "message"),
    [
        ("Llama_8B", 4, "RUN='Llama_8B': on EKS the run names the JobSet"),
        ("8b-llama", 4, "starting with a letter"),  # DNS-1123 would take it; DNS-1035 does not
        ("-x", 4, "starting with a letter"),
        ("llama-", 4, "ending with a letter or digit"),
        (
            "a" * 49,
            4,
            "'" + "a" * 49 + "-node-0-3-abcde' \\(64 characters.*shorten the run name to at most 48",
        ),
        ("a" * 54, 10, "\\(69 characters.*at most 48"),
        ("a" * 48, 11, "\\(64 characters.*at most 47"),  # "-node-0-10"
        ("a" * 60, 4, "\\(75 characters.*at most 48"),
    ],
)
def test_a_run_name_the_jobset_webhook_refuses_is_refused_before_sending(run, nodes, message):
    with pytest.raises(RenderError, match=message):
        render(run=run, nodes=nodes)


@pytest.mark.parametrize(("run", "nodes"), [("a" * 48, 4), ("a" * 48, 10), ("l8b-llama-3", 1), ("x", 4)])
def test_a_run_name_the_jobset_webhook_accepts_renders(run, nodes):
    pod = f"{run}-node-0-{nodes - 1}-abcde"
    assert len(pod) <= 63
    assert render(run=run, nodes=nodes)["metadata"]["name"] == run


@pytest.mark.parametrize("option", ["reservation", "capacity-block", "on-demand"])
def test_the_pods_ledgers_price_what_the_stacks_gpu_nodes_are_bought_as(option):
    """The stack's purchase_option output (infra/eks.py), else On-Demand for a stack from before it."""
    container = pod_spec(render(stack=outputs(purchase_option=option)))["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRAINSTACK_PURCHASE_OPTION"] == option
    assert local_rate(BudgetConfig(price_per_hour=10.0), {**env, "JOBSET_NAME": "llama-8b"}).option == option
    before = {e["name"]: e.get("value") for e in pod_spec(render())["containers"][0]["env"]}
    assert before["TRAINSTACK_PURCHASE_OPTION"] == "on-demand"
