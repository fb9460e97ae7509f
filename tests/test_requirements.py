"""Every dependency is pinned exactly, and the full lock agrees with each requirements file."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REQUIREMENTS = Path(__file__).resolve().parent.parent / "requirements"
# A version may carry an epoch (PEP 440 `N!`): grafana-foundation-sdk numbers its builds so.
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)(\[[a-z,]+\])?==((?:[0-9]+!)?[0-9][A-Za-z0-9.+\-]*)$")


def requirement_lines(path: Path) -> list[str]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("-r ")]


def lock() -> dict[str, str]:
    return {
        m.group(1).lower().replace("_", "-"): m.group(3)
        for m in map(PIN.match, requirement_lines(REQUIREMENTS / "lock.txt"))
    }


@pytest.mark.parametrize("name", ["train.txt", "infra.txt", "dev.txt", "lock.txt"])
def test_every_requirement_is_an_exact_pin_that_the_lock_agrees_with(name):
    locked = lock()
    for line in requirement_lines(REQUIREMENTS / name):
        match = PIN.match(line)
        assert match, f"{name}: {line!r} is not an exact pin (name==version)"
        assert locked.get(match.group(1).lower().replace("_", "-")) == match.group(3), (
            f"{name}: {line} not in lock"
        )


@pytest.mark.parametrize("name", ["train.txt", "infra.txt", "dev.txt", "lock.txt"])
def test_each_package_is_pinned_once_per_file(name):
    names = [PIN.match(line).group(1).lower() for line in requirement_lines(REQUIREMENTS / name)]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_torch_and_megatron_core_pins():
    assert lock()["torch"] == "2.13.0"
    assert lock()["megatron-core"] == "0.16.1"


def test_make_venv_satisfies_make_trains_and_the_infra_verbs_install_stamps(tmp_path):
    # A stand-in interpreter (pip "succeeds" at once), so that Make's own rules are what is tested.
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 0\n")
    (venv / "bin" / "python").chmod(0o755)
    root = REQUIREMENTS.parent
    make = ["make", "--no-print-directory", f"VENV={venv}"]
    subprocess.run([*make, f"{venv}/.dev-installed"], cwd=root, check=True, capture_output=True)
    up_to_date = subprocess.run(
        [*make, "-q", f"{venv}/.train-installed", f"{venv}/.infra-installed"], cwd=root
    )
    assert up_to_date.returncode == 0  # make train after make venv installs nothing again


def _install_script():
    spec = importlib.util.spec_from_file_location("install", REQUIREMENTS / "install.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# `pip config list` as pip 23.2 prints it on a machine with /etc/pip.conf and PIP_* variables (its files merged,
# each key under its section, variables under ":env:"), plus an [install] and a [download] section.
PIP_CONFIG_LIST = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
download.index-url='https://download-only.example/simple'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/srv/ignored-wheels'
global.index-url='https://global.example/simple'
install.index-url='https://install.example/simple'
"""


def test_pip_settings_are_what_pip_install_uses():
    settings = _install_script().pip_settings(PIP_CONFIG_LIST)
    assert settings == {
        "cert": "/etc/ssl/certs/ca-certificates.crt",
        "default-timeout": "180",
        "find-links": "/opt/wheels",  # PIP_FIND_LINKS over the files' [global]
        "constraint": "/etc/xdg/pip/constraints.txt",
        "extra-index-url": "file:///opt/pypi/simple file:///opt/pypi-more/simple",
        "index-url": "https://install.example/simple",  # [install] over [global]; not [download]
    }


def test_pip_settings_parse_what_this_pip_prints_for_its_variables(tmp_path):
    # The real pip: with PIP_CONFIG_FILE=os.devnull it loads no file (pip's "Configuration" guide), so only these count.
    env = {
        "PATH": os.environ["PATH"],
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": "https://mirror.example/simple",
        "PIP_FIND_LINKS": f"{tmp_path}/a {tmp_path}/b",
    }
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], env=env, capture_output=True, text=True, check=True
    ).stdout
    install = _install_script()
    args, _ = install.uv_arguments(install.pip_settings(listing))
    assert args == [
        "--find-links", f"{tmp_path}/a", "--find-links", f"{tmp_path}/b",
        "--index-url", "https://mirror.example/simple",
        "--index-strategy", "unsafe-best-match",
    ]  # fmt: skip


def test_uv_gets_every_source_pip_would_use_and_pip_installs_what_uv_cannot_be_told():
    install = _install_script()
    args, env = install.uv_arguments(install.pip_settings(PIP_CONFIG_LIST))
    assert args == [
        "--find-links", "/opt/wheels",
        "--constraint", "/etc/xdg/pip/constraints.txt",
        "--extra-index-url", "file:///opt/pypi/simple", "--extra-index-url", "file:///opt/pypi-more/simple",
        "--index-url", "https://install.example/simple",
        # pip takes the best match over every index; uv, asked to
        "--index-strategy", "unsafe-best-match",
    ]  # fmt: skip
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}
    with pytest.raises(install.Unsupported, match="prefer-binary"):
        install.uv_arguments({"prefer-binary": "1"})
