"""The inference pool's shared facts: what infra/serving.py creates and `make deploy` (trainer/deploy/) acts on.

Ownership, so that Pulumi and the deploy verb never write one resource: Pulumi owns the execution role, the
security group, the alarms (and the dashboard's endpoint row); `make deploy` owns the SageMaker Model,
EndpointConfig and Endpoint and the endpoint variant's Application Auto Scaling target and policy, which
Application Auto Scaling registers only on an endpoint that exists. The stack exports the names and settings the
verb needs (SERVING_OUTPUTS in trainer/contract/outputs.py); the verb never creates an alarm, Pulumi never an
endpoint.

The image: AWS's Large Model Inference (LMI) container, whose vLLM engine serves the export's Hugging Face files
from /opt/ml/model; chosen over vLLM's own image because the vLLM project publishes no SageMaker image (its
docker/Dockerfile has a `vllm-sagemaker` target to build, scan, patch and push ourselves), while LMI is AWS's,
patched by AWS, answers SageMaker's /ping and /invocations on port 8080, and is pulled from AWS's regional ECR
without a copy in the stack's. What it costs: LMI's vLLM lags upstream's (0.12.0 here).
"""

from __future__ import annotations

from dataclasses import dataclass

# deepjavalibrary/djl-serving serving/docs/lmi/release_notes.md, "LMI V18 (DJL-Serving 0.36.0)": vLLM 0.12.0.
LMI_REPOSITORY = "djl-inference"
LMI_TAG = "0.36.0-lmi18.0.0-cu128"
# The account that hosts AWS's Deep Learning Containers (LMI among them) in each commercial region: aws/sagemaker-python-sdk
# src/sagemaker/image_uri_config/djl-lmi.json "registries" (commit 0b73463; the same for every LMI version it lists).
# The China and GovCloud partitions (other ARNs and ECR domains) are left out: the stacks are commercial-only.
LMI_ACCOUNTS = {
    **dict.fromkeys(
        (
            "ap-northeast-1",
            "ap-northeast-2",
            "ap-south-1",
            "ap-southeast-1",
            "ap-southeast-2",
            "ca-central-1",
            "eu-central-1",
            "eu-north-1",
            "eu-west-1",
            "eu-west-2",
            "eu-west-3",
            "sa-east-1",
            "us-east-1",
            "us-east-2",
            "us-west-1",
            "us-west-2",
        ),
        "763104351884",
    ),
    "af-south-1": "626614931356",
    "il-central-1": "780543022126",
    "ap-east-1": "871362719292",
    "ap-northeast-3": "364406365360",
    "ap-southeast-3": "907027046896",
    "eu-south-1": "692866216735",
    "me-south-1": "217643126080",
    "me-central-1": "914824155844",
    "ca-west-1": "204538143572",
}


def lmi_problem(region: str) -> str:
    return (
        f"no source names the account that hosts the LMI image in {region} (aws/sagemaker-python-sdk "
        f"image_uri_config/djl-lmi.json); the inference pool runs in {', '.join(sorted(LMI_ACCOUNTS))}"
    )


def lmi_account(region: str) -> str:
    """The account of the LMI image in `region`; the stack config refuses a pool elsewhere first."""
    if region not in LMI_ACCOUNTS:
        raise ValueError(lmi_problem(region))
    return LMI_ACCOUNTS[region]


def lmi_image(region: str) -> str:
    """The pinned LMI image in the stack's region (NoLmiImage for a region without one)."""
    return f"{lmi_account(region)}.dkr.ecr.{region}.amazonaws.com/{LMI_REPOSITORY}:{LMI_TAG}"


# Where SageMaker mounts an uncompressed S3 prefix (ModelDataSource.S3DataSource, CompressionType None), and the
# LMI settings that serve it with vLLM's async engine (djl-serving serving/docs/lmi/user_guides/vllm_user_guide.md,
# "Async Mode Configurations"; the default handler from LMI V17 on).
MODEL_DIR = "/opt/ml/model"
LMI_ENVIRONMENT = {
    "HF_MODEL_ID": MODEL_DIR,
    "OPTION_ASYNC_MODE": "true",
    "OPTION_ROLLING_BATCH": "disable",
    "OPTION_ENTRYPOINT": "djl_python.lmi_vllm.vllm_async_service",
    "OPTION_TENSOR_PARALLEL_DEGREE": "max",
    "SERVING_FAIL_FAST": "true",
}

# A blue/green update keeps the variant's name (SageMaker Developer Guide, "Deployment guardrails: Exclusions").
VARIANT = "AllTraffic"
# Application Auto Scaling's resource id and dimension for an endpoint variant (Application Auto Scaling API
# reference, RegisterScalableTarget ResourceId and ScalableDimension).
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
SCALING_METRIC = "SageMakerVariantInvocationsPerInstance"


# botocore sagemaker service-2.json TrafficRoutingConfig.CanarySize: "Value must be less than or equal to 50% of
# the variant's total instance count" (also SageMaker Developer Guide, "Use canary traffic shifting"). The canary is
# sent as an instance count, so no rounding of a percentage is left to guess: at least 1 instance, at most half.
MAX_CANARY_SHARE = 0.5


def canary_instances(percent: int, fleet: int) -> int | None:
    """The canary's instances for `percent` of a green fleet of `fleet` (None: no canary, percent 0)."""
    return None if percent == 0 else max(1, fleet * percent // 100)


def canary_problem(percent: int, fleet: int) -> str | None:
    """Why a canary of `percent` cannot run on a green fleet of `fleet` instances, or None when it can."""
    count = canary_instances(percent, fleet)
    if count is None or count <= fleet * MAX_CANARY_SHARE:
        return None
    return (
        f"a {percent} % canary of {fleet} instance(s) is {count} instance(s), over the 50 % of the fleet SageMaker "
        "allows (CanarySize): give at least 2 instances (minInstances) or canaryPercent 0 (no canary: all "
        "traffic at once, still baked and rolled back on the alarms)"
    )


def scaling_resource_id(endpoint: str) -> str:
    return f"endpoint/{endpoint}/variant/{VARIANT}"


# The smoke check's metric: `make deploy` puts 1 when an answer from the new fleet differs from the greedy answer
# recorded at evaluation, 0 when it matches; the stack's smoke alarm rolls the deployment back on a 1.
SMOKE_NAMESPACE = "trainstack/Serving"
SMOKE_METRIC = "SmokeMismatch"


@dataclass(frozen=True)
class ServingInstance:
    name: str
    gpus: int
    gpu_memory_gib: (
        float  # per GPU, as the device reports it (vLLM's gpu_memory_utilization is a share of that)
    )


# SageMaker ML instance types for the pool, those with a price in trainer/cost/prices.json "sagemaker-hosting"
# (Amazon EC2 G5 and P4d instance pages: A10G "24 GB", A100 40 GB). The A10G's "24 GB" is 23,028 MiB (22.5 GiB) as
# nvidia-smi and torch.cuda.mem_get_info report it on a g5; read as 24 GiB it overstated the KV cache by 1.4 GiB
# and so OPTION_MAX_MODEL_LEN by ~11,000 tokens of Llama 3.1 8B, past what vLLM then fits. A100-SXM4-40GB: 40,960 MiB.
SERVING_INSTANCES = {
    i.name: i
    for i in (
        ServingInstance("ml.g5.2xlarge", 1, 23_028 / 1024),
        ServingInstance("ml.p4d.24xlarge", 8, 40),
    )
}
DEFAULT_SERVING_INSTANCE = "ml.g5.2xlarge"
DEFAULT_MIN_INSTANCES, DEFAULT_MAX_INSTANCES = 1, 2


def stack_pool(values: dict[str, object]) -> tuple[str, int, int] | None:
    """(instance type, minimum, maximum) of a stack file's `trainstack:serving` (its defaults where left out), or
    None for a stack without an inference pool; infra/config.py validates the same mapping."""
    pool = values.get("trainstack:serving")
    if not isinstance(pool, dict):
        return None
    return (
        str(pool.get("instanceType", DEFAULT_SERVING_INSTANCE)),
        int(pool.get("minInstances", DEFAULT_MIN_INSTANCES)),
        int(pool.get("maxInstances", DEFAULT_MAX_INSTANCES)),
    )
