"""The offline validator: upstream examples pass, the mistakes the API server would refuse fail with kind, name, path."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import k8s_validate
from infra.k8s_validate import K8sValidationError, validate

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "k8s"


def _objects(name: str) -> list[dict[str, Any]]:
    return [obj for obj in yaml.safe_load_all((FIXTURES / name).read_text()) if obj]


@pytest.fixture
def jobset() -> dict[str, Any]:
    return _objects("jobset_host_maintenance.yaml")[0]


@pytest.fixture
def fsx_pv() -> dict[str, Any]:
    return _objects("fsx_static_pv.yaml")[0]


def test_upstream_examples_pass():
    for name in ("fsx_static_pv.yaml", "kueue_single_clusterqueue.yaml"):
        for obj in _objects(name):
            validate(obj)


def test_the_jobset_example_passes_once_its_failure_rules_are_named(jobset):
    # The CRD requires rules[].name; JobSet's defaulting webhook fills it in on a server (failurePolicyRule<i>,
    # pkg/webhooks/jobset_webhook.go), which this offline check does not run: generated JobSets name their rules.
    with pytest.raises(K8sValidationError, match=r"failurePolicy\.rules\.0: 'name' is a required property"):
        validate(jobset)
    for index, rule in enumerate(jobset["spec"]["failurePolicy"]["rules"]):
        rule["name"] = f"failurePolicyRule{index}"
    validate(jobset)


def test_a_misspelt_jobset_field_is_refused_with_its_path(jobset):
    for index, rule in enumerate(jobset["spec"]["failurePolicy"]["rules"]):
        rule["name"] = f"failurePolicyRule{index}"
    jobset["spec"]["failurPolicy"] = jobset["spec"].pop("failurePolicy")
    with pytest.raises(
        K8sValidationError, match=r"JobSet host-maintenance-event-model .*spec: .*'failurPolicy'"
    ):
        validate(jobset)


def test_a_misspelt_field_in_the_embedded_pod_is_refused(jobset):
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["resourcez"] = {"limits": {"vpc.amazonaws.com/efa": 32}}
    with pytest.raises(
        K8sValidationError, match=r"replicatedJobs\.0\.template\.spec\.template\.spec\.containers\.0"
    ):
        validate(jobset)


def test_an_unknown_failure_policy_action_is_refused(jobset):
    jobset["spec"]["failurePolicy"]["rules"][0]["action"] = "Restart"
    with pytest.raises(K8sValidationError, match=r"failurePolicy\.rules\.0\.action: 'Restart' is not one of"):
        validate(jobset)


def test_custom_resource_metadata_is_checked_as_object_meta(jobset):
    jobset["metadata"]["label"] = {"a": "b"}
    with pytest.raises(K8sValidationError, match=r"metadata: .*'label' was unexpected"):
        validate(jobset)


def test_a_builtin_kind_is_checked_strictly(fsx_pv):
    fsx_pv["spec"]["csi"]["volumeHandel"] = fsx_pv["spec"]["csi"].pop("volumeHandle")
    with pytest.raises(K8sValidationError, match=r"PersistentVolume fsx-pv \(v1\): spec\.csi: "):
        validate(fsx_pv)


def test_a_wrong_type_in_a_builtin_kind_is_refused(fsx_pv):
    fsx_pv["spec"]["accessModes"] = "ReadWriteMany"
    with pytest.raises(
        K8sValidationError, match=r"spec\.accessModes: 'ReadWriteMany' is not of type 'array'"
    ):
        validate(fsx_pv)


def test_a_kind_with_no_schema_is_an_error_not_a_warning():
    with pytest.raises(K8sValidationError, match=r"TrainJob x .*no schema at Kubernetes"):
        validate(
            {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "x"}}
        )


def test_a_kueue_quota_of_the_wrong_shape_is_refused():
    queue = copy.deepcopy(_objects("kueue_single_clusterqueue.yaml")[1])
    queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = [9]
    with pytest.raises(K8sValidationError, match=r"ClusterQueue cluster-queue .*nominalQuota"):
        validate(queue)


def test_a_missing_crd_folder_says_where_to_point(tmp_path, monkeypatch, jobset):
    monkeypatch.setenv(k8s_validate.CRDS_ENV, str(tmp_path / "absent"))
    with pytest.raises(K8sValidationError, match=r"not at .*absent: set TRAINSTACK_K8S_CRDS"):
        validate(jobset)


def test_a_crd_folder_without_the_pinned_versions_is_refused(tmp_path, monkeypatch, jobset):
    (tmp_path / "jobset-v0.11.0_jobsets.yaml").write_text("{}")
    monkeypatch.setenv(k8s_validate.CRDS_ENV, str(tmp_path))
    with pytest.raises(K8sValidationError, match=r"no CRD file jobset-v0\.12\.0_\*\.yaml"):
        validate(jobset)


def test_strict_keeps_fields_the_crd_leaves_open():
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {}}
        },
    }
    strict = k8s_validate._strict(schema)
    assert strict["additionalProperties"] is False
    assert "additionalProperties" not in strict["properties"]["a"]
