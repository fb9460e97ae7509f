"""What an EKS stack installs inside its cluster: device plugins, JobSet, Kueue, the FSx volume and the job queue.

pulumi-kubernetes `helm.v3.Release` for the charts pinned in infra/k8s_versions.py (their inputs are visible under
the project's mocks; `helm.v4.Chart` is not), typed core/v1 objects for the namespace and the static FSx volume,
and Kueue's ResourceFlavor, ClusterQueue and LocalQueue as custom resources. Every object is built by a pure
function below from the stack config, so tests and `infra.k8s_validate` check exactly what the stack sends:

- the FSx volume: the stack's file system, statically provisioned as the CSI driver's example does it
  (kubernetes-sigs/aws-fsx-csi-driver examples/kubernetes/static_provisioning), bound by name to one claim;
- the queue: one flavor for the GPU node group's instance type, a ClusterQueue whose quota is whole nodes of the
  stack (GPUs and EFA devices from the catalog, so a job either fits entirely or waits: kubernetes-sigs/kueue issue
  2796), and the LocalQueue jobs name in the `kueue.x-k8s.io/queue-name` label (with `trainstack:teams`, one of
  each per team in a cohort instead: infra/eks_teams.py);
- Kueue's own configuration: `waitForPodsReady`, so a job whose nodes do not all come up in time is evicted and
  requeued, never left running on part of them;
- Karpenter and its node class, pool and hugepages overlay (infra/karpenter.py), except on a Capacity Block stack,
  whose managed node group holds the block's nodes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from infra import eks_access, karpenter, karpenter_interruption, node_quarantine
from infra.config import StackConfig
from infra.eks import GPU_NODE_LABELS, efa_devices, eks_network_interfaces
from infra.k8s_versions import (
    EFA_DEVICE_PLUGIN,
    HELM_CHARTS,
    JOBSET,
    KARPENTER,
    KARPENTER_AWS_API_VERSION,
    KUBERNETES_MINOR,
    KUEUE,
    KUEUE_API_VERSION,
    NVIDIA_DEVICE_PLUGIN,
    HelmChart,
)
from trainer.contract.gpu_nodes import GPU_TOLERATION, PODS_READY_TIMEOUT_MINUTES
from trainer.contract.teams import TEAM_SERVICE_ACCOUNT

if TYPE_CHECKING:
    from infra.eks import Eks
    from infra.lustre import Lustre

# Where the stack's jobs run, and the names `make train` reads back from the stack outputs.
NAMESPACE = "trainstack"
FSX_CLAIM = "fsx"
# Extended resources the device plugins advertise (EKS user guide, "Run machine learning training on Amazon EKS with
# Elastic Fabric Adapter": `nvidia.com/gpu`, `vpc.amazonaws.com/efa`).
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
# What the EFA driver pre-allocates on each node (infra/karpenter.py names the source); pods ask for part of it.
HUGEPAGES_RESOURCE = karpenter.HUGEPAGES_RESOURCE
HUGEPAGES_PER_NODE_MIB = karpenter.HUGEPAGES_PER_NODE_MIB
# An admitted job whose pods are not all ready in this long is evicted and requeued (Kueue waitForPodsReady.timeout:
# kubernetes-sigs/kueue v0.19.2 apis/config/v1beta2/configuration_types.go). A p5 from Karpenter needs its launch,
# boot, the device plugins and an image pull of several GB; Kueue's own example timeout (5m) is for CPU pods.
PODS_READY_TIMEOUT = f"{PODS_READY_TIMEOUT_MINUTES}m"
# The Kueue Configuration the chart ships (kubernetes-sigs/kueue v0.19.2 charts/kueue/values.yaml,
# managerConfig.controllerManagerConfigYaml), kept whole because a release's value replaces the whole file.
KUEUE_DEFAULT_CONFIG: dict[str, Any] = {
    "apiVersion": "config.kueue.x-k8s.io/v1beta2",
    "kind": "Configuration",
    "health": {"healthProbeBindAddress": ":8081"},
    "metrics": {"bindAddress": ":8443"},
    "webhook": {"port": 9443},
    "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
    "controller": {
        "groupKindConcurrency": {
            "Job.batch": 5,
            "Pod": 5,
            "Workload.kueue.x-k8s.io": 10,
            "LocalQueue.kueue.x-k8s.io": 5,
            "ClusterQueue.kueue.x-k8s.io": 5,
            "ResourceFlavor.kueue.x-k8s.io": 1,
        }
    },
    "clientConnection": {"qps": 300, "burst": 500},
    "integrations": {
        "frameworks": [
            "batch/job",
            "kubeflow.org/mpijob",
            "ray.io/rayjob",
            "ray.io/rayservice",
            "ray.io/raycluster",
            "jobset.x-k8s.io/jobset",
            "workload.codeflare.dev/appwrapper",
            "trainer.kubeflow.org/trainjob",
            "pod",
            "deployment",
            "statefulset",
            "leaderworkerset.x-k8s.io/leaderworkerset",
        ]
    },
}
# The node label every node of a managed node group carries (Kubernetes well-known labels); the flavor selects by it.
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# Marks what the stack put in the cluster.
JOB_LABELS = {"app.kubernetes.io/part-of": "trainstack"}
# Pod Security Admission on the namespaces jobs run in (Kubernetes "Pod Security Admission": with no label and no
# cluster configuration the level is privileged). Restricted, not baseline: a training pod needs no privilege at
# all (GPUs and EFA devices are extended resources from the device plugins, hugepages a resource, /dev/shm an
# emptyDir, the file system a PVC: volume types the restricted level allows), and restricted adds runAsNonRoot, no
# privilege escalation, every capability dropped and a seccomp profile, which the JobSet sets (trainer/jobs/
# jobset.py). Enforced, and warned and audited too, at the cluster's own minor ("Pod Security Standards").
POD_SECURITY_LEVEL = "restricted"
POD_SECURITY_LABELS = {
    f"pod-security.kubernetes.io/{mode}{suffix}": value
    for mode in ("enforce", "warn", "audit")
    for suffix, value in (("", POD_SECURITY_LEVEL), ("-version", f"v{KUBERNETES_MINOR}"))
}


def namespace() -> dict[str, Any]:
    labels = {**JOB_LABELS, **POD_SECURITY_LABELS}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": labels}}


def fsx_persistent_volume(
    cfg: StackConfig, file_system_id: str, dns_name: str, mount_name: str
) -> dict[str, Any]:
    """The stack's file system as a cluster volume, kept when the claim goes (Retain), mounted with `flock`."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{cfg.name_prefix}-fsx", "labels": JOB_LABELS},
        "spec": {
            "capacity": {"storage": f"{cfg.fsx_storage_capacity_gib}Gi"},
            "volumeMode": "Filesystem",
            "accessModes": ["ReadWriteMany"],
            # Passed to mount.lustre by the FSx CSI driver: flock coherent across nodes (mount.lustre(8)), for a run's
            # lock on its directory (trainer/launch/run_lock.py), as the Batch nodes mount it (infra/node_bootstrap.py).
            "mountOptions": ["flock"],
            "persistentVolumeReclaimPolicy": "Retain",
            # No provisioner: a static volume is bound by name only, never by a class's dynamic provisioning.
            "storageClassName": "",
            "claimRef": {"namespace": NAMESPACE, "name": FSX_CLAIM},
            "csi": {
                "driver": "fsx.csi.aws.com",
                "volumeHandle": file_system_id,
                "volumeAttributes": {"dnsname": dns_name, "mountname": mount_name},
            },
        },
    }


def fsx_claim(cfg: StackConfig) -> dict[str, Any]:
    """The claim jobs mount at the container contract's /fsx, bound to the stack's volume by name."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": FSX_CLAIM, "namespace": NAMESPACE, "labels": JOB_LABELS},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": f"{cfg.name_prefix}-fsx",
            "resources": {"requests": {"storage": f"{cfg.fsx_storage_capacity_gib}Gi"}},
        },
    }


def resource_flavor(cfg: StackConfig) -> dict[str, Any]:
    """The GPU node group's nodes, told apart by their instance type."""
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": cfg.instance_type.replace(".", "-")},
        "spec": {"nodeLabels": {INSTANCE_TYPE_LABEL: cfg.instance_type}},
    }


def node_quota(cfg: StackConfig) -> dict[str, int | str]:
    """What `nodeCount` nodes of the stack's instance type offer, per resource a training pod asks for."""
    instance, nodes = cfg.instance, cfg.node_count
    return {
        "cpu": nodes * instance.vcpus,
        "memory": f"{nodes * instance.memory_gib}Gi",
        HUGEPAGES_RESOURCE: f"{nodes * HUGEPAGES_PER_NODE_MIB}Mi",
        GPU_RESOURCE: nodes * instance.gpus,
        EFA_RESOURCE: nodes * efa_devices(eks_network_interfaces(instance, [])),
    }


def cluster_queue(cfg: StackConfig) -> dict[str, Any]:
    """Quota for whole jobs of the stack's nodes; Kueue admits a job only when all of it fits (gang admission)."""
    quota = node_quota(cfg)
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": cfg.name_prefix},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
            # First come, first served: a big job waiting is not overtaken by smaller ones forever.
            "queueingStrategy": "StrictFIFO",
            "resourceGroups": [
                {
                    "coveredResources": list(quota),
                    "flavors": [
                        {
                            "name": resource_flavor(cfg)["metadata"]["name"],
                            "resources": [
                                {"name": name, "nominalQuota": value} for name, value in quota.items()
                            ],
                        }
                    ],
                }
            ],
        },
    }


def local_queue_name(cfg: StackConfig) -> str:
    """The LocalQueue jobs go to, named after the stack: the trainer's `JobQueue` metric dimension on EKS, unique
    per stack in an account as a Batch queue's name is (infra/monitoring.py alarms on it)."""
    return cfg.name_prefix


def local_queue(cfg: StackConfig) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": local_queue_name(cfg), "namespace": NAMESPACE},
        "spec": {"clusterQueue": cfg.name_prefix},
    }


def gpu_node_affinity() -> dict[str, Any]:
    """Only the GPU node group's nodes (the EFA plugin on other nodes crash-loops: sagemaker-hyperpod-cli issue 367)."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": key, "operator": "In", "values": [value]}
                            for key, value in sorted(GPU_NODE_LABELS.items())
                        ]
                    }
                ]
            }
        }
    }


def kueue_config(cfg: StackConfig) -> dict[str, Any]:
    """Kueue's Configuration: the chart's, plus waitForPodsReady, and Fair Sharing when teams share the cohort.

    waitForPodsReady (kubernetes-sigs/kueue v0.19.2 configuration_types.go WaitForPodsReady): an admitted job whose
    pods are not all ready within the timeout is evicted and requeued, so a job Karpenter could start only part of
    frees those nodes instead of holding them; `blockAdmission` admits the next job only once the last one's pods
    are all ready, so two half-provisioned jobs never wait on each other. Fair Sharing (site/content/en/docs/
    concepts/preemption.md, "Fair Sharing": enabled by a `fairSharing` section) shares the cohort's unused quota by
    the ClusterQueues' weights and preempts a borrower to give a team back its share."""
    config = json.loads(json.dumps(KUEUE_DEFAULT_CONFIG))
    config["waitForPodsReady"] = {
        "timeout": PODS_READY_TIMEOUT,
        # The same wait after a restart, when a replacement pod is pending (configuration_types.go RecoveryTimeout:
        # "If not set, there is no timeout"): a JobSet restarted onto a node that never comes is requeued too.
        "recoveryTimeout": PODS_READY_TIMEOUT,
        "blockAdmission": True,
        "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 60, "backoffMaxSeconds": 3600},
    }
    if cfg.teams:
        config["fairSharing"] = {
            "preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]
        }
    return config


def charts(cfg: StackConfig) -> tuple[HelmChart, ...]:
    """The releases a stack installs: every pinned chart, Karpenter only where it makes the GPU nodes."""
    return tuple(chart for chart in HELM_CHARTS if chart is not KARPENTER or not cfg.capacity_block)


def chart_values(chart: HelmChart, cfg: StackConfig) -> dict[str, Any]:
    """Each release's values: the device plugins on the (tainted) GPU nodes only; Karpenter's cluster and feature
    gates; Kueue's configuration; JobSet at its defaults (Kueue 0.19.2 manages JobSets by default)."""
    if chart is NVIDIA_DEVICE_PLUGIN:
        return {"affinity": gpu_node_affinity(), "tolerations": [dict(GPU_TOLERATION)]}
    if chart is EFA_DEVICE_PLUGIN:
        # Its chart tolerates nothing by default (aws/eks-charts stable/aws-efa-k8s-device-plugin values.yaml).
        return {"nodeSelector": dict(GPU_NODE_LABELS), "tolerations": [dict(GPU_TOLERATION)]}
    if chart is KARPENTER:
        return karpenter.chart_values(
            cfg.eks_cluster_name, cfg.region, karpenter_interruption.queue_name(cfg)
        )
    if chart is KUEUE:
        return {
            "managerConfig": {
                "controllerManagerConfigYaml": yaml.safe_dump(kueue_config(cfg), sort_keys=False)
            }
        }
    return {}


def values_as_pod(chart: HelmChart, cfg: StackConfig) -> dict[str, Any]:
    """A chart's Kubernetes-typed values placed in a Pod, so the offline validator checks their schema."""
    values = chart_values(chart, cfg)
    spec: dict[str, Any] = {"containers": [{"name": chart.release, "image": "registry.invalid/plugin"}]}
    spec.update({key: values[key] for key in ("affinity", "nodeSelector", "tolerations") if key in values})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": chart.release}, "spec": spec}


@dataclass
class ClusterSoftwareArgs:
    config: StackConfig
    eks: Eks
    lustre: Lustre


class ClusterSoftware(pulumi.ComponentResource):
    """The charts, the FSx volume and claim, and the Kueue queue, applied through the stack's own EKS cluster."""

    def __init__(
        self, name: str, args: ClusterSoftwareArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:cluster_software:ClusterSoftware", name, None, opts)
        cfg, eks = args.config, args.eks
        prefix = cfg.name_prefix
        self.provider = k8s.Provider(
            f"{prefix}-k8s",
            # Made only once the deployer is known to be an admin (infra/eks_access.py).
            kubeconfig=pulumi.Output.all(
                eks.cluster.name, eks.cluster.endpoint, eks.outputs["eks_cluster_ca"], eks.deployer
            ).apply(lambda values: eks_access.kubeconfig(cfg.region, *values[:3])),
            # The admins' entries and associations: created before the first Kubernetes call, deleted after the
            # last (every object and release depends on this provider).
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[
                    eks.system_nodes,
                    *([eks.gpu_nodes] if eks.gpu_nodes else []),
                    *eks.admin_access,
                ],
            ),
        )
        on_cluster = pulumi.ResourceOptions(parent=self, provider=self.provider)
        # Karpenter's controller starts with its Pod Identity's credentials (infra/karpenter.py `chart_values`).
        identity = [eks.karpenter_identity] if KARPENTER.release in {c.release for c in charts(cfg)} else []
        self.releases = {
            chart.release: k8s.helm.v3.Release(
                chart.release,
                name=chart.release,
                chart=chart.chart,
                version=chart.version,
                namespace=chart.namespace,
                create_namespace=True,
                repository_opts={"repo": chart.repository} if chart.repository else None,
                values=chart_values(chart, cfg),
                opts=pulumi.ResourceOptions(
                    parent=self, provider=self.provider, depends_on=identity if chart is KARPENTER else []
                ),
            )
            for chart in charts(cfg)
        }
        self.node_objects: list[k8s.apiextensions.CustomResource] = []
        if KARPENTER.release in self.releases:
            self.node_objects = self._karpenter_objects(cfg, eks)
        ns = namespace()
        self.namespace = k8s.core.v1.Namespace(prefix, metadata=ns["metadata"], opts=on_cluster)
        file_system = args.lustre.file_system
        volume = pulumi.Output.all(file_system.id, file_system.dns_name, file_system.mount_name).apply(
            lambda fs: fsx_persistent_volume(cfg, fs[0], fs[1], fs[2])
        )
        self.volume = k8s.core.v1.PersistentVolume(
            f"{prefix}-fsx",
            metadata=volume.apply(lambda v: v["metadata"]),
            spec=volume.apply(lambda v: v["spec"]),
            opts=on_cluster,
        )
        claim = fsx_claim(cfg)
        self.claim = k8s.core.v1.PersistentVolumeClaim(
            f"{prefix}-fsx-claim",
            metadata=claim["metadata"],
            spec=claim["spec"],
            opts=pulumi.ResourceOptions(
                parent=self, provider=self.provider, depends_on=[self.namespace, self.volume]
            ),
        )
        # Kueue's webhooks must be up before its objects are created (the release waits for its pods).
        after_kueue = pulumi.ResourceOptions(
            parent=self, provider=self.provider, depends_on=[self.releases[KUEUE.release], self.namespace]
        )
        self.queue_objects = [
            custom_resource(f"{prefix}-{obj['kind'].lower()}", obj, after_kueue)
            # With teams, each team's ClusterQueue and LocalQueue instead (infra/eks_teams.py).
            for obj in (resource_flavor(cfg), *(() if cfg.teams else (cluster_queue(cfg), local_queue(cfg))))
        ]
        # The stack's own jobs run as `trainer` here too, never as the namespace's `default` (checkov CKV_K8S_42).
        k8s_object(
            f"{prefix}-trainer",
            {"kind": "ServiceAccount", "metadata": {"name": TEAM_SERVICE_ACCOUNT, "namespace": NAMESPACE}},
            pulumi.ResourceOptions(parent=self, provider=self.provider, depends_on=[self.namespace]),
        )
        # A job's pod may taint and delete its own failed node, and nothing else (infra/node_quarantine.py).
        for obj in node_quarantine.quarantine_objects(node_quarantine.job_service_accounts(cfg, NAMESPACE)):
            k8s_object(f"{prefix}-quarantine-{obj['kind'].lower()}", obj, on_cluster)
        assert (
            JOBSET.release in self.releases
        )  # JobSet's CRD comes with its chart, before any job is submitted
        self.outputs = {
            "k8s_namespace": NAMESPACE,
            "kueue_local_queue": local_queue_name(cfg),
            "fsx_claim": FSX_CLAIM,
        }
        self.register_outputs(self.outputs)

    def _karpenter_objects(self, cfg: StackConfig, eks: Eks) -> list[k8s.apiextensions.CustomResource]:
        """The GPU node class, pool and hugepages overlay, once Karpenter (and so its CRDs) is installed."""
        interfaces = eks_network_interfaces(cfg.instance, [])
        group = eks.placement_group.name if eks.placement_group is not None else None
        node_class = pulumi.Output.all(
            eks.karpenter_node_role.name,
            eks.gpu_subnet_id,
            pulumi.Output.all(*eks.gpu_security_groups),
            group,
            eks.key_arn,
        ).apply(
            lambda v: karpenter.ec2_node_class(
                cfg,
                interfaces,
                role=v[0],
                subnet_id=v[1],
                security_group_ids=list(v[2]),
                placement_group=v[3],
                key_arn=v[4],
            )
        )
        after = pulumi.ResourceOptions(
            parent=self,
            provider=self.provider,
            depends_on=[self.releases[KARPENTER.release], eks.karpenter_node_access],
        )
        objects = [
            k8s.apiextensions.CustomResource(
                f"{cfg.name_prefix}-ec2nodeclass",
                api_version=KARPENTER_AWS_API_VERSION,
                kind="EC2NodeClass",
                metadata=node_class.apply(lambda o: o["metadata"]),
                spec=node_class.apply(lambda o: o["spec"]),
                opts=after,
            )
        ]
        for obj in (karpenter.node_pool(cfg, GPU_NODE_LABELS), karpenter.node_overlay(cfg)):
            objects.append(custom_resource(f"{cfg.name_prefix}-{obj['kind'].lower()}", obj, after))
        return objects


def k8s_object(name: str, obj: dict[str, Any], opts: pulumi.ResourceOptions) -> pulumi.Resource:
    """A Kubernetes object as the provider sends it (typed where pulumi-kubernetes has the kind)."""
    typed = {
        "Namespace": k8s.core.v1.Namespace,
        "ServiceAccount": k8s.core.v1.ServiceAccount,
        "PersistentVolumeClaim": k8s.core.v1.PersistentVolumeClaim,
        "Role": k8s.rbac.v1.Role,
        "RoleBinding": k8s.rbac.v1.RoleBinding,
        "ClusterRole": k8s.rbac.v1.ClusterRole,
        "ClusterRoleBinding": k8s.rbac.v1.ClusterRoleBinding,
        "ValidatingAdmissionPolicy": k8s.admissionregistration.v1.ValidatingAdmissionPolicy,
        "ValidatingAdmissionPolicyBinding": k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding,
    }.get(obj["kind"])
    if typed is None:
        return custom_resource(name, obj, opts)
    body = {
        {"roleRef": "role_ref"}.get(key, key): value
        for key, value in obj.items()
        if key not in ("apiVersion", "kind")
    }
    return typed(name, **body, opts=opts)


def custom_resource(
    name: str, obj: dict[str, Any], opts: pulumi.ResourceOptions
) -> k8s.apiextensions.CustomResource:
    """A custom resource exactly as built (apiVersion, kind, metadata, spec)."""
    return k8s.apiextensions.CustomResource(
        name,
        api_version=obj["apiVersion"],
        kind=obj["kind"],
        metadata=obj["metadata"],
        spec=obj["spec"],
        opts=opts,
    )
