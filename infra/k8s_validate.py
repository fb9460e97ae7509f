"""Offline validation of every Kubernetes object trainstack generates, with no API server.

Built-in kinds (PersistentVolume, Namespace, Pod, ...) are checked with `kubernetes-validate` in strict mode against
the OpenAPI schemas of the cluster's minor (infra/k8s_versions.py); a kind it has no schema for is an error, not a
warning. Custom resources are checked against the `openAPIV3Schema` of pinned upstream CRDs: JobSet and Kueue from
`../shared/k8s-crds/` (or `$TRAINSTACK_K8S_CRDS`), Karpenter from the project's own fixtures in `infra/crds/`, with `additionalProperties: false` added wherever the schema lists
properties and does not preserve unknown fields, so a misspelt key fails as it would under `kubectl --validate=strict`.
What it cannot see: CEL `x-kubernetes-validations`, admission webhooks (objects are checked as sent, before a
defaulting webhook fills in fields such as JobSet's failure-rule names), and whether the cluster has the CRD at all.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from infra.k8s_versions import CRD_FILE_PREFIXES, KUBERNETES_MINOR, LOCAL_CRD_FILE_PREFIXES

ROOT = Path(__file__).resolve().parent.parent
CRDS_ENV = "TRAINSTACK_K8S_CRDS"
# Kept beside the repository, not in it: the pinned upstream CRDs (see that folder's README), in `shared/` next to
# the checkout (../shared) or next to a folder above it (a checkout nested one level deeper).
SHARED_CRDS = Path("shared") / "k8s-crds"
DEFAULT_CRDS = ROOT.parent / SHARED_CRDS
# Schemas of charts only this project installs (Karpenter), kept in the repository as pinned fixtures.
LOCAL_CRDS = ROOT / "infra" / "crds"

_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


class K8sValidationError(ValueError):
    """A generated Kubernetes object the API server would refuse; the message names kind, name, path and why."""


def crds_dir() -> Path:
    """Where the pinned CRD schemas are read from: $TRAINSTACK_K8S_CRDS, else the nearest shared/k8s-crds beside
    the checkout or a folder above it (../shared/k8s-crds first); where none is, ../shared/k8s-crds (its error
    says what to set)."""
    if given := os.environ.get(CRDS_ENV):
        return Path(given)
    for folder in ROOT.parents:
        if (folder / SHARED_CRDS).is_dir():
            return folder / SHARED_CRDS
    return DEFAULT_CRDS


def validate(obj: dict[str, Any]) -> None:
    """Raise K8sValidationError unless `obj` is valid for the pinned cluster minor or its pinned CRD."""
    kind, api_version = obj.get("kind"), obj.get("apiVersion")
    name = (
        (obj.get("metadata") or {}).get("name", "<no name>") if isinstance(obj.get("metadata"), dict) else "?"
    )
    if not isinstance(kind, str) or not isinstance(api_version, str):
        raise K8sValidationError(
            f"object {name}: apiVersion and kind must both be strings (got apiVersion={api_version!r}, kind={kind!r})"
        )
    where = f"{kind} {name} ({api_version})"
    schema = _crd_schemas(str(crds_dir())).get((api_version, kind))
    if schema is None:
        _validate_builtin(obj, where)
    else:
        _validate_custom(obj, schema, where)


def _validate_builtin(obj: dict[str, Any], where: str) -> None:
    try:
        kubernetes_validate.validate(obj, KUBERNETES_MINOR, strict=True)
    except kubernetes_validate.SchemaNotFoundError as e:
        raise K8sValidationError(
            f"{where}: no schema at Kubernetes {KUBERNETES_MINOR} in kubernetes-validate and no pinned CRD in "
            f"{crds_dir()} (kinds there: {', '.join(sorted({k for _, k in _crd_schemas(str(crds_dir()))}))})"
            f"; {e.message}"
        ) from None
    except kubernetes_validate.ValidationError as e:
        raise K8sValidationError(f"{where}: {_path(e.absolute_path)}: {e.message}") from None


def _validate_custom(obj: dict[str, Any], schema: dict[str, Any], where: str) -> None:
    problems = [
        f"{_path(error.absolute_path)}: {error.message}"
        for error in jsonschema.Draft7Validator(schema).iter_errors(obj)
    ]
    # A CRD schema leaves metadata open; the API server still applies ObjectMeta to it.
    if isinstance(obj.get("metadata"), dict):
        problems += [
            f"metadata.{_path(error.absolute_path)}: {error.message}".replace(
                "metadata.(top level)", "metadata"
            )
            for error in _object_meta_validator().iter_errors(obj["metadata"])
        ]
    if problems:
        raise K8sValidationError(f"{where}: " + "; ".join(sorted(problems)))


def _path(path: Any) -> str:
    return ".".join(str(part) for part in path) or "(top level)"


@functools.cache
def _crd_schemas(directory: str) -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> strict openAPIV3Schema, for every served version of every pinned CRD file."""
    folder = Path(directory)
    if not folder.is_dir():
        raise K8sValidationError(
            f"the pinned CRD schemas are not at {folder}: set {CRDS_ENV} to the folder holding "
            f"{', '.join(p + '*.yaml' for p in CRD_FILE_PREFIXES)} (the project reads them from ../shared/k8s-crds)"
        )
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for where, prefix in [
        *((folder, p) for p in CRD_FILE_PREFIXES),
        *((LOCAL_CRDS, p) for p in LOCAL_CRD_FILE_PREFIXES),
    ]:
        files = sorted(where.glob(f"{prefix}*.yaml"))
        if not files:
            raise K8sValidationError(
                f"no CRD file {prefix}*.yaml in {where}: the pins in infra/k8s_versions.py "
                f"and the schemas there disagree"
            )
        for path in files:
            crd = yaml.safe_load(path.read_text())
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if version.get("served", True):
                    schemas[(f"{group}/{version['name']}", kind)] = _strict(
                        version["schema"]["openAPIV3Schema"]
                    )
    return schemas


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of a CRD schema that refuses unknown fields wherever the CRD lists its fields and keeps no unknowns."""
    strict = copy.deepcopy(schema)

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(strict)
    return strict


@functools.cache
def _object_meta_validator() -> jsonschema.Validator:
    """ObjectMeta from kubernetes-validate's strict schemas at the pinned minor, for a custom resource's metadata."""
    definitions = kubernetes_validate.utils.schema_contents(
        f"kubernetes-json-schema/v{KUBERNETES_MINOR}.0-local-strict/_definitions.json", KUBERNETES_MINOR
    )
    schema = {"$ref": f"#/$defs/{_OBJECT_META}", "$defs": definitions["$defs"]}
    return jsonschema.Draft202012Validator(schema)
