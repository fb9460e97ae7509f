"""Every version the image uses comes from one pin source: image/versions.env for the base image and the EFA
installer, requirements/ for Python packages (the same pins `make train` installs)."""

import re
import subprocess

from tests.conftest import ROOT
from trainer.contract.image import efa_environment, image_pins

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


def test_efa_installer_runs_for_containers_without_its_ngc_detection():
    # --disable-ngc --disable-build-ngc: awslabs/awsome-distributed-ai PR #1153 and its Dockerfiles for installers
    # newer than 1.47, which otherwise install an NGC plugin variant or skip rdma-core on NGC bases.
    assert (
        "./efa_installer.sh -y -g -d --skip-kmod --skip-limit-conf --no-verify --disable-ngc --disable-build-ngc"
        in DOCKERFILE
    )
    assert "aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" in DOCKERFILE
    # The layout step runs in the installer's own layer, before anything else can use the plugin.
    install = next(line for line in INSTRUCTIONS if "efa_installer.sh" in line)
    after = INSTRUCTIONS[INSTRUCTIONS.index(install) :]
    assert "    && python /opt/trainstack/image/build_checks.py plugin-layout \\" in after[:4]


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


def _env(key: str) -> str:
    """The value an ENV instruction gives `key` (shell-quoted as in the Dockerfile)."""
    match = re.search(
        rf"\b{key}=(\"[^\"]*\"|\S*)",
        "\n".join(line for line in INSTRUCTIONS if line.lstrip().startswith(("ENV", key))),
    )
    return match.group(1).strip('"')


def test_every_path_into_the_container_gets_efa_envs_plugin_and_network():
    # `docker run --entrypoint python` skips entrypoint.sh: the image's ENV itself names aws-ofi-nccl and makes NCCL
    # fail instead of falling back to sockets. An empty NCCL_NET_PLUGIN would load no plugin (NCCL 2.28).
    for key in ("NCCL_NET_PLUGIN", "NCCL_NET"):
        assert _env(key) == efa_environment()[key], key
    assert "ENV NCCL_NET_PLUGIN=" + "\n" not in DOCKERFILE + "\n"


def test_the_library_path_names_no_plugin_directory():
    # The plugin's directory is registered with the loader by build_checks.py plugin-layout, whichever package the
    # installer chose (tests/image/test_build_checks.py walks every layout).
    assert "ofi-nccl" not in _ld_library_path()
    assert "/opt/amazon/efa/lib" in _ld_library_path()


def test_the_build_prints_what_the_base_ships_before_changing_it():
    base_report = INSTRUCTIONS.index("RUN python /opt/trainstack/image/build_checks.py base-report")
    removal = next(i for i, line in enumerate(INSTRUCTIONS) if "apt-get remove" in line)
    plugin_env = next(i for i, line in enumerate(INSTRUCTIONS) if line.startswith("ENV NCCL_NET_PLUGIN="))
    assert base_report < removal < plugin_env


def test_torch_and_numpy_are_checked_around_the_pip_install():
    code = "\n".join(INSTRUCTIONS)
    before = code.index("build_checks.py before-pip /tmp/base.json /tmp/base-torch.txt")
    install = code.index("pip install --no-cache-dir -c /tmp/base-torch.txt")
    after = code.index("build_checks.py after-pip /tmp/base.json")
    assert before < install < after


def test_the_build_checks_the_tested_set_and_the_plugin_in_the_image():
    final = INSTRUCTIONS[INSTRUCTIONS.index('ENTRYPOINT ["/opt/trainstack/image/entrypoint.sh"]') - 5 :]
    code = "\n".join(final)
    assert "import transformer_engine.pytorch, megatron.core.extensions.transformer_engine" in code
    assert "python -m trainer.contract.compatibility" in code
    assert "python image/build_checks.py versions" in code
    assert "python -m trainer.preflight.netplugin" in code


def test_the_image_runs_as_the_contracts_non_root_user():
    # Kubernetes "Pod Security Standards", restricted: runAsNonRoot, which the kubelet can verify only for a
    # numeric USER; the pod's runAsUser (trainer/jobs/jobset.py) is the same id.
    from trainer.contract.container import CONTAINER_UID

    users = [line.split(maxsplit=1)[1] for line in INSTRUCTIONS if line.startswith("USER")]
    assert users and users[-1] == f"{CONTAINER_UID}:{CONTAINER_UID}" and CONTAINER_UID != 0
    (made,) = [line for line in INSTRUCTIONS if "useradd" in line]
    assert f"--uid {CONTAINER_UID}" in made and f"--gid {CONTAINER_UID}" in made
