"""Policies called as the analyzer calls them: hand-built resources in wire form, and each stack's offline preview."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from pulumi_policy import (
    Policy,
    PolicyResource,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
)

from policy.offline import policy_resource, policy_resources
from tests.conftest import stack_plan


def make_resource(
    type_: str,
    props: Mapping[str, Any],
    name: str = "r",
    stack: str = "dev",
    protect: bool = False,
    fed_by: Mapping[str, list[PolicyResource]] | None = None,
) -> PolicyResource:
    """A resource as the engine hands it over: props behind the unknown-checking proxy, dependencies by input."""
    made = policy_resource(type_, props, f"urn:pulumi:{stack}::trainstack::{type_}::{name}", name, protect)
    made.property_dependencies = dict(fed_by or {})
    return made


def run_policy(policy: Policy, *resources: PolicyResource) -> list[tuple[str, str]]:
    """(resource name, message) of every violation `policy` reports over `resources`."""
    found: list[tuple[str, str]] = []
    by_urn = {r.urn: r.name for r in resources}

    def collect(default: str) -> Callable[..., None]:
        return lambda message, urn=None: found.append((by_urn.get(urn or "", default), message))

    if isinstance(policy, ResourceValidationPolicy):
        for r in resources:
            policy.validate(
                ResourceValidationArgs(r.resource_type, r.props, r.urn, r.name, r.opts, None), collect(r.name)
            )
    else:
        policy.validate(StackValidationArgs(list(resources)), collect("stack"))
    return found


@pytest.fixture(scope="session")
def resource():
    """`resource(type, props, name=..., stack=..., protect=..., fed_by={input: [resources]})`."""
    return make_resource


@pytest.fixture(scope="session")
def violations():
    """`violations(policy, *resources)` -> [(resource name, message), ...]."""
    return run_policy


@functools.cache
def _planned(stack: str, changes: tuple[tuple[str, Any], ...]) -> list[PolicyResource]:
    return policy_resources(stack_plan(stack, changes))


@pytest.fixture(scope="session")
def planned():
    """`planned("prod", **{"trainstack:key": value})`: a stack's offline preview as policy resources, once a session."""
    return lambda stack, **changes: _planned(stack, tuple(sorted(changes.items())))


def without_statements(name: str, *sids: str, input_: str = "policy"):
    """An edit that drops the statements `sids` from resource `name`'s policy document."""

    def edit(resource):
        if resource.name != name or input_ not in resource.inputs:
            return resource
        document = json.loads(resource.inputs[input_])
        document["Statement"] = [s for s in document["Statement"] if s.get("Sid") not in sids]
        return dataclasses.replace(resource, inputs={**resource.inputs, input_: json.dumps(document)})

    return edit
