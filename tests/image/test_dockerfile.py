"""Every version the image uses comes from one pin source: image/versions.env for the base image and the EFA
installer, requirements/ for Python packages (the same pins `make train` installs)."""

import re
import subprocess
from pathlib import Path

from trainer.contract.image import image_pins

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "image" / "Dockerfile").read_text()
INSTRUCTIONS = [
    line for line in DOCKERFILE.splitlines() if line.strip() and not line.lstrip().startswith("#")
]


def test_every_build_arg_is_a_pin_without_a_default():
    args = [line.split()[1] for line in INSTRUCTIONS if line.startswith("ARG ")]
    assert sorted(args) == sorted(image_pins()), "ARGs and image/versions.env must name the same pins"
    assert all("=" not in arg for arg in args), "a default would be a second copy of the pin"


def test_no_version_literal_outside_the_pin_source():
    code = "\n".join(INSTRUCTIONS)
    assert not re.search(r"\b\d+\.\d+\.\d+\b", code), "a version number is written into the Dockerfile"
    assert "==" not in code.replace("torch==", ""), "a package pinned inline instead of in requirements/"


def test_base_image_is_pinned_by_tag():
    assert INSTRUCTIONS[1] == "FROM ${BASE_IMAGE}"
    assert re.fullmatch(
        r"nvcr\.io/nvidia/pytorch:\d\d\.\d\d-py3(@sha256:[0-9a-f]{64})?", image_pins()["BASE_IMAGE"]
    )


def test_python_packages_come_from_the_train_requirements():
    installs = [line for line in DOCKERFILE.splitlines() if "pip install" in line]
    assert len(installs) == 1
    assert "-r /tmp/train.txt" in installs[0] and "-c /tmp/lock.txt" in installs[0]
    assert "sed '/^torch==/d' requirements/train.txt > /tmp/train.txt" in DOCKERFILE


def test_efa_installer_runs_for_containers():
    assert "./efa_installer.sh -y -g -d --skip-kmod --skip-limit-conf --no-verify" in DOCKERFILE
    assert "aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" in DOCKERFILE


def test_make_image_passes_every_pin_as_a_build_arg():
    dry_run = subprocess.run(
        ["make", "-n", "image", "IMAGE_TAG=test"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    for key, value in image_pins().items():
        assert f"--build-arg {key}={value}" in dry_run
    assert "-f image/Dockerfile" in dry_run and "-t trainstack:test" in dry_run


def test_the_container_contract_is_read_from_container_env_not_repeated():
    from trainer.contract.container import CHECKPOINTS_DIR, DATASETS_DIR, FSX_MOUNT

    code = "\n".join(INSTRUCTIONS)
    assert FSX_MOUNT not in code and CHECKPOINTS_DIR not in code and DATASETS_DIR not in code
    assert not any(line.startswith("CMD") for line in INSTRUCTIONS), "the default command is container.env's"
    entrypoint = (ROOT / "image" / "entrypoint.sh").read_text()
    assert '"${here}/container.env"' in entrypoint and "TRAINSTACK_DEFAULT_CONFIG" in entrypoint
