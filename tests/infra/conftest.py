"""Each checked-in stack's program, run once per session under the Pulumi mocks (about a second each)."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from infra.config import StackConfig, load_stack_config, parse_stack_config, read_stack_file
from infra.mocks import PlannedResource
from infra.preview import Plan
from tests.conftest import stack_plan
from trainer.contract.stack import stack_names


class Planned:
    """A stack's plan with the lookups the tests share."""

    def __init__(self, plan: Plan, config: StackConfig) -> None:
        self.plan, self.config, self.stack = plan, config, plan.stack

    def all(self, short_type: str) -> list[PlannedResource]:
        """Resources of one type, named as in the Python SDK: `ec2.LaunchTemplate`."""
        module, cls = short_type.split(".")
        return [
            r
            for r in self.plan.resources
            if r.type.startswith(f"aws:{module}/") and r.type.endswith(f":{cls}")
        ]

    def one(self, short_type: str, name_suffix: str = "") -> PlannedResource:
        found = [r for r in self.all(short_type) if r.name.endswith(name_suffix)]
        assert len(found) == 1, (
            f"expected one {short_type} named *{name_suffix}, found {[r.name for r in found]}"
        )
        return found[0]

    def by_id(self, resource_id: str) -> PlannedResource:
        return next(r for r in self.plan.resources if r.id == resource_id)

    @property
    def key_arn(self) -> str:
        return self.one("kms.Key").outputs["arn"]

    @property
    def efa_group(self) -> PlannedResource:
        return self.one("ec2.SecurityGroup", "-efa")

    @property
    def launch_template(self) -> PlannedResource:
        return self.one("ec2.LaunchTemplate", "-gpu")

    @property
    def node_container(self) -> dict[str, Any]:
        nodes = json.loads(self.one("batch.JobDefinition", "-train").inputs["nodeProperties"])
        return nodes["nodeRangeProperties"][0]["container"]

    def policies(self) -> list[tuple[str, dict[str, Any]]]:
        """Every IAM policy document the stack registers: role policies, trust policies, bucket and key policies."""
        found = [(r.name, r.inputs["policy"]) for r in self.plan.resources if "policy" in r.inputs]
        found += [(r.name, r.inputs["assumeRolePolicy"]) for r in self.all("iam.Role")]
        documents = [(name, json.loads(document)) for name, document in found]
        return [(name, document) for name, document in documents if "Statement" in document]


@functools.cache
def planned(name: str) -> Planned:
    return Planned(stack_plan(name), load_stack_config(name))


@functools.cache
def _variant(stack: str, changes: tuple[tuple[str, Any], ...]) -> Planned:
    return Planned(
        stack_plan(stack, changes), parse_stack_config(stack, {**read_stack_file(stack), **dict(changes)})
    )


@pytest.fixture(scope="session")
def variant():
    """`variant("prod", **{"trainstack:key": value})`: a stack file with changes, run once per session."""
    return lambda stack, **changes: _variant(stack, tuple(sorted(changes.items())))


@pytest.fixture(scope="session", params=stack_names())
def stack(request) -> Planned:
    return planned(request.param)


def _orchestrated_by(orchestrator: str) -> list[str]:
    return [name for name in stack_names() if load_stack_config(name).orchestrator == orchestrator]


@pytest.fixture(scope="session", params=_orchestrated_by("batch"))
def batch_stack(request) -> Planned:
    """Each checked-in stack whose jobs run on AWS Batch: what only the Batch path creates."""
    return planned(request.param)


@pytest.fixture(scope="session", params=_orchestrated_by("eks"))
def eks_stack(request) -> Planned:
    """Each checked-in stack whose jobs run on EKS (infra/eks.py, infra/cluster_software.py)."""
    return planned(request.param)


@pytest.fixture(scope="session")
def prod() -> Planned:
    return planned("prod")


@pytest.fixture(scope="session")
def dev() -> Planned:
    return planned("dev")
