"""A JobSet pod's variables become a torchrun rendezvous: node rank from the completion index, node rank 0's pod
DNS name as the store's host, looked up until it resolves. Variable names and the hostname scheme from
kubernetes-sigs/jobset v0.12.0 (jobset_types.go JobSetNameKey, ReplicatedJobNameKey; jobset_controller.go
GenJobName/GetSubdomain) and the Indexed Job's JOB_COMPLETION_INDEX."""

import socket

import pytest

from infra.cluster_software import kueue_config
from infra.config import load_stack_config
from trainer.contract.gpu_nodes import PODS_READY_TIMEOUT_MINUTES
from trainer.distributed.torchrun import LaunchError, Rendezvous
from trainer.jobs.jobset import jobset_manifest
from trainer.launch import jobset
from trainer.launch.node import add_arguments, main

from ..jobs.test_jobset import SETTINGS, outputs


def pod_env(index: int, nodes: int, name: str = "llama-8b") -> dict[str, str]:
    """The environment the rendered JobSet gives pod `index`: its literal values, and what the fieldRefs and the
    Indexed Job resolve to in that pod."""
    manifest = jobset_manifest(name, nodes, "repo:abc", ["train"], {}, outputs(), SETTINGS)
    rjob = manifest["spec"]["replicatedJobs"][0]
    annotations = {  # what JobSet puts on the pod (labelAndAnnotateObject)
        "jobset.sigs.k8s.io/jobset-name": name,
        "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
    }
    env = {"JOB_COMPLETION_INDEX": str(index)}
    for variable in rjob["template"]["spec"]["template"]["spec"]["containers"][0]["env"]:
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        else:
            path = variable["valueFrom"]["fieldRef"]["fieldPath"]
            # The node the kubelet runs the pod on (spec.nodeName), else one of JobSet's annotations.
            env[variable["name"]] = (
                "ip-10-0-1-17" if path == "spec.nodeName" else annotations[path.split("'")[1]]
            )
    return env


def resolves(host):
    return "10.0.7.1"


def test_node_rank_is_the_completion_index_and_the_store_is_pod_zero():
    assert jobset.rendezvous_from_env(pod_env(2, 4), resolves) == Rendezvous(
        4, 2, "llama-8b-node-0-0.llama-8b"
    )
    assert jobset.rendezvous_from_env(pod_env(0, 4), resolves).node_rank == 0


def test_a_single_node_jobset_is_standalone():
    assert jobset.rendezvous_from_env(pod_env(0, 1), resolves) == Rendezvous(1, 0, None)


def test_the_leader_lookup_is_retried_until_the_name_resolves():
    tries, slept = [], []

    def late_dns(host):
        tries.append(host)
        if len(tries) < 4:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return "10.0.7.1"

    rdzv = jobset.rendezvous_from_env(pod_env(1, 2), late_dns, sleep=slept.append)
    assert rdzv.master_addr == "llama-8b-node-0-0.llama-8b"
    assert tries == ["llama-8b-node-0-0.llama-8b"] * 4
    assert slept == [jobset.DNS_DELAY_S] * 3


def test_a_leader_that_never_resolves_is_named():
    def no_dns(host):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(LaunchError, match=r"llama-8b-node-0-0.llama-8b did not resolve after \d+ lookups"):
        jobset.rendezvous_from_env(pod_env(1, 2), no_dns, sleep=lambda s: None)


def test_a_follower_outwaits_kueues_pods_ready_timeout_so_a_partial_start_is_requeued_not_failed():
    # While node 0's pod is pending (its node not started yet: kubernetes-sigs/karpenter issue 3138), Kueue's
    # waitForPodsReady evicts and requeues the whole job after PODS_READY_TIMEOUT_MINUTES; a follower that gave up
    # sooner would fail its Job and the JobSet (failOnAnyOtherFailure). Counted on a fake clock.
    clock = [0.0]

    def pending_leader(host):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(LaunchError):
        jobset.rendezvous_from_env(
            pod_env(1, 2), pending_leader, sleep=lambda s: clock.__setitem__(0, clock[0] + s)
        )
    assert clock[0] > PODS_READY_TIMEOUT_MINUTES * 60
    # Kueue's timeouts, first and after a restart, are that same wait (infra/cluster_software.py).
    waits = kueue_config(load_stack_config("eks-dev"))["waitForPodsReady"]
    assert waits["timeout"] == waits["recoveryTimeout"] == f"{PODS_READY_TIMEOUT_MINUTES}m"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"JOB_COMPLETION_INDEX": None}, "JOB_COMPLETION_INDEX is not set; an Indexed Job sets it"),
        ({"JOB_COMPLETION_INDEX": "one"}, "JOB_COMPLETION_INDEX='one' is not an integer"),
        (
            {"JOB_COMPLETION_INDEX": "4"},
            r"JOB_COMPLETION_INDEX=4, TRAINSTACK_NUM_NODES=4 \(the index must lie in 0\.\.3",
        ),
        ({"TRAINSTACK_NUM_NODES": None}, "TRAINSTACK_NUM_NODES is not set"),
        ({"JOBSET_REPLICATED_JOB": None}, "JOBSET_REPLICATED_JOB=None: both must name"),
    ],
)
def test_broken_jobset_variables_are_named(change, message):
    env = pod_env(1, 4)
    for key, value in change.items():
        if value is None:
            env.pop(key)
        else:
            env[key] = value
    with pytest.raises(LaunchError, match=message):
        jobset.rendezvous_from_env(env, resolves)


def test_launch_picks_the_jobset_backend_in_a_jobset_pod(monkeypatch, capsys):
    import argparse

    monkeypatch.setattr(jobset.socket, "gethostbyname", resolves)
    for key, value in pod_env(3, 4).items():
        monkeypatch.setenv(key, value)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert main(parser.parse_args(["--nproc-per-node", "8", "--dry-run", "train", "--config", "c.yaml"])) == 0
    printed = capsys.readouterr().out
    assert "--nnodes=4 --node-rank=3 --master-addr=llama-8b-node-0-0.llama-8b --master-port=29500" in printed
