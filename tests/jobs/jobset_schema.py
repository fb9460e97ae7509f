"""The JobSets the job tools render, checked as the stack's other Kubernetes objects are (infra/k8s_validate.py):
against the pinned JobSet v0.12.0 CRD schema in ../shared/k8s-crds/, with unknown fields rejected."""

from __future__ import annotations

from typing import Any

from infra.k8s_validate import K8sValidationError, validate


def jobset_errors(manifest: dict[str, Any]) -> list[str]:
    """What the validator refuses in `manifest` (one message naming the path and why), or nothing."""
    try:
        validate(manifest)
    except K8sValidationError as error:
        return [str(error)]
    return []
