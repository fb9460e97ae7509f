"""Build-time checks of the trainer image: what the build cannot know in advance, settled and printed by the build.

Run by image/Dockerfile (`python /opt/trainstack/image/build_checks.py <step>`), standard library only, so it runs
before the trainer's requirements are installed. Each step prints what it found and exits 1 with one line per
broken assumption, naming the fact and where it is recorded:

- base-report: what the base image ships for NCCL's network (its NCCL_NET_PLUGIN default, any aws-ofi-nccl plugin,
  its NCCL version): NVIDIA's release notes for the pinned base could not be read offline, so the build says it.
- plugin-layout: where the EFA installer put aws-ofi-nccl's NCCL plugin and libfabric. Installers newer than 1.47
  may install an NGC variant (aws-ofi-nccl contrib/debian-template, v1.21.1): libnccl-ofi-ngc-v1 as
  /opt/amazon/aws-ofi-nccl/lib/libnccl-net-aws-ofi.so, -v2 as /opt/amazon/aws-ofi-nccl/lib/libnccl-net-ofi.so,
  -v3 as /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so, none with an ld.so.conf entry; the regular libnccl-ofi puts
  /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so with /etc/ld.so.conf.d/100_ofinccl.conf. The step registers the
  directory it found with the dynamic loader, gives an NGC-v1 build the name NCCL_NET_PLUGIN=ofi opens, and fails
  when there is no plugin or no libfabric.
- before-pip / after-pip: torch and numpy around the trainer's pip install. The pip constraint that keeps the
  base's CUDA torch is its distribution's version (what pip compares), which may differ from torch.__version__;
  after the install torch must be the same build and numpy must keep the ABI the base's compiled packages were
  built against (same major version, not older).
- versions: CUDA, NCCL, TransformerEngine and torch as installed, checked against image/compatibility.toml together
  with the aws-ofi-nccl and libfabric packages the installer laid down.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
COMPATIBILITY_FILE = HERE / "compatibility.toml"
# The entry this build writes for the directory holding the plugin; "000-" sorts it before the base's own entries.
LD_CONF = "etc/ld.so.conf.d/000-trainstack-aws-ofi-nccl.conf"
# The name NCCL_NET_PLUGIN=ofi opens (NVIDIA/nccl src/plugin/plugin_open.cc: libnccl-net-<name>.so).
PLUGIN_NAME = "libnccl-net-ofi.so"
# libnccl-ofi-ngc-v1's name for the same plugin (aws-ofi-nccl src/Makefile.am, ENABLE_NGC, v1.21.1).
NGC_V1_NAME = "libnccl-net-aws-ofi.so"
LIBFABRIC_DIR = "opt/amazon/efa/lib"


@dataclass(frozen=True)
class Layout:
    package: str
    directory: str  # relative to the root
    library: str


# In the order the build prefers them: the regular package first (aws-ofi-nccl contrib/debian-template, v1.21.1).
LAYOUTS = (
    Layout("libnccl-ofi or libnccl-ofi-ngc-v3", "opt/amazon/ofi-nccl/lib", PLUGIN_NAME),
    Layout("libnccl-ofi-ngc-v2", "opt/amazon/aws-ofi-nccl/lib", PLUGIN_NAME),
    Layout("libnccl-ofi-ngc-v1", "opt/amazon/aws-ofi-nccl/lib", NGC_V1_NAME),
)


class CheckFailed(Exception):
    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def _fail_if(problems: list[str]) -> None:
    if problems:
        raise CheckFailed(problems)


# --- base-report --------------------------------------------------------------------------------------------------


def base_report(root: Path, environment: dict[str, str]) -> list[str]:
    """What the base image ships for NCCL's network, one line each (nothing fails here: it is a record)."""
    value = environment.get("NCCL_NET_PLUGIN")
    lines = [f"base NCCL_NET_PLUGIN: {'unset' if value is None else repr(value)}"]
    plugins = sorted(str(p.relative_to(root)) for p in root.glob("opt/amazon/*/lib/libnccl-net*.so"))
    lines.append(f"base aws-ofi-nccl plugins: {', '.join('/' + p for p in plugins) or 'none'}")
    conf = root / "etc/ld.so.conf.d"
    entries = sorted(
        f"/{f.relative_to(root)} -> {f.read_text().strip()}"
        for f in (conf.glob("*.conf") if conf.is_dir() else [])
        if "amazon" in f.read_text()
    )
    lines.append(f"base ld.so.conf entries under /opt/amazon: {', '.join(entries) or 'none'}")
    return lines


# --- plugin-layout ------------------------------------------------------------------------------------------------


def find_plugins(root: Path) -> list[Layout]:
    return [layout for layout in LAYOUTS if (root / layout.directory / layout.library).is_file()]


def install_plugin(root: Path) -> list[str]:
    """Make the installed plugin loadable as NCCL_NET_PLUGIN=ofi from the ld.so cache; what was done, one line each."""
    found = find_plugins(root)
    libfabric = sorted(str(p.relative_to(root)) for p in (root / LIBFABRIC_DIR).glob("libfabric.so*"))
    problems = []
    if not found:
        looked = ", ".join(f"/{layout.directory}/{layout.library}" for layout in LAYOUTS)
        problems.append(
            f"the EFA installer installed no aws-ofi-nccl NCCL plugin (looked for {looked}); run it with "
            "--disable-ngc --disable-build-ngc (image/Dockerfile) and check its log"
        )
    if not libfabric:
        problems.append(f"the EFA installer installed no libfabric in /{LIBFABRIC_DIR}")
    _fail_if(problems)
    chosen = found[0]
    lines = [f"aws-ofi-nccl plugin: /{chosen.directory}/{chosen.library} ({chosen.package})"]
    lines += [f"also installed, not used: /{o.directory}/{o.library} ({o.package})" for o in found[1:]]
    if chosen.library != PLUGIN_NAME:
        alias = root / chosen.directory / PLUGIN_NAME
        alias.symlink_to(chosen.library)
        lines.append(
            f"linked /{chosen.directory}/{PLUGIN_NAME} -> {chosen.library} (the NGC-v1 name of the plugin)"
        )
    conf = root / LD_CONF
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(f"/{chosen.directory}\n")
    lines.append(f"registered /{chosen.directory} in /{LD_CONF} (run ldconfig)")
    lines.append(f"libfabric: {', '.join('/' + p for p in libfabric)}")
    return lines


# --- before-pip / after-pip ---------------------------------------------------------------------------------------


def installed_versions() -> dict[str, str]:
    """torch and numpy as this interpreter has them: distribution versions and torch's own version string."""
    from importlib import metadata

    import numpy
    import torch

    return {
        "torch_distribution": metadata.version("torch"),
        "torch_version": torch.__version__,
        "torch_cuda": str(torch.version.cuda),
        "numpy": numpy.__version__,
    }


def torch_constraint(base: dict[str, str]) -> tuple[str, list[str]]:
    """The pip constraint that keeps the base's torch, and what the build prints about it."""
    lines = [f"base torch: __version__ {base['torch_version']}, distribution {base['torch_distribution']}"]
    if base["torch_version"] != base["torch_distribution"]:
        lines.append(
            "torch.__version__ differs from its distribution's version: the constraint uses the latter"
        )
    return f"torch=={base['torch_distribution']}", lines


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3])


def after_pip_problems(base: dict[str, str], now: dict[str, str]) -> list[str]:
    problems = []
    for key in ("torch_distribution", "torch_version", "torch_cuda"):
        if now[key] != base[key]:
            problems.append(
                f"pip replaced the base image's torch ({key} {base[key]} -> {now[key]}); the constraint "
                f"torch=={base['torch_distribution']} must hold (image/Dockerfile, requirements/)"
            )
    was, is_ = _release(base["numpy"]), _release(now["numpy"])
    if is_[:1] != was[:1] or is_ < was:
        problems.append(
            f"numpy went from {base['numpy']} (the base image's, which its compiled packages were built against) to "
            f"{now['numpy']} (requirements/lock.txt): a different major version or an older one breaks their ABI; "
            "pin a numpy of the base's major version, not older than it"
        )
    return problems


# --- versions -----------------------------------------------------------------------------------------------------


def upstream_version(debian_version: str) -> str:
    """A Debian package version without epoch and Debian revision: 1:2.6.0amzn1.0-1 -> 2.6.0amzn1.0."""
    version = debian_version.split(":", 1)[-1]
    return version.rsplit("-", 1)[0] if "-" in version else version


def parse_dpkg(listing: str) -> dict[str, str]:
    """`dpkg-query -W -f '${Package} ${Version}\\n' ...` lines -> {package: version}; unversioned ones left out."""
    packages = {}
    for line in listing.splitlines():
        name, _, version = line.strip().partition(" ")
        if name and version:
            packages[name] = version
    return packages


def version_problems(installed: dict[str, str], packages: dict[str, str], table: dict) -> list[str]:
    """installed: cuda, nccl, torch, transformer-engine; packages: the EFA installer's Debian packages."""
    problems = []
    nccl_minimum = table["aws_ofi_nccl"]["nccl_minimum"]
    if _release(installed["nccl"]) < _release(nccl_minimum):
        problems.append(
            f"NCCL {installed['nccl']} is older than {nccl_minimum}, the oldest aws-ofi-nccl "
            f"{table['aws_ofi_nccl']['version']} supports (image/compatibility.toml [aws_ofi_nccl] nccl_minimum)"
        )
    if installed["cuda"] in ("", "None"):
        problems.append(
            "torch has no CUDA build (torch.version.cuda is None): the base image's torch was replaced"
        )
    plugin = {p: v for p, v in packages.items() if p == "libnccl-ofi" or p.startswith("libnccl-ofi-ngc")}
    wanted_plugin = table["efa_installer"]["aws_ofi_nccl"]
    if not plugin:
        problems.append("no libnccl-ofi package is installed: the EFA installer laid down no aws-ofi-nccl")
    for package, version in plugin.items():
        if upstream_version(version) != wanted_plugin:
            problems.append(
                f"{package} {version} is not aws-ofi-nccl {wanted_plugin} (image/compatibility.toml "
                "[efa_installer] aws_ofi_nccl)"
            )
    wanted_libfabric = table["efa_installer"]["libfabric"]
    libfabric = packages.get("libfabric1-aws")
    if libfabric is None:
        problems.append("libfabric1-aws is not installed: the EFA installer laid down no libfabric")
    elif upstream_version(libfabric) != wanted_libfabric:
        problems.append(
            f"libfabric1-aws {libfabric} is not libfabric {wanted_libfabric} (image/compatibility.toml "
            "[efa_installer] libfabric)"
        )
    return problems


def installed_stack() -> dict[str, str]:
    from importlib import metadata

    import torch

    return {
        "cuda": str(torch.version.cuda),
        "nccl": ".".join(str(n) for n in torch.cuda.nccl.version()),
        "torch": metadata.version("torch"),
        "transformer-engine": metadata.version("transformer-engine"),
    }


def dpkg_listing(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str:
    query = ["dpkg-query", "-W", "-f", "${Package} ${Version}\\n", "libnccl-ofi*", "libfabric1-aws"]
    return run(query, capture_output=True, text=True, check=False).stdout


# --- command line -------------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    step, *args = argv or [""]
    root = Path(os.environ.get("TRAINSTACK_BUILD_ROOT", "/"))
    try:
        if step == "base-report":
            lines = base_report(root, dict(os.environ))
        elif step == "plugin-layout":
            lines = install_plugin(root)
        elif step == "before-pip":
            state, constraint_file = map(Path, args)
            base = installed_versions()
            state.write_text(json.dumps(base))
            constraint, lines = torch_constraint(base)
            constraint_file.write_text(constraint + "\n")
            lines.append(f"base numpy {base['numpy']}; pip constraint {constraint}")
        elif step == "after-pip":
            base = json.loads(Path(args[0]).read_text())
            now = installed_versions()
            _fail_if(after_pip_problems(base, now))
            lines = [f"kept torch {now['torch_version']} (CUDA {now['torch_cuda']}); numpy {now['numpy']}"]
        elif step == "versions":
            installed = installed_stack()
            packages = parse_dpkg(dpkg_listing())
            table = tomllib.loads(COMPATIBILITY_FILE.read_text())
            lines = [", ".join(f"{k} {v}" for k, v in installed.items())]
            lines += [f"{p} {v}" for p, v in sorted(packages.items())]
            _fail_if(version_problems(installed, packages, table))
        else:
            print(
                "usage: build_checks.py base-report|plugin-layout|before-pip STATE CONSTRAINT|after-pip STATE|versions"
            )
            return 2
    except CheckFailed as failed:
        for problem in failed.problems:
            print(f"build check {step}: {problem}", file=sys.stderr)
        return 1
    for line in lines:
        print(f"build check {step}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
