"""The JobSet an EKS stack receives for a run: one replicated job of N Indexed pods, one pod per node.

A pure function of the submission and the stack's outputs (no AWS or API call): `make render` prints it and
`make train` sends exactly it. The pod asks for every GPU and EFA device of a node (so one pod fits a node),
hugepages for EFA, the FSx claim at /fsx, the image's NCCL/EFA environment, a termination grace above the trainer's
stop grace, and the job timeout. Retries: exit code 75 and node disruption restart the whole JobSet up to the
stack's attempts; any other failure ends it (JobSet restarts an unmatched failure by default, so the last rule
says FailJobSet explicitly).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from trainer.aws.outputs import StackOutputs
from trainer.contract.catalog import InstanceType, instance_type
from trainer.contract.container import (
    CHECKPOINTS_DIR,
    CONTAINER_UID,
    FSX_MOUNT,
    JOBSET_NAME_ENV,
    NUM_NODES_ENV,
    PURCHASE_OPTION_ENV,
    STOP_TIMEOUT_MARGIN_SECONDS,
)
from trainer.contract.gpu_nodes import GPU_TOLERATION, NODE_NAME_ENV
from trainer.contract.image import efa_environment
from trainer.contract.jobset import (
    JOBSET_NAME_KEY,
    QUEUE_LABEL,
    REPLICATED_JOB,
    REPLICATED_JOB_ENV,
    REPLICATED_JOB_KEY,
)
from trainer.contract.outputs import PURCHASE_OPTION_OUTPUT
from trainer.contract.retry import RETRY_ATTEMPTS, RETRY_EXIT_CODE
from trainer.contract.teams import TEAM_SERVICE_ACCOUNT, TEAM_TAG, team_directories
from trainer.jobs.teams import job_namespace
from trainer.monitoring.cloudwatch import JOB_QUEUE_ENV

# The pinned JobSet API (kubernetes-sigs/jobset v0.12.0, api/jobset/v1alpha2; ../shared/k8s-crds/).
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
CONTAINER = "trainer"
RUN_LABEL = "trainstack.dev/run"
# The EFA device plugin's resource and AWS's p5 pod example beside it (EKS user guide, ml/node-efa.adoc):
# instances with the EFA driver pre-allocate 2 MiB hugepages, and a pod that asks for hugepages must ask for memory.
EFA_RESOURCE = "vpc.amazonaws.com/efa"
GPU_RESOURCE = "nvidia.com/gpu"
HUGEPAGES = ("hugepages-2Mi", "5120Mi")
MEMORY_REQUEST = "32000Mi"
# Kubernetes well-known label the kubelet sets from the EC2 instance type (kubernetes.io/docs/reference/labels-
# annotations-taints/, node.kubernetes.io/instance-type).
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# The JobSet admission webhook's name rule (jobset v0.12.0 pkg/webhooks/jobset_webhook.go ValidateCreate): the longest
# Job name `<jobset>-<rjob>-<replicas-1>` and the longest pod name `<jobset>-<rjob>-<job index>-<pod index>` plus
# a 6-character `-abcde` stand-in for the pod's random suffix (pkg/util/placement GenJobName, GenPodName) must each
# be a DNS-1035 label (k8s.io/apimachinery validation.IsDNS1035Label: a lower-case letter first, then lower-case
# letters, digits and '-', ending in a letter or digit, 63 characters at most); else the API server answers 422.
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63
POD_SUFFIX = "-abcde"
# Job failure reasons (Kubernetes batch/v1 JobConditionReason): a podFailurePolicy FailJob rule ends the Job with this.
POD_FAILURE_POLICY_REASON = "PodFailurePolicy"


class RenderError(ValueError):
    """A run that cannot become a JobSet; the message names the value and what would be valid."""


@dataclass(frozen=True)
class JobSettings:
    """What the stack's config says about every job: the trainer's SIGTERM grace, the timeout, the attempts."""

    stop_grace_seconds: int
    job_timeout_hours: int
    attempts: int = RETRY_ATTEMPTS


def jobset_name_problems(run: str, nodes: int) -> list[str]:
    """The JobSet webhook's refusals of `run` as the name of a JobSet of `nodes` pods (see DNS_1035_LABEL)."""
    if not DNS_1035_LABEL.match(run):
        return [
            f"RUN={run!r}: on EKS the run names the JobSet, its Jobs and pods (DNS-1035 labels): use lower-case "
            "letters, digits and '-', starting with a letter and ending with a letter or digit"
        ]
    job = f"{run}-{REPLICATED_JOB}-0"
    pod = f"{job}-{nodes - 1}{POD_SUFFIX}"
    if len(pod) > DNS_LABEL_MAX:
        return [
            f"RUN={run!r}: the JobSet webhook checks the last pod's name as {pod!r} ({len(pod)} characters, with "
            f"room for its 6-character random suffix); a DNS label holds {DNS_LABEL_MAX}: shorten the run name to "
            f"at most {len(run) - (len(pod) - DNS_LABEL_MAX)}"
        ]
    return []


def efa_devices(outputs: StackOutputs, instance: InstanceType) -> int:
    """The EFA devices each pod asks for: the stack's, which must be the catalog's for its instance type."""
    exported = outputs._count("efa_devices_per_node")
    if exported != instance.efa_interfaces:
        raise RenderError(
            f"stack {outputs.stack}: output efa_devices_per_node = {exported}, but a {instance.name} has "
            f"{instance.efa_interfaces} EFA interfaces (trainer/contract/catalog.py); run make up with this checkout"
        )
    return exported


def jobset_manifest(
    run: str,
    nodes: int,
    image: str,
    command: list[str],
    environment: dict[str, str],
    outputs: StackOutputs,
    settings: JobSettings,
    team: str | None = None,
) -> dict[str, Any]:
    """The JobSet object for `run` on the stack (for `team`: in its namespace, as its service account, with its
    `team` label), as the API server receives it."""
    if problems := jobset_name_problems(run, nodes):
        raise RenderError("; ".join(problems))
    instance = instance_type(outputs["instance_type"])
    efa = efa_devices(outputs, instance)
    devices = {GPU_RESOURCE: str(outputs.gpus_per_node), HUGEPAGES[0]: HUGEPAGES[1]}
    if efa:
        devices[EFA_RESOURCE] = str(efa)
    env = {
        **efa_environment(),
        "TRAINSTACK_INSTANCE_TYPE": instance.name,
        "TRAINSTACK_CHECKPOINT_ROOT": CHECKPOINTS_DIR,
        "TRAINSTACK_STOP_GRACE_SECONDS": str(settings.stop_grace_seconds),
        NUM_NODES_ENV: str(nodes),
        "AWS_REGION": outputs.region,  # the SDKs' Region (and the ledger's price and grid, trainer/cost/ledger.py)
        JOB_QUEUE_ENV: outputs["kueue_local_queue"],  # the metrics' JobQueue dimension, as Batch's queue name
        # What the ledger prices node-hours at: the stack's GPU nodes (EKS_PRICING_OUTPUTS), else On-Demand
        PURCHASE_OPTION_ENV: str(outputs.values.get(PURCHASE_OPTION_OUTPUT, "on-demand")),
        **environment,
    }
    # The team under Batch's `team` tag key (trainer/contract/teams.py TEAM_TAG); a job of no team has none, the
    # stack's STACK_TEAM being no label value (one starts and ends with a letter or digit: Kubernetes "Labels and
    # Selectors", syntax and character set).
    labels = {RUN_LABEL: run, **({TEAM_TAG: team} if team else {})}
    from_annotation = {JOBSET_NAME_ENV: JOBSET_NAME_KEY, REPLICATED_JOB_ENV: REPLICATED_JOB_KEY}
    container = {
        "name": CONTAINER,
        "image": image,
        "args": command,  # the image's entrypoint runs `trainer launch <args>`
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())]
        + [
            {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}}}
            for name, key in from_annotation.items()
        ]
        # The node, for the preflight's quarantine of a node that fails it (trainer/preflight/quarantine.py).
        + [{"name": NODE_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "resources": {"requests": {**devices, "memory": MEMORY_REQUEST}, "limits": devices},
        "volumeMounts": [*fsx_mounts(team), {"name": "shm", "mountPath": "/dev/shm"}],
        # What the restricted Pod Security level requires of a container (Kubernetes "Pod Security Standards",
        # restricted: allowPrivilegeEscalation false, every capability dropped); a team namespace enforces it.
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    pod_spec = {
        # A job's pods run as the namespace's `trainer` service account, never `default`: a team's has a Pod Identity
        # that reads only its S3 prefix (infra/eks_teams.py); both may quarantine their own node
        # (infra/node_quarantine.py).
        "serviceAccountName": TEAM_SERVICE_ACCOUNT,
        "restartPolicy": "Never",  # a podFailurePolicy needs it; restarts are the JobSet's
        # Above the trainer's SIGTERM grace, by the margin the Batch nodes' ECS stop timeout keeps
        # (trainer/contract/container.py), so a cancelled or preempted pod saves before SIGKILL.
        "terminationGracePeriodSeconds": termination_grace_seconds(settings.stop_grace_seconds),
        "nodeSelector": {INSTANCE_TYPE_LABEL: instance.name},
        # The GPU nodes are tainted for the pods meant for them (trainer/contract/gpu_nodes.py).
        "tolerations": [dict(GPU_TOLERATION)],
        # Not root, as the image (image/Dockerfile USER), and the runtime's default seccomp profile: the rest of
        # the restricted level (runAsNonRoot, seccompProfile RuntimeDefault or Localhost).
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": CONTAINER_UID,
            "runAsGroup": CONTAINER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            *fsx_volumes(outputs, team),
            # PyTorch data workers and NCCL's intra-node transport live in /dev/shm: an eighth of the node's
            # memory, as the Batch job definition gives (infra/cluster.py sharedMemorySize).
            {
                "name": "shm",
                "emptyDir": {"medium": "Memory", "sizeLimit": f"{instance.memory_gib * 1024 // 8}Mi"},
            },
        ],
    }
    job_spec = {
        "completionMode": "Indexed",
        "completions": nodes,
        "parallelism": nodes,
        "backoffLimit": 0,
        # The timeout per attempt, as Batch's attemptDurationSeconds; a Job past it fails with DeadlineExceeded.
        "activeDeadlineSeconds": settings.job_timeout_hours * 3600,
        # Exit 75 (trainer/contract/retry.py) and a node taken away (the DisruptionTarget pod condition) fail the
        # Job with reason PodFailurePolicy, which the JobSet restarts; pattern of jobset v0.12.0
        # site/static/examples/failure-policy/host-maintenance-event-model.yaml.
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": CONTAINER,
                        "operator": "In",
                        "values": [RETRY_EXIT_CODE],
                    },
                },
                {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]
        },
        "template": {"metadata": {"labels": labels}, "spec": pod_spec},
    }
    return {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": {
            "name": run,
            "namespace": job_namespace(outputs, team),
            # Every team's LocalQueue has the stack's queue name: the namespace says whose quota (docs/eks.md#teams).
            "labels": {QUEUE_LABEL: outputs["kueue_local_queue"], **labels},
        },
        "spec": {
            # Pods find node rank 0 by name, also before it is ready (both are JobSet's defaults, relied on here).
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "failurePolicy": {
                # JobSet counts restarts, Batch attempts: the first run plus maxRestarts.
                "maxRestarts": settings.attempts - 1,
                "rules": [
                    {
                        "name": "restartOnRetryCodeOrDisruption",
                        "action": "RestartJobSet",
                        "onJobFailureReasons": [POD_FAILURE_POLICY_REASON],
                    },
                    # Without this rule JobSet restarts every other failure too (jobset v0.12.0 jobset_types.go:
                    # "If no matching rule is found, the RestartJobSet action is applied").
                    {"name": "failOnAnyOtherFailure", "action": "FailJobSet"},
                ],
            },
            "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1, "template": {"spec": job_spec}}],
        },
    }


def fsx_mounts(team: str | None) -> list[dict[str, str]]:
    """The stack's whole file system at /fsx; for a team, its two directories only, each at its own path
    (trainer/contract/teams.py TEAM_CLAIMS: the team's volumes are Lustre filesets of those directories)."""
    if not team:
        return [{"name": "fsx", "mountPath": FSX_MOUNT}]
    return [
        {"name": claim, "mountPath": f"{FSX_MOUNT}/{directory}"}
        for claim, directory in team_directories(team).items()
    ]


def fsx_volumes(outputs: StackOutputs, team: str | None) -> list[dict[str, Any]]:
    if not team:
        return [{"name": "fsx", "persistentVolumeClaim": {"claimName": outputs["fsx_claim"]}}]
    return [
        {"name": claim, "persistentVolumeClaim": {"claimName": claim}} for claim in team_directories(team)
    ]


def termination_grace_seconds(stop_grace_seconds: int) -> int:
    return stop_grace_seconds + STOP_TIMEOUT_MARGIN_SECONDS
