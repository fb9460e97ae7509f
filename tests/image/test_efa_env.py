"""image/efa.env against aws-ofi-nccl's own list of EFA variables (doc/efa-env-var.md at v1.21.1, the plugin the EFA
installer pinned in image/compatibility.toml bundles), copied into tests/image/fixtures/aws_ofi_nccl_efa_env_vars.json."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from tests.conftest import ROOT
from trainer.contract.image import efa_environment

DOC = json.loads((Path(__file__).parent / "fixtures" / "aws_ofi_nccl_efa_env_vars.json").read_text())
ROWS = {row["variable"]: row["text"] for row in DOC["rows"]}
TABLE = tomllib.loads((ROOT / "image" / "compatibility.toml").read_text())


def release(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version)[:3])


def not_needed_for_this_image(text: str) -> bool:
    """What the doc says of a variable, read against the image's aws-ofi-nccl and libfabric."""
    if text.startswith(("Not needed", "Do not use", "Not applicable")):
        return True
    if text.startswith("Do not set for libfabric>=1.18.0 and aws-ofi-nccl>=1.7.0"):
        return release(TABLE["efa_installer"]["libfabric"]) >= (1, 18) and release(
            TABLE["aws_ofi_nccl"]["version"]
        ) >= (1, 7)
    if text.startswith("Use for aws-ofi-nccl<=1.5.0"):
        return release(TABLE["aws_ofi_nccl"]["version"]) > (1, 5, 0)
    return False


def test_the_fixture_is_the_docs_table_at_the_images_plugin_version():
    assert (
        DOC["source"]
        == f"github.com/aws/aws-ofi-nccl tag v{TABLE['aws_ofi_nccl']['version']}, doc/efa-env-var.md"
    )
    assert {"FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_FORK_SAFE"} <= set(ROWS)


def test_efa_env_sets_nothing_the_plugin_calls_unneeded():
    unneeded = {variable for variable, text in ROWS.items() if not_needed_for_this_image(text)}
    assert {"FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_FORK_SAFE", "RDMAV_FORK_SAFE"} <= unneeded
    assert unneeded.isdisjoint(efa_environment()), sorted(unneeded & set(efa_environment()))
