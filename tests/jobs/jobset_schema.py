"""The pinned JobSet CRD's schema (../shared/k8s-crds/, kubernetes-sigs/jobset v0.12.0), strict: every object node
that lists `properties` and does not preserve unknown fields gets `additionalProperties: false`, so a misspelt key
fails as the API server's pruning would drop it silently. A local stand-in until the infra half's k8s_validate module
lands (the integrator switches these tests to its `validate`)."""

from __future__ import annotations

import copy
import functools
from typing import Any

import jsonschema
import yaml

from tests.conftest import ROOT

CRDS = ROOT.parent / "shared" / "k8s-crds"
JOBSET_CRD = CRDS / "jobset-v0.12.0_jobsets.yaml"


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        node = {key: _strict(value) for key, value in node.items()}
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
        return node
    if isinstance(node, list):
        return [_strict(item) for item in node]
    return node


@functools.cache
def jobset_validator() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(JOBSET_CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    # The API server checks apiVersion/kind/metadata itself; the CRD schema leaves metadata open.
    return jsonschema.Draft7Validator(schema)


def jobset_errors(manifest: dict[str, Any]) -> list[str]:
    return sorted(
        f"{'.'.join(map(str, error.absolute_path))}: {error.message}"
        for error in jobset_validator().iter_errors(manifest)
    )
