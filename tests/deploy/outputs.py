"""The outputs of a stack with an inference pool (infra/serving.py SERVING_OUTPUTS), as the deploy tests and the
bad-input catalogue give them: one place, the pinned image from the contract."""

from __future__ import annotations

from trainer.contract.serving import lmi_image


def pool_outputs(endpoint: str, region: str) -> dict[str, object]:
    return {
        "serving_endpoint": endpoint,
        "serving_role_arn": "arn:aws:iam::123456789012:role/trainstack-test-serving-role",
        "serving_security_group": "sg-0123456789abcdef0",
        "serving_subnets": ["subnet-0123456789abcdef0"],
        "serving_image": lmi_image(region),
        "serving_instance_type": "ml.g5.2xlarge",
        "serving_min_instances": 2,
        "serving_max_instances": 4,
        "serving_invocations_per_instance": 60,
        "serving_canary_percent": 50,
        "serving_bake_minutes": 10,
        "serving_alarms": [f"{endpoint}-errors", f"{endpoint}-latency", f"{endpoint}-smoke"],
    }
