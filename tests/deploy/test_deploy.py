"""`make deploy` (trainer/deploy/) against a moto checkpoints bucket, CloudWatch and Application Auto Scaling, with
SageMaker and SageMaker Runtime through botocore's Stubber (checked against botocore's models): moto 5.2.5's
CreateEndpointConfig refuses ml.g5 instance types (its own instance-type list predates them) and has no
UpdateEndpoint. Covered: a refused deploy, a first deploy, a canary rollout that succeeds, one that rolls back
naming the alarm, a no-op redeploy and ROLLBACK=1."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest
from botocore.loaders import Loader
from botocore.response import StreamingBody
from botocore.stub import ANY, Stubber

from tests.models.test_registry import BUCKET, REGION, bucket, exported, lineage, runs  # noqa: F401
from trainer.checkpoint.version import add_evaluation, read_record
from trainer.contract.serving import (
    SCALABLE_DIMENSION,
    SERVING_INSTANCES,
    SMOKE_METRIC,
    SMOKE_NAMESPACE,
    scaling_resource_id,
)
from trainer.deploy import endpoint as ep
from trainer.deploy.command import deploy
from trainer.deploy.readiness import max_model_len
from trainer.models.pipeline import write_marker
from trainer.models.registry import Registry, S3Store

from .outputs import pool_outputs

ENDPOINT = "trainstack-test-serving"
ALARMS = [f"{ENDPOINT}-errors", f"{ENDPOINT}-latency", f"{ENDPOINT}-smoke"]
NOW = datetime(2026, 12, 5, tzinfo=UTC)
# The exports' config.json: a tiny Llama, whose KV cache fits any pool instance at its whole context.
TINY_CONFIG = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "dtype": "float32",
}
# meta-llama/Llama-3.1-8B's config.json (Hugging Face hub): 32 layers, 8 KV heads of 128, a 131,072 context, bf16;
# 8,030,261,248 parameters.
LLAMA_31_8B = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}
LLAMA_31_8B_WEIGHTS = 8_030_261_248 * 2


def pool(key: str) -> ep.Pool:
    return ep.Pool.from_outputs(
        "test",
        {"region": REGION, **pool_outputs(ENDPOINT, REGION), "kms_key_arn": key},
    )


def answer_of(version: str) -> str:
    return f"the answer of {version}"


def ready_runs(
    runs: Path,  # noqa: F811
    evaluate: bool = True,
    export: bool = True,
    first_prompt: str = "2+2=",
) -> list[str]:
    """Each version of runs/tiny evaluated (a generation task with its smoke answer; the first version's for
    `first_prompt`, the others' for 2+2=) and exported with its marker."""
    versions = []
    for checkpoint in sorted((runs / "tiny" / "checkpoints").glob("iter_*")):
        version = read_record(checkpoint).version
        prompt = first_prompt if not versions else "2+2="
        versions.append(version)
        if evaluate:
            smoke = {"prompt": prompt, "answer": answer_of(version), "max_new_tokens": 8, "stop": []}
            add_evaluation(checkpoint, "sft", {"generation": {"sum": {"exact_match": 1.0, "smoke": smoke}}})
        if export:
            out = runs / "tiny" / "export" / version
            out.mkdir(parents=True)
            (out / "config.json").write_text(json.dumps(TINY_CONFIG))
            (out / "model.safetensors").write_bytes(b"\0" * 64)
            write_marker(runs / "tiny" / "export", version)
    return versions


class Fake:
    """The two stubbed clients and the moto ones, and the queue of SageMaker answers a scenario expects."""

    def __init__(self, s3, key):
        self.sagemaker = boto3.client("sagemaker", region_name=REGION)
        self.runtime = boto3.client("sagemaker-runtime", region_name=REGION)
        self.sm, self.rt = Stubber(self.sagemaker), Stubber(self.runtime)
        self.clients = ep.Clients(
            self.sagemaker,
            self.runtime,
            boto3.client("cloudwatch", region_name=REGION),
            boto3.client("application-autoscaling", region_name=REGION),
            s3,
        )
        self.pool = pool(key)
        cw = self.clients.cloudwatch
        for name in ALARMS:
            cw.put_metric_alarm(
                AlarmName=name,
                MetricName="x",
                Namespace="y",
                Statistic="Maximum",
                Period=60,
                EvaluationPeriods=1,
                Threshold=1,
                ComparisonOperator="GreaterThanThreshold",
                AlarmActions=["arn:aws:sns:us-east-1:123456789012:alarms"],
            )

    def no_endpoint(self):
        self.sm.add_client_error(
            "describe_endpoint", "ValidationException", f'Could not find endpoint "{ENDPOINT}".'
        )

    def live(
        self,
        version: str,
        config: str = "old-config",
        instances: int = 1,
        instance_type: str = "ml.g5.2xlarge",
        status: str = "InService",
    ):
        self.status(status, config=config, instances=instances)
        self.sm.add_response(
            "describe_endpoint_config",
            {
                "EndpointConfigName": config,
                "EndpointConfigArn": f"arn:aws:sagemaker:us-east-1:123456789012:endpoint-config/{config}",
                "ProductionVariants": [
                    {"VariantName": "AllTraffic", "ModelName": "old-model", "InstanceType": instance_type}
                ],
                "CreationTime": NOW,
            },
            {"EndpointConfigName": config},
        )
        self.sm.add_response(
            "describe_model",
            {
                "ModelName": "old-model",
                "PrimaryContainer": {"Image": "x", "Environment": {ep.VERSION_ENV: version}},
                "CreationTime": NOW,
                "ModelArn": "arn:aws:sagemaker:us-east-1:123456789012:model/old-model",
            },
            {"ModelName": "old-model"},
        )

    def retires(self, config: str = "old-config"):
        self.sm.add_response("delete_endpoint_config", {}, {"EndpointConfigName": config})
        self.sm.add_response("delete_model", {}, {"ModelName": "old-model"})

    def creates(self, update: bool):
        arn = "arn:aws:sagemaker:us-east-1:123456789012:"
        self.sm.add_response("create_model", {"ModelArn": arn + "model/m"}, ANY_ARGS["create_model"])
        self.sm.add_response(
            "create_endpoint_config",
            {"EndpointConfigArn": arn + "endpoint-config/c"},
            ANY_ARGS["create_endpoint_config"],
        )
        if update:
            self.sm.add_response(
                "update_endpoint", {"EndpointArn": arn + "endpoint/e"}, ANY_ARGS["update_endpoint"]
            )
        else:
            self.sm.add_response(
                "create_endpoint", {"EndpointArn": arn + "endpoint/e"}, ANY_ARGS["create_endpoint"]
            )

    def status(
        self,
        status: str,
        config: str = ANY,
        variant: str | None = None,
        reason: str | None = None,
        instances: int | None = None,
        pending: str | None = None,
    ):
        response = {
            "EndpointName": ENDPOINT,
            "EndpointArn": f"arn:aws:sagemaker:us-east-1:123456789012:endpoint/{ENDPOINT}",
            "EndpointConfigName": config if config is not ANY else "new",
            "EndpointStatus": status,
            "CreationTime": NOW,
            "LastModifiedTime": NOW,
        }
        if variant or instances is not None:
            response["ProductionVariants"] = [{"VariantName": "AllTraffic"}]
        if variant:
            response["ProductionVariants"][0]["VariantStatus"] = [{"Status": variant}]
        if instances is not None:
            response["ProductionVariants"][0]["CurrentInstanceCount"] = instances
        if reason:
            response["FailureReason"] = reason
        if pending:
            # The deployment in progress, where the botocore model puts it (PENDING, checked against the model).
            response["PendingDeploymentSummary"] = {
                "EndpointConfigName": "new",
                "ProductionVariants": [{"VariantName": "AllTraffic", "VariantStatus": [{"Status": pending}]}],
                "StartTime": NOW,
            }
        self.sm.add_response("describe_endpoint", response, {"EndpointName": ENDPOINT})

    def answers(self, text: str):
        body = json.dumps({"generated_text": text}).encode()
        self.rt.add_response(
            "invoke_endpoint",
            {"Body": StreamingBody(io.BytesIO(body), len(body)), "ContentType": "application/json"},
            {"EndpointName": ENDPOINT, "ContentType": "application/json", "Body": ANY},
        )

    def run(self, registry, model=None, rollback=False, call=None) -> int:
        with self.sm, self.rt:
            if call is not None:
                code = call()
            else:
                code = deploy(
                    self.clients,
                    self.pool,
                    registry,
                    model,
                    rollback,
                    lambda: "tester",
                    poll_s=0,
                    sleep=lambda s: None,
                )
            self.sm.assert_no_pending_responses()
            self.rt.assert_no_pending_responses()
        return code


def test_the_deployment_in_progress_is_where_botocores_model_puts_it():
    """The stubbed DescribeEndpoint answers above are checked against this shape by the Stubber; the path the
    rollout reads (PendingDeploymentSummary.ProductionVariants[].VariantStatus[].Status, Baking among its values)
    is the model's."""
    shapes = Loader().load_service_model("sagemaker", "service-2")["shapes"]
    pending = shapes["DescribeEndpointOutput"]["members"]["PendingDeploymentSummary"]["shape"]
    variants = shapes[shapes[pending]["members"]["ProductionVariants"]["shape"]]["member"]["shape"]
    statuses = shapes[shapes[variants]["members"]["VariantStatus"]["shape"]]["member"]["shape"]
    kinds = shapes[shapes[statuses]["members"]["Status"]["shape"]]["enum"]
    assert "Baking" in kinds and "ActivatingTraffic" in kinds
    assert (
        "only returned when the endpoint is creating or updating"
        in (shapes["DescribeEndpointOutput"]["members"]["PendingDeploymentSummary"]["documentation"])
    )


def smoke_points(fake: Fake) -> list[float]:
    """The SmokeMismatch values the verb put (moto's CloudWatch)."""
    stats = fake.clients.cloudwatch.get_metric_statistics(
        Namespace=SMOKE_NAMESPACE,
        MetricName=SMOKE_METRIC,
        Dimensions=[{"Name": "EndpointName", "Value": ENDPOINT}],
        StartTime=datetime(2020, 1, 1, tzinfo=UTC),
        EndTime=datetime(2100, 1, 1, tzinfo=UTC),
        Period=60,
        Statistics=["Maximum"],
    )["Datapoints"]
    return [p["Maximum"] for p in stats]


ANY_ARGS = {
    op: None for op in ("create_model", "create_endpoint_config", "update_endpoint", "create_endpoint")
}


@pytest.fixture
def world(bucket, runs):  # noqa: F811
    s3, key = bucket
    versions = ready_runs(runs)
    exported(s3, runs)
    fake = Fake(s3, key)
    registry = Registry(S3Store(s3, None, BUCKET, key))
    return fake, registry, versions, s3


def test_a_first_deploy_creates_the_endpoint_scales_it_and_records_it_live(world, capsys):
    fake, registry, (_, newest), _ = world
    fake.no_endpoint()
    fake.creates(update=False)
    fake.status("Creating", variant="Creating")
    fake.status("InService", config=ANY)
    fake.answers(answer_of(newest))
    # InService names the new configuration: the verb compares names, so let the stub answer with it.
    code = run_matching_config(fake, registry, newest)
    out = capsys.readouterr()
    assert code == 0, out.err
    assert f"{newest} is live on {ENDPOINT}" in out.out
    targets = fake.clients.autoscaling.describe_scalable_targets(ServiceNamespace="sagemaker")[
        "ScalableTargets"
    ]
    assert [
        (t["ResourceId"], t["ScalableDimension"], t["MinCapacity"], t["MaxCapacity"]) for t in targets
    ] == [(scaling_resource_id(ENDPOINT), SCALABLE_DIMENSION, 2, 4)]
    [policy] = fake.clients.autoscaling.describe_scaling_policies(ServiceNamespace="sagemaker")[
        "ScalingPolicies"
    ]
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["TargetValue"] == 60.0
    assert (
        tracking["PredefinedMetricSpecification"]["PredefinedMetricType"]
        == "SageMakerVariantInvocationsPerInstance"
    )
    [record] = ep.deployments(fake.clients, registry.versions, ENDPOINT)
    assert (record["version"], record["previous"], record["by"]) == (newest, None, "tester")


def run_matching_config(fake: Fake, registry, version, rollback=False, model=None, call=None) -> int:
    """Run `make deploy` (or `call`, under the same stubs) with the stubbed DescribeEndpoint answers naming the
    configuration the verb created, which the stub cannot know in advance: captured from the CreateEndpointConfig
    request."""
    created: dict = {}
    original = fake.sagemaker.create_endpoint_config

    def capture(**kwargs):
        created.update(kwargs)
        return original(**kwargs)

    fake.sagemaker.create_endpoint_config = capture  # type: ignore[method-assign]
    describe = fake.sagemaker.describe_endpoint

    def named(**kwargs):
        response = describe(**kwargs)
        for where in (response, response.get("PendingDeploymentSummary") or {}):
            if where.get("EndpointConfigName") == "new" and created:
                where["EndpointConfigName"] = created["EndpointConfigName"]
        return response

    fake.sagemaker.describe_endpoint = named  # type: ignore[method-assign]
    code = fake.run(registry, model=model or version, rollback=rollback, call=call)
    fake.created = created
    if created:
        assert created["KmsKeyId"] == fake.pool.kms_key_arn
        assert created["ProductionVariants"][0]["InstanceType"] == "ml.g5.2xlarge"
    return code


def test_a_canary_rollout_that_bakes_clean_goes_live(world, capsys):
    fake, registry, (older, newest), _ = world
    fake.live(older)
    fake.creates(update=True)
    fake.status("Updating", config="old-config", pending="ActivatingTraffic")
    fake.status("Updating", config="old-config", pending="Baking")
    fake.answers(answer_of(older))  # the canary splits traffic: the blue fleet may answer
    fake.status("InService", config=ANY)
    fake.answers(answer_of(newest))
    fake.retires()  # the blue fleet's Model and EndpointConfig, once it is gone
    code = run_matching_config(fake, registry, newest)
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "a canary of 1 of 2 instances, 10 min bakes" in out.out and "Baking" in out.out
    [record] = ep.deployments(fake.clients, registry.versions, ENDPOINT)
    assert (record["version"], record["previous"]) == (newest, older)


def test_a_rollout_whose_smoke_answer_differs_rolls_back_and_names_the_alarm(world, capsys):
    fake, registry, (older, newest), _ = world
    fake.live(older)
    fake.creates(update=True)
    fake.status("Updating", config="old-config", pending="Baking")
    fake.answers("something else entirely")
    fake.status("RollingBack", config="old-config")
    fake.status("InService", config="old-config")
    fake.sm.add_response("delete_endpoint_config", {}, None)  # the green fleet's, named by the verb
    fake.sm.add_response("delete_model", {}, None)
    # What the stack's smoke alarm does on the 1 the verb puts: CloudWatch moves it to ALARM, SageMaker rolls back.
    fake.clients.cloudwatch.set_alarm_state(
        AlarmName=ALARMS[2], StateValue="ALARM", StateReason="SmokeMismatch 1"
    )
    code = run_matching_config(fake, registry, newest)
    err = capsys.readouterr().err
    assert code == 1
    assert f"rolled back to old-config: alarm {ALARMS[2]}" in err
    assert smoke_points(fake) == [1.0]
    assert ep.deployments(fake.clients, registry.versions, ENDPOINT) == []  # nothing went live


def test_an_old_fleets_answer_is_not_judged_against_another_prompts_recorded_answer(bucket, runs, capsys):  # noqa: F811
    """The live version recorded its smoke answer for another prompt: during the canary's bake an answer from its
    fleet cannot be judged (before, it was compared with that other prompt's answer and rolled a healthy version
    back); the final check, all traffic on the new fleet, judges the new version."""
    s3, key = bucket
    older, newest = ready_runs(runs, first_prompt="3+3=")
    exported(s3, runs)
    fake = Fake(s3, key)
    registry = Registry(S3Store(s3, None, BUCKET, key))
    fake.live(older)
    fake.creates(update=True)
    fake.status("Updating", config="old-config", pending="Baking")  # no invocation stubbed: none is made
    fake.status("InService", config=ANY)
    fake.answers(answer_of(newest))
    fake.retires()
    assert run_matching_config(fake, registry, newest) == 0, capsys.readouterr().err
    assert "recorded another smoke request" in capsys.readouterr().out
    assert smoke_points(fake) == [0.0]


def test_deploying_the_live_version_does_nothing(world, capsys):
    fake, registry, (_, newest), _ = world
    fake.live(newest)
    assert fake.run(registry, model=newest) == 0  # no create or update was stubbed: none was called
    assert "nothing to do" in capsys.readouterr().out


def test_a_version_without_an_evaluation_or_a_complete_export_is_refused_naming_both(bucket, runs, capsys):  # noqa: F811
    s3, key = bucket
    ready_runs(runs, evaluate=False)
    exported(s3, runs)
    fake = Fake(s3, key)
    registry = Registry(S3Store(s3, None, BUCKET, key))
    newest = registry.versions[-1]
    bucket_name, run = BUCKET, "tiny"
    s3.delete_object(Bucket=bucket_name, Key=f"{run}/export/{newest.record.version}/model.safetensors")
    fake.no_endpoint()
    assert fake.run(registry, model="newest") == 2
    err = capsys.readouterr().err
    assert f"refused: {newest.record.version} lacks an evaluation: none beside" in err
    assert "a complete export: s3://" in err and "model.safetensors (absent)" in err


def test_rollback_returns_to_the_version_live_before(world, capsys):
    fake, registry, (older, newest), _ = world
    found = next(f for f in registry.versions if f.record.version == newest)
    ep.record_live(fake.clients, fake.pool, found, NOW, older, "tester")
    fake.live(newest)
    fake.creates(update=True)
    fake.status("Updating", config="old-config", pending="Baking")
    fake.answers(answer_of(older))
    fake.status("InService", config=ANY)
    fake.answers(answer_of(older))
    fake.retires()  # the blue fleet's Model and EndpointConfig, once it is gone
    code = run_matching_config(fake, registry, older, rollback=True, model=None)
    out = capsys.readouterr()
    assert code == 0, out.err
    assert f"rolling {ENDPOINT} back from {newest} to {older}" in out.out
    history = ep.deployments(fake.clients, registry.versions, ENDPOINT)
    assert [(d["version"], d["previous"]) for d in history] == [(newest, older), (older, newest)]


def test_the_verbs_requests_hold_to_the_policy_packs_endpoint_rules(world):
    fake, registry, (_, newest), s3 = world
    from trainer.deploy.readiness import check

    ready, missing = check(registry.find(newest), s3)
    assert missing == [] and ready is not None
    model = ep.model_request(fake.pool, ready, "m")
    config = ep.endpoint_config_request(fake.pool, "m", "c", 2)
    deployment = ep.deployment_config(fake.pool, 2)
    assert ep.request_problems(model, config, deployment) == []
    assert (
        model["PrimaryContainer"]["Environment"]["OPTION_MAX_MODEL_LEN"] == "2048"
    )  # the whole context fits
    assert model["PrimaryContainer"]["ModelDataSource"]["S3DataSource"] == {
        "S3Uri": f"s3://{BUCKET}/tiny/export/{newest}/",
        "S3DataType": "S3Prefix",
        "CompressionType": "None",
    }
    assert deployment["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"] == {
        "Type": "CANARY",
        "CanarySize": {"Type": "INSTANCE_COUNT", "Value": 1},
        "WaitIntervalInSeconds": 600,
    }
    # botocore: CanarySize "must be less than or equal to 50% of the variant's total instance count".
    one = ep.endpoint_config_request(fake.pool, "m", "c", 1)
    assert ep.request_problems(model, one, ep.deployment_config(fake.pool, 1)) == [
        "the canary of 1 instance(s) is over half the green fleet of 1 (CanarySize): give the stack at least 2 "
        "instances (minInstances) or canaryPercent 0"
    ]
    none = replace(fake.pool, canary_percent=0)
    assert ep.deployment_config(none, 1)["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"] == {
        "Type": "ALL_AT_ONCE",
        "WaitIntervalInSeconds": 600,
    }
    assert ep.request_problems(model, one, ep.deployment_config(none, 1)) == []
    assert ep.request_problems({**model, "VpcConfig": {}}, {**config, "KmsKeyId": ""}, {}) == [
        "the endpoint configuration names no KMS key (KmsKeyId)",
        "the model runs outside the stack's VPC (VpcConfig)",
        "the update has no rollback alarms (AutoRollbackConfiguration.Alarms)",
    ]


def test_the_served_length_is_what_the_kv_cache_holds_beside_the_weights():
    """Llama 3.1 8B on one A10G (23,028 MiB, what nvidia-smi and torch.cuda.mem_get_info report and vLLM takes
    gpu_memory_utilization of; AWS's "24 GB" is not 24 GiB): 90 % of it, less 2 GiB, less 16 GB of weights, leaves
    room for about 26,900 tokens at 128 KiB each (2 x 32 layers x 8 heads x 128 x 2 bytes), not the 131,072 its
    config would give vLLM, which then refuses to start. Eight A100s of 40 GiB hold all of it."""
    g5, p4d = SERVING_INSTANCES["ml.g5.2xlarge"], SERVING_INSTANCES["ml.p4d.24xlarge"]
    assert g5.gpu_memory_gib * 1024 == 23_028  # MiB, not 24 x 1024
    on_g5 = max_model_len(LLAMA_31_8B, LLAMA_31_8B_WEIGHTS, g5.gpus, g5.gpu_memory_gib)
    assert on_g5 == int((23_028 * 2**20 * 0.9 - 2 * 2**30 - LLAMA_31_8B_WEIGHTS) // (2 * 32 * 8 * 128 * 2))
    assert 26_000 < on_g5 < 28_000
    assert max_model_len(LLAMA_31_8B, LLAMA_31_8B_WEIGHTS, p4d.gpus, p4d.gpu_memory_gib) == 131_072
    # 70B's weights (140 GB) do not fit an A10G at all: the deploy is refused before any call.
    assert max_model_len(LLAMA_31_8B, 140 * 10**9, g5.gpus, g5.gpu_memory_gib) == 0


def test_a_model_too_large_for_the_instance_type_is_refused_before_any_call(world):
    fake, registry, (_, newest), s3 = world
    from trainer.deploy.readiness import check

    ready, _ = check(registry.find(newest), s3)
    assert ready is not None
    huge = replace(ready, model_config=LLAMA_31_8B, weight_bytes=140 * 10**9)
    model = ep.model_request(fake.pool, huge, "m")
    assert ep.request_problems(model, ep.endpoint_config_request(fake.pool, "m", "c", 2), None) == [
        "the model's weights leave no room for a KV cache on ml.g5.2xlarge (90% of its GPU memory, less 2 GiB a "
        "GPU): pick a larger instance type"
    ]


def test_status_names_the_live_version_its_instances_and_dollars(world):
    fake, _, (_, newest), _ = world
    fake.live(newest, instances=2)
    fake.no_endpoint()
    with fake.sm:
        line = ep.status_line(fake.clients, fake.pool)
        assert line.startswith(
            f"endpoint {ENDPOINT}: InService, serving {newest}; 2..4 x ml.g5.2xlarge at $1.52"
        )
        assert "$3.04/hour now (2 in service)" in line
        assert ep.status_line(fake.clients, fake.pool).startswith(
            f"endpoint {ENDPOINT}: none yet (make deploy STACK=test MODEL=<tag>); would cost 2..4 x ml.g5.2xlarge"
        )


def test_an_update_to_another_instance_type_pauses_autoscaling_and_keeps_the_fleets_size(world, capsys):
    fake, registry, (older, newest), _ = world
    ep.register_scaling(fake.clients, fake.pool)  # as the first deploy left it
    fake.live(older, instances=2, instance_type="ml.p4d.24xlarge")
    fake.creates(update=True)
    fake.status("Updating", config="old-config", pending="Baking")
    fake.answers(answer_of(newest))
    fake.status("InService", config=ANY)
    fake.answers(answer_of(newest))
    fake.retires()  # the blue fleet's Model and EndpointConfig, once it is gone
    assert run_matching_config(fake, registry, newest) == 0, capsys.readouterr().err
    assert (
        "ml.p4d.24xlarge -> ml.g5.2xlarge: autoscaling paused during the rollout" in capsys.readouterr().out
    )
    assert fake.created["ProductionVariants"][0]["InitialInstanceCount"] == 2  # what autoscaling held
    targets = fake.clients.autoscaling.describe_scalable_targets(ServiceNamespace="sagemaker")[
        "ScalableTargets"
    ]
    assert [(t["MinCapacity"], t["MaxCapacity"]) for t in targets] == [(2, 4)]  # registered again


def scalable_targets(fake: Fake) -> list[tuple[int, int]]:
    targets = fake.clients.autoscaling.describe_scalable_targets(ServiceNamespace="sagemaker")[
        "ScalableTargets"
    ]
    return [(t["MinCapacity"], t["MaxCapacity"]) for t in targets]


def test_an_update_endpoint_error_after_autoscaling_was_paused_registers_it_again(world, capsys):
    fake, registry, (older, newest), _ = world
    ep.register_scaling(fake.clients, fake.pool)  # as the first deploy left it
    fake.live(older, instances=2, instance_type="ml.p4d.24xlarge")
    arn = "arn:aws:sagemaker:us-east-1:123456789012:"
    fake.sm.add_response("create_model", {"ModelArn": arn + "model/m"}, None)
    fake.sm.add_response("create_endpoint_config", {"EndpointConfigArn": arn + "endpoint-config/c"}, None)
    fake.sm.add_client_error("update_endpoint", "ValidationException", "Cannot update in-progress endpoint")
    fake.sm.add_response("delete_endpoint_config", {}, None)  # the new configuration, never used
    fake.sm.add_response("delete_model", {}, None)
    assert fake.run(registry, model=newest) == 1
    assert "UpdateEndpoint refused" in capsys.readouterr().err
    assert scalable_targets(fake) == [(2, 4)]


def test_a_failed_rollout_registers_autoscaling_again(world, capsys):
    fake, registry, (older, newest), _ = world
    ep.register_scaling(fake.clients, fake.pool)
    fake.live(older, instances=2, instance_type="ml.p4d.24xlarge")
    fake.creates(update=True)
    fake.status("Failed", config="old-config", reason="the model failed to start")
    assert run_matching_config(fake, registry, newest) == 1
    assert "is Failed: the model failed to start" in capsys.readouterr().err
    assert scalable_targets(fake) == [(2, 4)]


def test_a_version_live_with_a_wrong_smoke_answer_exits_1_and_is_recorded_so_rollback_can_leave_it(
    world, capsys
):
    fake, registry, (older, newest), _ = world
    fake.live(older)
    fake.creates(update=True)
    fake.status("InService", config=ANY)  # no alarm fired within the bakes
    fake.answers("something else entirely")
    fake.retires()
    assert run_matching_config(fake, registry, newest) == 1
    err = capsys.readouterr().err
    assert "differs from the one recorded at evaluation" in err and "ROLLBACK=1" in err
    [record] = ep.deployments(fake.clients, registry.versions, ENDPOINT)
    assert (record["version"], record["previous"]) == (newest, older)


def test_a_failed_endpoint_is_not_live_and_is_refused_naming_the_only_way_out(world, capsys):
    """botocore sagemaker DescribeEndpointOutput.EndpointStatus: "Failed: ... DeleteEndpoint is the only operation
    that can be performed on a failed endpoint"; a first deploy that failed leaves its version's Model behind."""
    fake, registry, (_, newest), _ = world
    fake.live(newest, status="Failed")
    assert fake.run(registry, model=newest) == 2  # no create or update stubbed: none is called
    err = capsys.readouterr().err
    assert f"{ENDPOINT} is Failed" in err and "DeleteEndpoint" in err and "nothing to do" not in err


def test_the_docs_name_every_permission_the_deploy_verb_uses():
    """docs/serving-stack.md lists what the workflow's role needs for make deploy: every API the verb calls
    (trainer/deploy/), and what AWS asks besides: sagemaker:AddTags for Tags on create, iam:PassRole on the
    execution role, iam:CreateServiceLinkedRole for Application Auto Scaling's role (SageMaker Developer Guide,
    "Auto scaling prerequisites"), kms:CreateGrant on the key the EndpointConfig names (CreateEndpointConfig
    KmsKeyId: "The KMS key policy must grant permission to the IAM role that you specify in your CreateEndpoint,
    UpdateEndpoint requests")."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    prefix = {
        "sagemaker": "sagemaker",
        "runtime": "sagemaker",
        "cloudwatch": "cloudwatch",
        "autoscaling": "application-autoscaling",
    }
    calls = {
        f"{prefix[client]}:{''.join(word.title() for word in op.split('_'))}"
        for path in (root / "trainer" / "deploy").glob("*.py")
        for client, op in re.findall(r"clients\.(\w+)\.(\w+)\(", path.read_text())
        if client in prefix
    }
    needed = calls | {"sagemaker:AddTags", "iam:PassRole", "iam:CreateServiceLinkedRole", "kms:CreateGrant"}
    doc = (root / "docs" / "serving-stack.md").read_text()
    assert sorted(action for action in needed if f"`{action}`" not in doc) == []
