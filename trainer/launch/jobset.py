"""A JobSet pod on EKS (trainer/jobs/jobset.py renders it): its variables, turned into a torchrun rendezvous.

Node rank = JOB_COMPLETION_INDEX, which Kubernetes sets in every pod of an Indexed Job (Kubernetes docs, "Jobs",
completion mode Indexed). The node count is TRAINSTACK_NUM_NODES, set by the submit tool. Node rank 0 hosts the
store at its pod DNS name `<jobset>-<replicated job>-0-0.<subdomain>`: JobSet names Jobs `<jobset>-<rjob>-<job
index>` and the Indexed Job's pods `<job>-<completion index>`, under a headless service named after the JobSet
(kubernetes-sigs/jobset v0.12.0 pkg/controllers/jobset_controller.go GenJobName, GetSubdomain). That name can
resolve seconds after the pods start (pytorch/pytorch#73682: TCPStore treats an unresolvable host as fatal), or
only once node 0's pod is placed, so the lookup is retried before torchrun starts, for longer than Kueue waits for
the job's pods to be ready.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping

from trainer.contract.container import JOBSET_NAME_ENV, NUM_NODES_ENV
from trainer.contract.gpu_nodes import PODS_READY_TIMEOUT_MINUTES
from trainer.contract.jobset import COMPLETION_INDEX_ENV, REPLICATED_JOB_ENV, leader_host
from trainer.distributed.torchrun import LaunchError, Rendezvous

# Node rank 0's name resolves once its pod has an address (publishNotReadyAddresses), so a follower waits for it
# as long as Kueue waits for the job's pods, and a bit longer: Karpenter starts a job's nodes one by one
# (kubernetes-sigs/karpenter issue 3138), and while node 0's pod is pending it is Kueue's waitForPodsReady that
# evicts and requeues the whole job (infra/cluster_software.py kueue_config). A follower giving up first would
# exit, fail its Job and, through the JobSet's FailJobSet rule, fail the run for good instead of requeueing it.
DNS_DELAY_S = 2.0
DNS_WAIT_MARGIN_S = 300
DNS_ATTEMPTS = int((PODS_READY_TIMEOUT_MINUTES * 60 + DNS_WAIT_MARGIN_S) / DNS_DELAY_S)


def in_jobset(env: Mapping[str, str]) -> bool:
    return JOBSET_NAME_ENV in env


def _int_variable(env: Mapping[str, str], name: str, who: str) -> int:
    value = env.get(name)
    if value is None:
        raise LaunchError(f"{name} is not set; {who} sets it in every pod of the JobSet")
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{name}={value!r} is not an integer node index/count") from None


def resolve(
    host: str,
    lookup: Callable[[str], object] | None = None,
    attempts: int = DNS_ATTEMPTS,
    delay_s: float = DNS_DELAY_S,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Wait until `host` resolves; a LaunchError naming it after `attempts` failed lookups."""
    lookup = lookup or socket.gethostbyname
    for attempt in range(1, attempts + 1):
        try:
            lookup(host)
            return
        except OSError as error:
            if attempt == attempts:
                raise LaunchError(
                    f"node rank 0's address {host} did not resolve after {attempts} lookups "
                    f"({attempts * delay_s:.0f} s): {error}; is the JobSet's headless service there "
                    "(spec.network.enableDNSHostnames)?"
                ) from None
            sleep(delay_s)


def rendezvous_from_env(
    env: Mapping[str, str],
    lookup: Callable[[str], object] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Rendezvous:
    node_rank = _int_variable(env, COMPLETION_INDEX_ENV, "an Indexed Job")
    nnodes = _int_variable(env, NUM_NODES_ENV, "trainer/jobs/jobset.py")
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise LaunchError(
            f"inconsistent JobSet variables: {COMPLETION_INDEX_ENV}={node_rank}, {NUM_NODES_ENV}={nnodes} "
            f"(the index must lie in 0..{nnodes - 1})"
        )
    if nnodes == 1:
        return Rendezvous(nnodes=1, node_rank=0, master_addr=None)
    jobset = env[JOBSET_NAME_ENV]
    replicated_job = env.get(REPLICATED_JOB_ENV)
    if not jobset or not replicated_job:
        raise LaunchError(
            f"{JOBSET_NAME_ENV}={jobset!r}, {REPLICATED_JOB_ENV}={replicated_job!r}: both must name the JobSet and "
            "its replicated job (the pod's annotations, by fieldRef)"
        )
    leader = leader_host(jobset, replicated_job)
    resolve(leader, lookup, sleep=sleep)
    return Rendezvous(nnodes, node_rank, leader)
