"""Every version the image uses comes from one pin source: image/versions.env for the base image and the EFA
installer, requirements/ for Python packages (the same pins `make train` installs)."""

import re
import subprocess
from pathlib import Path

from trainer.contract.image import efa_environment, image_pins
from trainer.preflight.netplugin import resolve, search_dirs

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


def _ld_library_path() -> str:
    """The LD_LIBRARY_PATH the Dockerfile's ENV gives the image (the base image's own value left as '')."""
    env = re.search(r"LD_LIBRARY_PATH=(\S+)", DOCKERFILE).group(1)
    return env.replace("${LD_LIBRARY_PATH}", "")


def test_hpcx_ucx_and_ucc_stay_and_only_mpi_goes():
    # NGC's torch links HPC-X's libucc/libucs (awslabs/awsome-distributed-ai #16, #707).
    removed = " ".join(line for line in INSTRUCTIONS if "rm -rf" in line)
    assert "/opt/hpcx/ompi" in removed and "/usr/local/mpi" in removed
    assert "ucx" not in removed and "ucc" not in removed and "/opt/hpcx " not in removed + " "
    assert "ld.so.conf" not in removed
    assert "python -c 'import torch'" in DOCKERFILE, "the build proves torch still imports after the removal"


def test_base_image_plugin_default_is_emptied_so_efa_env_applies():
    assert "ENV NCCL_NET_PLUGIN=" in INSTRUCTIONS
    assert efa_environment()["NCCL_NET_PLUGIN"]


def test_image_library_path_finds_the_efa_installers_aws_ofi_nccl(tmp_path):
    # The EFA installer installs aws-ofi-nccl under /opt/amazon/ofi-nccl/lib (the prefix NGC's leftover
    # /etc/ld.so.conf.d/aws-ofi-nccl.conf registers: NVIDIA-NeMo/Megatron-Bridge PR #5033) and, for CUDA builds,
    # always as libnccl-net-ofi.so (aws/aws-ofi-nccl src/Makefile.am, v1.15.0+, libtool -module -avoid-version).
    installed = tmp_path / "opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"
    installed.parent.mkdir(parents=True)
    installed.touch()
    dirs = search_dirs(_ld_library_path(), cache_dirs=[])
    assert resolve(efa_environment()["NCCL_NET_PLUGIN"], dirs, root=tmp_path) == installed
    # The base image's default (spcx) would not load it, nor would an unset value (libnccl-net.so).
    assert resolve("spcx", dirs, root=tmp_path) is None
    assert resolve(None, dirs, root=tmp_path) is None


def test_the_build_checks_the_tested_set_and_the_plugin_in_the_image():
    final = INSTRUCTIONS[INSTRUCTIONS.index('ENTRYPOINT ["/opt/trainstack/image/entrypoint.sh"]') - 4 :]
    code = "\n".join(final)
    assert "import transformer_engine.pytorch, megatron.core.extensions.transformer_engine" in code
    assert "python -m trainer.contract.compatibility" in code
    assert "python -m trainer.preflight.netplugin" in code
