"""image/build_checks.py on trees laid out as each aws-ofi-nccl package installs itself, and on version records.

The layouts come from aws-ofi-nccl v1.21.1's contrib/debian-template (the .install file of each package, the rules
that write libnccl-ofi's ld.so.conf entry) and src/Makefile.am (which plugin libraries each build installs), copied
into tests/image/fixtures/aws_ofi_nccl_debian_layouts.json. NCCL's side (which file NCCL_NET_PLUGIN=ofi opens, and
where the loader looks) is trainer/preflight/netplugin.py's model of NVIDIA/nccl v2.28.9-1."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "image"))
import build_checks  # noqa: E402  (a script under image/, run by the Dockerfile as a file)

from trainer.contract.image import efa_environment  # noqa: E402
from trainer.preflight.netplugin import resolve, search_dirs  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
UPSTREAM = json.loads((FIXTURES / "aws_ofi_nccl_debian_layouts.json").read_text())
PACKAGES = sorted(UPSTREAM["install"])
DOCKERFILE = (ROOT / "image" / "Dockerfile").read_text()


def lay_out(root: Path, package: str) -> Path:
    """The files `package` installs under `root`, as its .install file lists them."""
    rules = "\n".join(UPSTREAM["rules"])
    prefix = re.search(r"OFI_NCCL_PREFIX=(\S+)", rules).group(1)
    for entry in UPSTREAM["install"][package]:
        if entry == "opt/amazon/ofi-nccl/*":
            # The regular build: src/Makefile.am installs libnccl-net.so (ENABLE_NCCL_NET_LIBRARY) and
            # libnccl-net-ofi.so into the prefix's lib directory.
            for library in ("libnccl-net.so", "libnccl-net-ofi.so"):
                (root / prefix.lstrip("/") / "lib").mkdir(parents=True, exist_ok=True)
                (root / prefix.lstrip("/") / "lib" / library).write_bytes(b"\x7fELF")
        elif entry.startswith("etc/ld.so.conf.d/"):
            (root / entry).parent.mkdir(parents=True, exist_ok=True)
            (root / entry).write_text(f"{prefix}/lib\n")  # the rules' echo "${OFI_NCCL_PREFIX}/lib"
        else:
            path = root / entry.replace("*", "p5")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"\x7fELF")
    libfabric = root / build_checks.LIBFABRIC_DIR / "libfabric.so.1"
    libfabric.parent.mkdir(parents=True, exist_ok=True)
    libfabric.write_bytes(b"\x7fELF")
    return root


def loader_dirs(root: Path) -> list[str]:
    """What the image's loader searches: the Dockerfile's LD_LIBRARY_PATH, then every ld.so.conf.d entry."""
    ld_library_path = (
        re.search(r"LD_LIBRARY_PATH=(\S+)", DOCKERFILE).group(1).replace("${LD_LIBRARY_PATH}", "")
    )
    conf = sorted((root / "etc/ld.so.conf.d").glob("*.conf"))
    return search_dirs(ld_library_path, [line for f in conf for line in f.read_text().split()])


def test_the_fixture_is_the_four_packages_of_aws_ofi_nccl_control():
    assert PACKAGES == ["libnccl-ofi", "libnccl-ofi-ngc-v1", "libnccl-ofi-ngc-v2", "libnccl-ofi-ngc-v3"]
    assert [line["text"] for line in UPSTREAM["makefile"]][-1] == "lib_LTLIBRARIES += libnccl-net-aws-ofi.la"


@pytest.mark.parametrize("package", PACKAGES)
def test_nccl_finds_the_plugin_whichever_package_the_installer_chose(tmp_path, package):
    root = lay_out(tmp_path, package)
    # Only the regular package registers its directory with the loader; the NGC variants do not.
    before = resolve(efa_environment()["NCCL_NET_PLUGIN"], loader_dirs(root), root=root)
    assert (before is not None) == (package == "libnccl-ofi")
    report = build_checks.install_plugin(root)
    found = resolve(efa_environment()["NCCL_NET_PLUGIN"], loader_dirs(root), root=root)
    assert found is not None and found.name == "libnccl-net-ofi.so"
    [plugin_dir] = {str(Path(e).parent) for e in UPSTREAM["install"][package] if "/lib/" in e} or {
        "opt/amazon/ofi-nccl/lib"
    }
    assert found.parent == root / plugin_dir
    assert any(line.startswith("aws-ofi-nccl plugin: /" + plugin_dir) for line in report)
    assert report[-1] == "libfabric: /opt/amazon/efa/lib/libfabric.so.1"


def test_the_ngc_v1_name_gets_the_name_ofi_opens(tmp_path):
    root = lay_out(tmp_path, "libnccl-ofi-ngc-v1")
    report = build_checks.install_plugin(root)
    alias = root / "opt/amazon/aws-ofi-nccl/lib/libnccl-net-ofi.so"
    assert alias.is_symlink() and os.readlink(alias) == "libnccl-net-aws-ofi.so"
    assert any("NGC-v1 name" in line for line in report)


def test_two_layouts_prefer_the_regular_package_and_say_so(tmp_path):
    root = lay_out(lay_out(tmp_path, "libnccl-ofi"), "libnccl-ofi-ngc-v2")
    report = build_checks.install_plugin(root)
    assert (
        report[0]
        == "aws-ofi-nccl plugin: /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so (libnccl-ofi or libnccl-ofi-ngc-v3)"
    )
    assert report[1].startswith("also installed, not used: /opt/amazon/aws-ofi-nccl/lib/libnccl-net-ofi.so")
    assert (root / build_checks.LD_CONF).read_text() == "/opt/amazon/ofi-nccl/lib\n"


def test_no_plugin_and_no_libfabric_fail_naming_what_is_missing(tmp_path):
    with pytest.raises(build_checks.CheckFailed) as failed:
        build_checks.install_plugin(tmp_path)
    plugin, libfabric = failed.value.problems
    assert "installed no aws-ofi-nccl NCCL plugin" in plugin and "--disable-ngc --disable-build-ngc" in plugin
    assert "/opt/amazon/aws-ofi-nccl/lib/libnccl-net-aws-ofi.so" in plugin
    assert libfabric == "the EFA installer installed no libfabric in /opt/amazon/efa/lib"


def run_step(*args: str, root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "image" / "build_checks.py"), *args],
        env={**os.environ, "TRAINSTACK_BUILD_ROOT": str(root)},
        capture_output=True,
        text=True,
    )


def test_the_build_step_prints_where_things_landed_or_fails_loudly(tmp_path):
    (tmp_path / "empty").mkdir()
    failed = run_step("plugin-layout", root=tmp_path / "empty")
    assert (
        failed.returncode == 1
        and "build check plugin-layout: the EFA installer installed no" in failed.stderr
    )
    passed = run_step("plugin-layout", root=lay_out(tmp_path / "v3", "libnccl-ofi-ngc-v3"))
    assert passed.returncode == 0, passed.stderr
    assert (
        "build check plugin-layout: aws-ofi-nccl plugin: /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"
        in passed.stdout
    )


def test_base_report_records_the_bases_plugin_default_and_files(tmp_path):
    lay_out(tmp_path, "libnccl-ofi")
    lines = build_checks.base_report(tmp_path, {"NCCL_NET_PLUGIN": "spcx"})
    assert lines[0] == "base NCCL_NET_PLUGIN: 'spcx'"
    assert lines[1] == (
        "base aws-ofi-nccl plugins: /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so, /opt/amazon/ofi-nccl/lib/libnccl-net.so"
    )
    assert lines[2].endswith("100_ofinccl.conf -> /opt/amazon/ofi-nccl/lib")
    assert build_checks.base_report(tmp_path / "none", {})[:2] == [
        "base NCCL_NET_PLUGIN: unset",
        "base aws-ofi-nccl plugins: none",
    ]


# --- torch and numpy around pip -----------------------------------------------------------------------------------


def test_the_constraint_is_the_distribution_version_pip_compares():
    base = build_checks.installed_versions()  # this interpreter's real torch and numpy
    constraint, _ = build_checks.torch_constraint(base)
    assert constraint == f"torch=={base['torch_distribution']}"
    ngc_like = {
        **base,
        "torch_version": "2.10.0a0+b4e4ee81d3",
        "torch_distribution": "2.10.0a0+b4e4ee81d3.nv25.12",
    }
    constraint, lines = build_checks.torch_constraint(ngc_like)
    assert constraint == "torch==2.10.0a0+b4e4ee81d3.nv25.12" and "differs" in lines[1]


def test_after_pip_passes_when_torch_and_numpy_kept_their_abi():
    base = build_checks.installed_versions()
    assert build_checks.after_pip_problems(base, base) == []
    assert build_checks.after_pip_problems({**base, "numpy": "2.1.0"}, {**base, "numpy": "2.4.6"}) == []


def test_after_pip_fails_on_a_replaced_torch_or_a_numpy_off_the_bases_abi():
    base = build_checks.installed_versions()
    [torch] = build_checks.after_pip_problems(
        base, {**base, "torch_cuda": "12.9" if base["torch_cuda"] == "None" else "None"}
    )
    assert "pip replaced the base image's torch (torch_cuda" in torch
    [major] = build_checks.after_pip_problems({**base, "numpy": "1.26.4"}, {**base, "numpy": "2.4.6"})
    assert "numpy went from 1.26.4" in major and "ABI" in major
    [older] = build_checks.after_pip_problems({**base, "numpy": "2.5.0"}, {**base, "numpy": "2.4.6"})
    assert "to 2.4.6" in older


# --- versions against image/compatibility.toml ---------------------------------------------------------------------

TABLE = tomllib.loads((ROOT / "image" / "compatibility.toml").read_text())


def dpkg(plugin: str, libfabric: str) -> dict[str, str]:
    return build_checks.parse_dpkg(f"libnccl-ofi {plugin}\nlibnccl-ofi-ngc-v1\nlibfabric1-aws {libfabric}\n")


def test_versions_matching_the_table_pass():
    efa = TABLE["efa_installer"]
    installed = {
        "cuda": "13.0",
        "nccl": TABLE["aws_ofi_nccl"]["nccl_minimum"],
        "torch": "x",
        "transformer-engine": "y",
    }
    packages = dpkg(f"{efa['aws_ofi_nccl']}-1", f"{efa['libfabric']}-1")
    assert packages == {"libnccl-ofi": f"{efa['aws_ofi_nccl']}-1", "libfabric1-aws": f"{efa['libfabric']}-1"}
    assert build_checks.version_problems(installed, packages, TABLE) == []


def test_versions_off_the_table_fail_naming_the_table_key():
    installed = {"cuda": "None", "nccl": "2.16.5", "torch": "x", "transformer-engine": "y"}
    problems = build_checks.version_problems(installed, dpkg("1.19.0-1", "2.1.0amzn3.0-1"), TABLE)
    assert len(problems) == 4
    assert "NCCL 2.16.5 is older than 2.17.1" in problems[0] and "nccl_minimum" in problems[0]
    assert "no CUDA build" in problems[1]
    assert "libnccl-ofi 1.19.0-1 is not aws-ofi-nccl 1.21.1" in problems[2]
    assert "[efa_installer] libfabric" in problems[3]
    assert build_checks.version_problems(installed | {"cuda": "13.0", "nccl": "2.28.9"}, {}, TABLE) == [
        "no libnccl-ofi package is installed: the EFA installer laid down no aws-ofi-nccl",
        "libfabric1-aws is not installed: the EFA installer laid down no libfabric",
    ]
