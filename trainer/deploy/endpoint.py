"""The stack's SageMaker endpoint as `make deploy` owns it: requests, the rollout, autoscaling, the live record.

Request shapes: botocore's SageMaker model (data/sagemaker/2017-07-24/service-2.json): CreateModel,
CreateEndpointConfig, CreateEndpoint, UpdateEndpoint with DeploymentConfig (BlueGreenUpdatePolicy:
TrafficRoutingConfiguration CANARY with CanarySize and WaitIntervalInSeconds; AutoRollbackConfiguration.Alarms),
DescribeEndpoint (EndpointStatus; the in-progress deployment under PendingDeploymentSummary, "only returned when
the endpoint is creating or updating with a new endpoint configuration", its ProductionVariants[].VariantStatus:
Creating, Updating, Deleting, ActivatingTraffic, Baking). A blue/green update keeps the variant's name and rolls back to the blue fleet when an alarm fires
during a baking period (SageMaker Developer Guide, "Blue/Green Deployments", "Exclusions").

While the green fleet bakes, the smoke check invokes the endpoint with the prompt recorded at evaluation and puts
`SmokeMismatch` (trainer/contract/serving.py): 1 when the answer is neither the new version's recorded answer nor
the live one's (the canary splits traffic, so either fleet may answer), else 0; the stack's smoke alarm rolls back.
LMI's request and response: {"inputs", "parameters"} -> {"generated_text"} (djl-serving
serving/docs/lmi/user_guides/lmi_input_output_schema.md).

Where and when a version went live: `deployments/<UTC time>-<endpoint>.json` beside its record in the bucket, once
(If-None-Match), as tag events are; the newest of them per endpoint says what ROLLBACK=1 returns to.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from trainer.contract.serving import (
    LMI_ENVIRONMENT,
    MAX_CANARY_SHARE,
    SCALABLE_DIMENSION,
    SCALING_METRIC,
    SERVING_INSTANCES,
    SMOKE_METRIC,
    SMOKE_NAMESPACE,
    VARIANT,
    canary_instances,
    scaling_resource_id,
)
from trainer.cost.pricing import pool_cost
from trainer.deploy.readiness import GPU_MEMORY_UTILIZATION, Ready, Smoke, max_model_len
from trainer.models.registry import Found

DEPLOYMENTS = "deployments"
VERSION_ENV = "TRAINSTACK_MODEL_VERSION"
# Seconds a blue/green update may take before SageMaker stops it (BlueGreenUpdatePolicy
# MaximumExecutionTimeoutInSeconds: 600 to 28800), and how long the blue fleet lingers after (0 to 3600).
MAX_EXECUTION_S = 14_400
TERMINATION_WAIT_S = 300
# An 8B model's weights take minutes to load; SageMaker allows 60 to 3600 s for the container's first /ping
# (ProductionVariant ContainerStartupHealthCheckTimeoutInSeconds) and for the model download.
STARTUP_TIMEOUT_S = 1800
# Scale-in waits longer than scale-out: a new instance takes minutes to load the model.
SCALE_OUT_COOLDOWN_S, SCALE_IN_COOLDOWN_S = 300, 900


class DeployError(RuntimeError):
    """A deployment that cannot start, failed, or was rolled back; the message names why."""


class LiveButWrong(DeployError):
    """The new version went live (no alarm fired in time) but its smoke answer differs from evaluation's."""


class RolledBack(DeployError):
    """SageMaker returned all traffic to the blue fleet; the endpoint serves the version it served before."""


@dataclass(frozen=True)
class Pool:
    """The stack outputs of the inference pool (trainer/contract/outputs.py SERVING_OUTPUTS) and its key."""

    stack: str
    region: str
    endpoint: str
    role_arn: str
    security_group: str
    subnets: list[str]
    image: str
    instance_type: str
    min_instances: int
    max_instances: int
    invocations_per_instance: int
    canary_percent: int
    bake_minutes: int
    alarms: list[str]
    kms_key_arn: str

    @classmethod
    def from_outputs(cls, stack: str, values: dict[str, Any]) -> Pool:
        missing = [
            name for name in ("serving_endpoint", "serving_alarms", "kms_key_arn") if name not in values
        ]
        if missing:
            raise DeployError(
                f"stack {stack} has no inference pool (outputs lack {', '.join(missing)}): set trainstack:serving "
                f"in Pulumi.{stack}.yaml and run make up STACK={stack} (docs/serving-stack.md)"
            )
        return cls(
            stack=stack,
            region=str(values["region"]),
            endpoint=str(values["serving_endpoint"]),
            role_arn=str(values["serving_role_arn"]),
            security_group=str(values["serving_security_group"]),
            subnets=[str(s) for s in values["serving_subnets"]],
            image=str(values["serving_image"]),
            instance_type=str(values["serving_instance_type"]),
            min_instances=int(values["serving_min_instances"]),
            max_instances=int(values["serving_max_instances"]),
            invocations_per_instance=int(values["serving_invocations_per_instance"]),
            canary_percent=int(values["serving_canary_percent"]),
            bake_minutes=int(values["serving_bake_minutes"]),
            alarms=[str(a) for a in values["serving_alarms"]],
            kms_key_arn=str(values["kms_key_arn"]),
        )


@dataclass
class Clients:
    sagemaker: Any
    runtime: Any  # sagemaker-runtime
    cloudwatch: Any
    autoscaling: Any  # application-autoscaling
    s3: Any


def resource_name(endpoint: str, version: str, at: datetime) -> str:
    """A Model's and an EndpointConfig's name: the endpoint, the time and the version's hash, within SageMaker's
    63 characters of [a-zA-Z0-9-] (botocore: ModelName, EndpointConfigName)."""
    return f"{endpoint}-{at.strftime('%Y%m%d%H%M%S')}-{version.rsplit('-', 1)[-1]}"[:63]


def model_length(pool: Pool, ready: Ready) -> int:
    """OPTION_MAX_MODEL_LEN for the pool's instance type (trainer/deploy/readiness.py max_model_len)."""
    instance = SERVING_INSTANCES[pool.instance_type]
    return max_model_len(ready.model_config, ready.weight_bytes, instance.gpus, instance.gpu_memory_gib)


def model_request(pool: Pool, ready: Ready, name: str) -> dict[str, Any]:
    """CreateModel's request; the served length is the one that fits (LMI's OPTION_MAX_MODEL_LEN, vLLM's
    --max-model-len: djl-serving serving/docs/lmi/user_guides/vllm_user_guide.md)."""
    length = model_length(pool, ready)
    return {
        "ModelName": name,
        "ExecutionRoleArn": pool.role_arn,
        "PrimaryContainer": {
            "Image": pool.image,
            # The export's files as they are, mounted at /opt/ml/model (S3ModelDataSource, CompressionType None).
            "ModelDataSource": {
                "S3DataSource": {
                    "S3Uri": ready.export_uri,
                    "S3DataType": "S3Prefix",
                    "CompressionType": "None",
                }
            },
            "Environment": {
                **LMI_ENVIRONMENT,
                "OPTION_MAX_MODEL_LEN": str(length),
                VERSION_ENV: ready.version,
            },
        },
        "VpcConfig": {"SecurityGroupIds": [pool.security_group], "Subnets": pool.subnets},
        "Tags": [{"Key": "stack", "Value": pool.stack}, {"Key": "model-version", "Value": ready.version}],
    }


def endpoint_config_request(pool: Pool, model: str, name: str, instances: int) -> dict[str, Any]:
    return {
        "EndpointConfigName": name,
        "ProductionVariants": [
            {
                "VariantName": VARIANT,
                "ModelName": model,
                "InstanceType": pool.instance_type,
                "InitialInstanceCount": instances,
                "ContainerStartupHealthCheckTimeoutInSeconds": STARTUP_TIMEOUT_S,
                "ModelDataDownloadTimeoutInSeconds": STARTUP_TIMEOUT_S,
            }
        ],
        # Accepted for instance types with local NVMe too (ml.g5, ml.p4d): botocore 1.44.8 sagemaker
        # CreateEndpointConfig KmsKeyId, "does not encrypt instance local storage" (the instance's hardware does).
        "KmsKeyId": pool.kms_key_arn,
        "Tags": [{"Key": "stack", "Value": pool.stack}],
    }


def deployment_config(pool: Pool, instances: int) -> dict[str, Any]:
    """Blue/green with a canary: `canaryPercent` of the green fleet of `instances` first, as an instance count
    (trainer/contract/serving.py canary_instances), baked `bakeMinutes`, then all of it, baked again; with
    canaryPercent 0 all traffic at once, baked. Any rollback alarm during a bake returns all traffic to the blue
    fleet (botocore sagemaker TrafficRoutingConfig: Type ALL_AT_ONCE, CANARY or LINEAR)."""
    canary = canary_instances(pool.canary_percent, instances)
    routing: dict[str, Any] = {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": pool.bake_minutes * 60}
    if canary is not None:
        routing.update(Type="CANARY", CanarySize={"Type": "INSTANCE_COUNT", "Value": canary})
    return {
        "BlueGreenUpdatePolicy": {
            "TrafficRoutingConfiguration": routing,
            "TerminationWaitInSeconds": TERMINATION_WAIT_S,
            "MaximumExecutionTimeoutInSeconds": MAX_EXECUTION_S,
        },
        "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": name} for name in pool.alarms]},
    }


def canary_words(pool: Pool, instances: int) -> str:
    canary = canary_instances(pool.canary_percent, instances)
    return "no canary (all at once)" if canary is None else f"a canary of {canary} of {instances} instances"


def request_problems(
    model: dict[str, Any], config: dict[str, Any], deployment: dict[str, Any] | None
) -> list[str]:
    """The policy pack's endpoint-guarded rules (policy/serving.py) on this verb's own requests, the canary's
    size, and a model that fits its instance type."""
    problems = []
    if model["PrimaryContainer"]["Environment"].get("OPTION_MAX_MODEL_LEN") == "0":
        problems.append(
            f"the model's weights leave no room for a KV cache on {config['ProductionVariants'][0]['InstanceType']}"
            f" ({GPU_MEMORY_UTILIZATION:.0%} of its GPU memory, less 2 GiB a GPU): pick a larger instance type"
        )
    if not config.get("KmsKeyId"):
        problems.append("the endpoint configuration names no KMS key (KmsKeyId)")
    vpc = model.get("VpcConfig") or {}
    if not vpc.get("Subnets") or not vpc.get("SecurityGroupIds"):
        problems.append("the model runs outside the stack's VPC (VpcConfig)")
    if deployment is not None and not deployment.get("AutoRollbackConfiguration", {}).get("Alarms"):
        problems.append("the update has no rollback alarms (AutoRollbackConfiguration.Alarms)")
    routing = (deployment or {}).get("BlueGreenUpdatePolicy", {}).get("TrafficRoutingConfiguration", {})
    canary = routing.get("CanarySize", {}).get("Value")
    fleet = config["ProductionVariants"][0]["InitialInstanceCount"]
    if canary is not None and canary > fleet * MAX_CANARY_SHARE:
        problems.append(
            f"the canary of {canary} instance(s) is over half the green fleet of {fleet} (CanarySize): give the "
            "stack at least 2 instances (minInstances) or canaryPercent 0"
        )
    return problems


@dataclass(frozen=True)
class Live:
    """What the endpoint serves now: the version, its EndpointConfig, the variant's instance type and count."""

    version: str | None
    config: str
    model: str
    instance_type: str
    instances: int
    status: str


def live(clients: Clients, pool: Pool) -> Live | None:
    """The endpoint as it is, or None when there is none."""
    try:
        endpoint = clients.sagemaker.describe_endpoint(EndpointName=pool.endpoint)
    except ClientError as error:
        if error.response["Error"]["Code"] == "ValidationException":  # "Could not find endpoint"
            return None
        raise
    config = clients.sagemaker.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])
    variant = config["ProductionVariants"][0]
    model = clients.sagemaker.describe_model(ModelName=variant["ModelName"])
    return Live(
        version=model["PrimaryContainer"].get("Environment", {}).get(VERSION_ENV),
        config=endpoint["EndpointConfigName"],
        model=variant["ModelName"],
        instance_type=str(variant.get("InstanceType", "")),
        instances=sum(v.get("CurrentInstanceCount", 0) for v in endpoint.get("ProductionVariants", [])),
        status=endpoint["EndpointStatus"],
    )


def update_instances(pool: Pool, now: Live) -> int:
    """The green fleet's size: what autoscaling holds the blue one at, within the pool's minimum and maximum."""
    return max(pool.min_instances, min(now.instances, pool.max_instances))


def smoke_answer(clients: Clients, pool: Pool, smoke: Smoke) -> str:
    body = {
        "inputs": smoke.prompt,
        "parameters": {"max_new_tokens": smoke.max_new_tokens, "do_sample": False, "stop": smoke.stop},
    }
    response = clients.runtime.invoke_endpoint(
        EndpointName=pool.endpoint, ContentType="application/json", Body=json.dumps(body).encode()
    )
    return str(json.loads(response["Body"].read())["generated_text"])


def put_smoke(clients: Clients, pool: Pool, mismatch: bool) -> None:
    clients.cloudwatch.put_metric_data(
        Namespace=SMOKE_NAMESPACE,
        MetricData=[
            {
                "MetricName": SMOKE_METRIC,
                "Dimensions": [{"Name": "EndpointName", "Value": pool.endpoint}],
                "Value": 1.0 if mismatch else 0.0,
                "Unit": "Count",
            }
        ],
    )


def _same(a: str, b: str) -> bool:
    return a.strip() == b.strip()


@dataclass
class Rollout:
    """Follows one create or update to its end, printing each change of state, smoke-checking the green fleet."""

    clients: Clients
    pool: Pool
    new_config: str
    smoke: Smoke
    old_smoke: Smoke | None  # the live version's, when there is one
    say: Callable[[str], None] = print
    poll_s: float = 30.0
    sleep: Callable[[float], None] = time.sleep
    split: bool = True  # a canary: both fleets answer during the bakes
    unjudged: bool = False

    def follow(self) -> None:
        """Returns when the endpoint serves the new configuration; raises DeployError on a rollback or failure."""
        seen = None
        while True:
            endpoint = self.clients.sagemaker.describe_endpoint(EndpointName=self.pool.endpoint)
            status = endpoint["EndpointStatus"]
            # The new configuration's fleet, while it is deployed, is the pending deployment's (botocore sagemaker
            # DescribeEndpointOutput.PendingDeploymentSummary), not the serving ProductionVariants'.
            pending = endpoint.get("PendingDeploymentSummary") or {}
            ours = pending.get("EndpointConfigName") == self.new_config
            variants = [
                f"{s['Status']}" + (f" ({s['StatusMessage']})" if s.get("StatusMessage") else "")
                for v in (pending.get("ProductionVariants", []) if ours else [])
                for s in v.get("VariantStatus", [])
            ]
            state = f"{status}" + (f": {', '.join(variants)}" if variants else "")
            if state != seen:
                self.say(f"  {datetime.now(UTC).strftime('%H:%M:%S')} {self.pool.endpoint} {state}")
                seen = state
            if status == "InService":
                if endpoint["EndpointConfigName"] != self.new_config:
                    raise RolledBack(self._rolled_back(endpoint))
                self._smoke(final=True)
                return
            if status in ("Failed", "UpdateRollbackFailed", "OutOfService"):
                raise DeployError(
                    f"{self.pool.endpoint} is {status}: {endpoint.get('FailureReason', 'no reason given')}"
                )
            if status == "RollingBack":
                pass  # its end, InService on the old configuration, names the alarm
            elif any(v.startswith("Baking") for v in variants):
                self._smoke(final=False)
            self.sleep(self.poll_s)

    def _known(self, final: bool) -> list[str] | None:
        """The answers the endpoint may rightly give now: the new version's; during a canary's bakes also the live
        version's, when it recorded the same request (another prompt's answer says nothing), else None: an answer
        of the old fleet cannot be judged, so the bake puts nothing and the final check judges the new fleet."""
        if final or self.old_smoke is None or not self.split:
            return [self.smoke.answer]
        old, new = self.old_smoke, self.smoke
        if (old.prompt, old.max_new_tokens, old.stop) == (new.prompt, new.max_new_tokens, new.stop):
            return [new.answer, old.answer]
        return None

    def _smoke(self, final: bool) -> None:
        known = self._known(final)
        if known is None:
            if not self.unjudged:
                self.say(
                    "  the live version recorded another smoke request: judged once the new fleet has it all"
                )
                self.unjudged = True
            return
        answer = smoke_answer(self.clients, self.pool, self.smoke)
        mismatch = not any(_same(answer, k) for k in known)
        put_smoke(self.clients, self.pool, mismatch)
        if mismatch and final:
            raise LiveButWrong(
                f"{self.pool.endpoint} serves the new version but the smoke request's greedy answer {answer!r} "
                f"differs from the one recorded at evaluation {self.smoke.answer!r}; ROLLBACK=1 returns to the "
                "previous version"
            )

    def _rolled_back(self, endpoint: dict[str, Any]) -> str:
        fired = self.clients.cloudwatch.describe_alarms(AlarmNames=self.pool.alarms, StateValue="ALARM")
        names = [a["AlarmName"] for a in fired.get("MetricAlarms", []) if a.get("StateValue") == "ALARM"]
        why = f"alarm {', '.join(names)}" if names else "no alarm in ALARM now; see the endpoint's events"
        return f"{self.pool.endpoint} rolled back to {endpoint['EndpointConfigName']}: {why}" + (
            f" ({endpoint['FailureReason']})" if endpoint.get("FailureReason") else ""
        )


def deregister_scaling(clients: Clients, pool: Pool) -> None:
    """Before an update that changes the variant's instance type, which Application Auto Scaling refuses while the
    variant is a scalable target (SageMaker Developer Guide, "Update endpoints that use auto scaling"); the
    variant is registered again after the rollout, whichever way it ends."""
    resource = scaling_resource_id(pool.endpoint)
    policies = clients.autoscaling.describe_scaling_policies(
        ServiceNamespace="sagemaker", ResourceId=resource, ScalableDimension=SCALABLE_DIMENSION
    )["ScalingPolicies"]
    for policy in policies:
        clients.autoscaling.delete_scaling_policy(
            PolicyName=policy["PolicyName"],
            ServiceNamespace="sagemaker",
            ResourceId=resource,
            ScalableDimension=SCALABLE_DIMENSION,
        )
    targets = clients.autoscaling.describe_scalable_targets(
        ServiceNamespace="sagemaker", ResourceIds=[resource], ScalableDimension=SCALABLE_DIMENSION
    )["ScalableTargets"]
    if targets:
        clients.autoscaling.deregister_scalable_target(
            ServiceNamespace="sagemaker", ResourceId=resource, ScalableDimension=SCALABLE_DIMENSION
        )


def retire(clients: Clients, config: str, model: str) -> None:
    """A Model and EndpointConfig the endpoint no longer uses: the blue fleet's after a rollout, the green one's
    after a rollback (DeleteEndpointConfig and DeleteModel leave a running endpoint as it is); ROLLBACK=1 makes
    new ones from the deployment records."""
    clients.sagemaker.delete_endpoint_config(EndpointConfigName=config)
    clients.sagemaker.delete_model(ModelName=model)


def register_scaling(clients: Clients, pool: Pool) -> None:
    """Target tracking on invocations per instance between the pool's minimum and maximum (Application Auto
    Scaling: RegisterScalableTarget, PutScalingPolicy with PredefinedMetricType SageMakerVariantInvocationsPerInstance);
    run after the endpoint is in service, as Application Auto Scaling requires an existing variant."""
    resource = scaling_resource_id(pool.endpoint)
    clients.autoscaling.register_scalable_target(
        ServiceNamespace="sagemaker",
        ResourceId=resource,
        ScalableDimension=SCALABLE_DIMENSION,
        MinCapacity=pool.min_instances,
        MaxCapacity=pool.max_instances,
    )
    clients.autoscaling.put_scaling_policy(
        PolicyName=f"{pool.endpoint}-invocations",
        ServiceNamespace="sagemaker",
        ResourceId=resource,
        ScalableDimension=SCALABLE_DIMENSION,
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": float(pool.invocations_per_instance),
            "PredefinedMetricSpecification": {"PredefinedMetricType": SCALING_METRIC},
            "ScaleOutCooldown": SCALE_OUT_COOLDOWN_S,
            "ScaleInCooldown": SCALE_IN_COOLDOWN_S,
        },
    )


def status_line(clients: Clients, pool: Pool) -> str:
    """`make status`'s line for the endpoint: its state, the version it serves, its instances and dollars."""
    try:
        now = live(clients, pool)
    except ClientError as error:
        return f"endpoint {pool.endpoint}: cannot read it ({error.response['Error']['Code']})"
    if now is None:
        return (
            f"endpoint {pool.endpoint}: none yet (make deploy STACK={pool.stack} MODEL=<tag>); would cost "
            + pool_cost(pool.instance_type, pool.region, pool.min_instances, pool.max_instances)
        )
    return f"endpoint {pool.endpoint}: {now.status}, serving {now.version}; " + pool_cost(
        now.instance_type or pool.instance_type,
        pool.region,
        pool.min_instances,
        pool.max_instances,
        now.instances,
    )


# --- where and when each version went live ---------------------------------------------------------------------


def record_key(found: Found, endpoint: str, at: datetime) -> tuple[str, str]:
    bucket, _, directory = found.location.removeprefix("s3://").partition("/")
    return bucket, f"{directory}/{DEPLOYMENTS}/{at.strftime('%Y%m%dT%H%M%S.%fZ')}-{endpoint}.json"


def record_live(
    clients: Clients, pool: Pool, found: Found, at: datetime, previous: str | None, by: str
) -> str:
    bucket, key = record_key(found, pool.endpoint, at)
    body = {
        "version": found.record.version,
        "stack": pool.stack,
        "region": pool.region,
        "endpoint": pool.endpoint,
        "at": at.isoformat(timespec="microseconds"),
        "previous": previous,
        "by": by,
    }
    clients.s3.put_object(
        Bucket=bucket,
        Key=key,
        Body=(json.dumps(body, indent=1) + "\n").encode(),
        ContentType="application/json",
        ServerSideEncryption="aws:kms",
        SSEKMSKeyId=pool.kms_key_arn,
        IfNoneMatch="*",
    )
    return f"s3://{bucket}/{key}"


def deployments(clients: Clients, versions: list[Found], endpoint: str) -> list[dict[str, Any]]:
    """Every record of a version going live on `endpoint`, oldest first."""
    found = []
    for version in versions:
        bucket, _, directory = version.location.removeprefix("s3://").partition("/")
        prefix = f"{directory}/{DEPLOYMENTS}/"
        pages = clients.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            for item in page.get("Contents", []):
                if item["Key"].endswith(f"-{endpoint}.json"):
                    found.append(
                        json.loads(clients.s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read())
                    )
    return sorted(found, key=lambda d: d["at"])
