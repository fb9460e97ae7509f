"""image/compatibility.toml against its sources: the pins (image/versions.env, requirements/, megatron_compat), the
installed megatron-core's declared requirements (package metadata), megatron-core's CI base image (fixture copied
from NVIDIA/Megatron-LM core_v0.16.1) and the aws-ofi-nccl format-string fixture; and the in-image check."""

import json
import re
from importlib import metadata
from pathlib import Path

from packaging.specifiers import SpecifierSet

from tests.conftest import ROOT
from trainer.contract.compatibility import compatibility_table, declared_requirement, installed_problems
from trainer.contract.image import image_pins
from trainer.distributed.megatron_compat import MEGATRON_CORE_VERSION

FIXTURES = Path(__file__).parent / "fixtures"
TABLE = compatibility_table()


def pin(path: Path, package: str) -> str:
    (version,) = re.findall(rf"^{package}==(\S+)$", path.read_text(), re.MULTILINE)
    return version


def test_pins_are_the_tables():
    assert image_pins()["BASE_IMAGE"] == TABLE["base_image"]["image"]
    assert image_pins()["EFA_INSTALLER_VERSION"] == TABLE["efa_installer"]["version"]
    core = TABLE["megatron_core"]["version"]
    assert pin(ROOT / "requirements" / "train.txt", "megatron-core") == core
    assert pin(ROOT / "requirements" / "lock.txt", "megatron-core") == core
    assert core == MEGATRON_CORE_VERSION


def test_base_image_is_the_one_megatron_core_ci_builds_on():
    ci = json.loads((FIXTURES / "megatron_core_ci_base.json").read_text())
    assert ci["tag"] == f"core_v{TABLE['megatron_core']['version']}"
    assert ci["files"]["docker/.ngc_version.dev"].strip() == TABLE["base_image"]["image"]


def test_megatron_core_requirements_are_its_own_metadata():
    core = TABLE["megatron_core"]
    assert metadata.version("megatron-core") == core["version"]
    assert declared_requirement("megatron-core", "torch") == SpecifierSet(core["torch"])
    te = declared_requirement("megatron-core", "transformer-engine", extra="dev")
    assert te == SpecifierSet(core["transformer_engine"])


def test_efa_installer_bundles_the_plugin_whose_log_lines_the_preflight_parses():
    assert TABLE["efa_installer"]["aws_ofi_nccl"] == TABLE["aws_ofi_nccl"]["version"]
    assert TABLE["efa_installer"]["libfabric"] == TABLE["aws_ofi_nccl"]["libfabric_tested"]
    formats = json.loads((ROOT / "tests" / "fixtures" / "aws_ofi_nccl_provider_formats.json").read_text())[
        "formats"
    ]
    assert f"v{TABLE['aws_ofi_nccl']['version']}" in {entry["tag"] for entry in formats}


def test_in_image_check_accepts_the_tested_set_and_names_what_is_off():
    core = TABLE["megatron_core"]["version"]
    good = {"megatron-core": core, "torch": "2.10.0a0+b4e4ee81d3", "transformer-engine": "2.10.0+769ed778"}
    assert installed_problems(good.__getitem__) == []
    newer_te = installed_problems({**good, "transformer-engine": "2.13.0"}.__getitem__)
    assert newer_te == [
        "transformer-engine 2.13.0 is outside <2.12.0,>=2.9.0a0 (image/compatibility.toml, megatron-core "
        f"{core}'s declared requirement); choose a base image or megatron-core that fit"
    ]
    # This CPU environment has no TransformerEngine: the check says so instead of passing.
    assert installed_problems() == [
        "transformer-engine is not installed; image/compatibility.toml needs transformer-engine<2.12.0,>=2.9.0a0"
    ]
