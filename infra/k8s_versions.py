"""What an EKS stack runs inside its cluster, pinned in one place: the Kubernetes minor, the Helm charts, the add-ons.

Every pin names its source; `fixed` is the first version past a bug that breaks EFA training (the policy pack refuses
anything older), `version` is what the stack installs. Pure data: imported by infra, policy, the validators and the
job tools alike, so it imports neither pulumi nor the Kubernetes client.
"""

from __future__ import annotations

from dataclasses import dataclass

# The cluster's Kubernetes minor: ai-on-eks's default (awslabs/ai-on-eks base Terraform variables.tf,
# `eks_cluster_version`), in EKS standard support (docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html).
# The offline validator checks built-in kinds against this minor's OpenAPI schemas.
KUBERNETES_MINOR = "1.34"

# The JobSet API the pinned CRD serves (kubernetes-sigs/jobset v0.12.0 api/jobset/v1alpha2/jobset_types.go).
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
# Kueue's storage version at v0.19.2 (kubernetes-sigs/kueue v0.19.2 apis/kueue/v1beta2/clusterqueue_types.go).
KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"


@dataclass(frozen=True)
class HelmChart:
    """One Helm chart an EKS stack installs with helm.v3.Release."""

    release: str  # the Helm release name (and the Pulumi resource name)
    chart: str  # chart name, or the full oci:// reference for charts served from an OCI registry
    repository: str | None  # the chart repository URL; None for an oci:// chart
    version: str
    namespace: str
    fixed: str  # the oldest CHART version the policy pack accepts (a release names the chart's version)
    app_version: str | None = None  # the software the chart runs, where its version differs from the chart's


# NVIDIA device plugin: 0.19.0 turned MOFED on and handed every GPU container all /dev/infiniband devices, fixed in
# 0.19.3 (NVIDIA/k8s-device-plugin issue 1692); repo and chart name from the project README's `helm repo add nvdp`.
NVIDIA_DEVICE_PLUGIN = HelmChart(
    release="nvidia-device-plugin",
    chart="nvidia-device-plugin",
    repository="https://nvidia.github.io/k8s-device-plugin",
    version="0.19.3",
    namespace="kube-system",
    fixed="0.19.3",
)

# AWS EFA device plugin: before plugin 0.5.10 it counted NVLink ibp* devices as EFA on p6-b200 (aws/sagemaker-hyperpod-cli
# pull 282). The chart is versioned apart from the plugin: chart v0.5.18 is the first whose appVersion (the image tag
# by default) is v0.5.10, and chart v0.5.26, ai-on-eks's pin (its base Terraform variables.tf), runs plugin v0.5.18
# (aws/eks-charts stable/aws-efa-k8s-device-plugin/Chart.yaml history, `version` vs `appVersion`); so the floor the
# policy pack compares a release's chart version with is the chart's, not the plugin's
# (`helm repo add eks https://aws.github.io/eks-charts`).
EFA_DEVICE_PLUGIN = HelmChart(
    release="aws-efa-k8s-device-plugin",
    chart="aws-efa-k8s-device-plugin",
    repository="https://aws.github.io/eks-charts",
    version="0.5.26",
    namespace="kube-system",
    fixed="0.5.18",
    app_version="0.5.18",
)

# JobSet v0.12.0, the version Kubeflow Trainer v2.3.0 pins (its go.mod); chart from registry.k8s.io
# (kubernetes-sigs/jobset charts/jobset/README.md "Install from registry.k8s.io").
JOBSET = HelmChart(
    release="jobset",
    chart="oci://registry.k8s.io/jobset/charts/jobset",
    repository=None,
    version="0.12.0",
    namespace="jobset-system",
    fixed="0.12.0",
)

# Kueue v0.19.2: the release HyperPod task governance v1.6.0 packages, JobSet among its default integrations
# (kubernetes-sigs/kueue v0.19.2 charts/kueue/README.md, config/components/manager/controller_manager_config.yaml).
KUEUE = HelmChart(
    release="kueue",
    chart="oci://registry.k8s.io/kueue/charts/kueue",
    repository=None,
    version="0.19.2",
    namespace="kueue-system",
    fixed="0.19.2",
)

# Karpenter 1.14.1: GPU nodes made for pending pods and removed when empty (docs/eks.md#gpu-nodes-none-while-idle). 1.11 added the
# EC2NodeClass's static `networkInterfaces` (efa-only) and `placementGroupSelector` (aws/karpenter-provider-aws pulls
# 9027, 9030); 1.14.1 is the newest release (commit 1d927085d "docs: update for patch release v1.14.1" sets
# charts/karpenter/Chart.yaml to 1.14.1); chart and install namespace from its getting-started guide
# (website/content/en/docs/getting-started/getting-started-with-karpenter: `helm upgrade --install karpenter
# oci://public.ecr.aws/karpenter/karpenter`, KARPENTER_NAMESPACE=kube-system).
KARPENTER = HelmChart(
    release="karpenter",
    chart="oci://public.ecr.aws/karpenter/karpenter",
    repository=None,
    version="1.14.1",
    namespace="kube-system",
    fixed="1.11.0",
)
# The API versions of the Karpenter kinds the stack creates (the pinned CRDs in infra/crds/).
KARPENTER_API_VERSION = "karpenter.sh/v1"
KARPENTER_AWS_API_VERSION = "karpenter.k8s.aws/v1"
KARPENTER_OVERLAY_API_VERSION = "karpenter.sh/v1alpha1"

# Karpenter first: its webhooks-free controller must run before the device plugins have a node to land on.
HELM_CHARTS: tuple[HelmChart, ...] = (KARPENTER, NVIDIA_DEVICE_PLUGIN, EFA_DEVICE_PLUGIN, JOBSET, KUEUE)

# The CRD schema files in ../shared/k8s-crds that match the pinned charts (that folder's README names their tags).
CRD_FILE_PREFIXES: tuple[str, ...] = (f"jobset-v{JOBSET.version}_", f"kueue-v{KUEUE.version}_")
# And the project's own pinned schema fixtures (infra/crds/, each file's header names its upstream path and tag).
LOCAL_CRD_FILE_PREFIXES: tuple[str, ...] = (f"karpenter-v{KARPENTER.version}_",)


@dataclass(frozen=True)
class EksAddon:
    """One AWS-managed EKS add-on; version None lets EKS install its default for the cluster's minor."""

    name: str
    fixed: str | None  # the oldest upstream version the policy pack accepts, None where no floor is known


# vpc-cni >= 1.18.5 for efa-only interfaces (EKS user guide ml/node-efa.adoc); the Pod Identity agent is what the FSx
# CSI add-on authenticates through (docs.aws.amazon.com/eks/latest/userguide/fsx-csi-create.html); node monitoring
# feeds node auto repair (EKS user guide nodes/node-health.adoc).
# The metrics route on EKS (docs/eks.md#metrics): the CloudWatch agent and Fluent Bit of this AWS-managed add-on,
# the same one awsome-distributed-training installs (1.architectures/4.amazon-eks/eks-g5-node-autorepair.yaml).
OBSERVABILITY = EksAddon("amazon-cloudwatch-observability", fixed=None)
EKS_ADDONS: tuple[EksAddon, ...] = (
    EksAddon("vpc-cni", fixed="1.18.5"),
    EksAddon("coredns", fixed=None),
    EksAddon("kube-proxy", fixed=None),
    EksAddon("eks-pod-identity-agent", fixed=None),
    EksAddon("aws-fsx-csi-driver", fixed=None),
    EksAddon("eks-node-monitoring-agent", fixed=None),
    OBSERVABILITY,
)


def version_tuple(version: str) -> tuple[int, ...]:
    """`v1.18.5-eksbuild.2` -> (1, 18, 5): the numeric release an add-on or chart version names."""
    core = version.removeprefix("v").split("-")[0].split("+")[0]
    try:
        return tuple(int(part) for part in core.split("."))
    except ValueError:
        raise ValueError(
            f"version {version!r} is not a dotted release (like 1.18.5 or v1.18.5-eksbuild.1)"
        ) from None
