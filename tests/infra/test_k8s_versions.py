"""The in-cluster pins (infra/k8s_versions.py) agree with what validates them: the CRD files, kubernetes-validate."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from infra import k8s_validate
from infra.k8s_versions import (
    CRD_FILE_PREFIXES,
    HELM_CHARTS,
    JOBSET_API_VERSION,
    KUBERNETES_MINOR,
    KUEUE_API_VERSION,
    version_tuple,
)


def test_every_chart_is_pinned_at_or_past_its_fixed_version():
    for chart in HELM_CHARTS:
        assert version_tuple(chart.version) >= version_tuple(chart.fixed), chart.release
        assert (chart.repository is None) == chart.chart.startswith("oci://"), chart.release


def test_the_crd_files_for_the_pinned_charts_are_there():
    for prefix in CRD_FILE_PREFIXES:
        assert sorted(k8s_validate.crds_dir().glob(f"{prefix}*.yaml")), prefix


@pytest.mark.parametrize(
    ("api_version", "kind"), [(JOBSET_API_VERSION, "JobSet"), (KUEUE_API_VERSION, "ClusterQueue")]
)
def test_the_pinned_api_versions_are_served_by_the_pinned_crds(api_version, kind):
    group, version = api_version.split("/")
    served = {
        (crd["spec"]["group"], v["name"])
        for path in k8s_validate.crds_dir().glob("*.yaml")
        if path.name.startswith(CRD_FILE_PREFIXES)
        for crd in [yaml.safe_load(path.read_text())]
        if crd["spec"]["names"]["kind"] == kind
        for v in crd["spec"]["versions"]
        if v.get("served")
    }
    assert (group, version) in served


def test_kubernetes_validate_ships_the_clusters_minor():
    assert KUBERNETES_MINOR in {
        kubernetes_validate.utils.major_minor(v) for v in kubernetes_validate.utils.all_versions()
    }


def test_versions_compare_as_numbers():
    assert version_tuple("v1.18.5-eksbuild.2") == (1, 18, 5)
    assert version_tuple("0.19.10") > version_tuple("0.19.3")
    with pytest.raises(ValueError, match="'latest' is not a dotted release"):
        version_tuple("latest")


def test_the_karpenter_crd_fixtures_are_the_pinned_release_and_name_their_source():
    from infra.k8s_versions import KARPENTER, LOCAL_CRD_FILE_PREFIXES

    files = sorted(k8s_validate.LOCAL_CRDS.glob(f"{LOCAL_CRD_FILE_PREFIXES[0]}*.yaml"))
    assert [f.name.split("_", 1)[1] for f in files] == [
        "ec2nodeclasses.yaml",
        "nodeoverlays.yaml",
        "nodepools.yaml",
    ]
    for path in files:
        header = path.read_text().splitlines()[0]
        assert f"aws/karpenter-provider-aws tag v{KARPENTER.version}" in header, path.name
