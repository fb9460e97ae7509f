"""`python -m trainer deploy --stack ENV --model TAG [--rollback]` (`make deploy STACK=<env> MODEL=<tag>`).

Exit 0: the version is live (or was already: nothing done); 1: the rollout failed or rolled back, naming the
alarm; 2: refused before any change (the version lacks an evaluation or a complete export, no pool, no previous
version to roll back to).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from botocore.exceptions import ClientError

from trainer.checkpoint.version import RecordError
from trainer.contract.serving import canary_instances
from trainer.deploy import endpoint as ep
from trainer.deploy.readiness import check, smoke_of
from trainer.models.registry import Registry, S3Store


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True, help="the stack whose endpoint to deploy to")
    parser.add_argument("--outputs", help="a JSON file of stack outputs instead of `pulumi stack output`")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="a model version or tag (e.g. candidate)")
    what.add_argument("--rollback", action="store_true", help="return to the version live before this one")
    parser.add_argument("--poll-s", type=float, default=30.0, help="seconds between status reads")


def clients_for(region: str) -> ep.Clients:
    from trainer.aws.clients import client

    return ep.Clients(
        sagemaker=client("sagemaker", region),
        runtime=client("sagemaker-runtime", region),
        cloudwatch=client("cloudwatch", region),
        autoscaling=client("application-autoscaling", region),
        s3=client("s3", region),
    )


def main(args: argparse.Namespace) -> int:
    from trainer.aws.clients import client
    from trainer.aws.outputs import StackError, load_outputs

    try:
        outputs = load_outputs(args.stack, args.outputs)
        pool = ep.Pool.from_outputs(args.stack, outputs.values)
    except (StackError, ep.DeployError) as error:
        print(f"deploy: {error}", file=sys.stderr)
        return 2
    clients = clients_for(pool.region)
    sts = client("sts", pool.region)
    store = S3Store(clients.s3, sts, outputs["checkpoints_bucket"], pool.kms_key_arn)
    return deploy(clients, pool, Registry(store), args.model, args.rollback, store.caller, args.poll_s)


def deploy(
    clients: ep.Clients,
    pool: ep.Pool,
    registry: Registry,
    model: str | None,
    rollback: bool,
    caller,
    poll_s: float = 30.0,
    sleep=None,
) -> int:
    try:
        now = ep.live(clients, pool)
        if now is not None and now.status == "Failed":
            # botocore sagemaker DescribeEndpointOutput.EndpointStatus: "DeleteEndpoint is the only operation that
            # can be performed on a failed endpoint"; its Model's version serves nothing.
            raise ep.DeployError(
                f"{pool.endpoint} is Failed (its reason: aws sagemaker describe-endpoint --endpoint-name "
                f"{pool.endpoint}): DeleteEndpoint is the only operation SageMaker allows on it; delete it "
                f"(aws sagemaker delete-endpoint --endpoint-name {pool.endpoint}) and deploy again"
            )
        live = now.version if now is not None else None
        if rollback:
            history = [
                d for d in ep.deployments(clients, registry.versions, pool.endpoint) if d["version"] == live
            ]
            previous = history[-1]["previous"] if history else None
            if previous is None:
                raise ep.DeployError(
                    f"{pool.endpoint}: no version was live before {live or 'nothing'}; nothing to roll back to"
                )
            print(f"deploy: rolling {pool.endpoint} back from {live} to {previous}")
            model = previous
        assert model is not None
        target = registry.find(model)
    except (RecordError, ep.DeployError) as error:
        print(f"deploy: {error}", file=sys.stderr)
        return 2
    version = target.record.version
    if version == live:
        print(f"deploy: {version} is live on {pool.endpoint} already; nothing to do")
        return 0
    ready, missing = check(target, clients.s3)
    if ready is None:
        print(f"deploy: refused: {version} lacks " + "; and ".join(missing), file=sys.stderr)
        return 2
    old_smoke = None
    if live is not None:
        old = next((f for f in registry.versions if f.record.version == live), None)
        old_smoke = next((s for e in (old.evaluations if old else []) if (s := smoke_of(e))), None)
    at = datetime.now(UTC)
    name = ep.resource_name(pool.endpoint, version, at)
    model_request = ep.model_request(pool, ready, name)
    instances = ep.update_instances(pool, now) if now is not None else pool.min_instances
    config_request = ep.endpoint_config_request(pool, name, name, instances)
    deployment = ep.deployment_config(pool, instances) if live is not None else None
    if problems := ep.request_problems(model_request, config_request, deployment):
        print(f"deploy: refused: {'; '.join(problems)}", file=sys.stderr)
        return 2
    print(f"deploy: {version} ({ready.export_uri}) -> {pool.endpoint} on {pool.instance_type}")
    clients.sagemaker.create_model(**model_request)
    clients.sagemaker.create_endpoint_config(**config_request)
    if now is None:
        clients.sagemaker.create_endpoint(
            EndpointName=pool.endpoint, EndpointConfigName=name, Tags=[{"Key": "stack", "Value": pool.stack}]
        )
    else:
        print(
            f"deploy: blue/green from {live}: {instances} x {pool.instance_type}, {ep.canary_words(pool, instances)}, "
            f"{pool.bake_minutes} min bakes, rollback on {', '.join(pool.alarms)}"
        )
        if now.instance_type != pool.instance_type:
            print(
                f"deploy: {now.instance_type} -> {pool.instance_type}: autoscaling paused during the rollout"
            )
            ep.deregister_scaling(clients, pool)
        try:
            clients.sagemaker.update_endpoint(
                EndpointName=pool.endpoint, EndpointConfigName=name, DeploymentConfig=deployment
            )
        except ClientError as error:
            # Nothing changed on the endpoint: its fleet is scaled again as before, the new resources go.
            print(f"deploy: UpdateEndpoint refused: {error}", file=sys.stderr)
            ep.register_scaling(clients, pool)
            ep.retire(clients, name, name)
            return 1
    split = canary_instances(pool.canary_percent, instances) is not None
    rollout = ep.Rollout(clients, pool, name, ready.smoke, old_smoke, poll_s=poll_s, split=split)
    if sleep is not None:
        rollout.sleep = sleep
    try:
        rollout.follow()
    except ep.DeployError as error:
        print(f"deploy: {error}", file=sys.stderr)
        if not isinstance(error, ep.LiveButWrong):
            # Rolled back or failed: whatever fleet serves is scaled as before (deregister_scaling may have
            # paused it); after a rollback the green fleet's Model and EndpointConfig go.
            ep.register_scaling(clients, pool)
            if isinstance(error, ep.RolledBack):
                ep.retire(clients, name, name)
            return 1
        wrong: ep.DeployError | None = error
    else:
        wrong = None
    ep.register_scaling(clients, pool)
    if now is not None:
        ep.retire(clients, now.config, now.model)
    # Live, even with a wrong smoke answer: the record is what ROLLBACK=1 returns from.
    where = ep.record_live(clients, pool, target, at, live, caller())
    if wrong is not None:
        print(
            f"deploy: {version} is live on {pool.endpoint} all the same; recorded in {where}", file=sys.stderr
        )
        return 1
    print(
        f"deploy: {version} is live on {pool.endpoint} ({pool.min_instances}..{pool.max_instances} x "
        f"{pool.instance_type}); recorded in {where}"
    )
    return 0
