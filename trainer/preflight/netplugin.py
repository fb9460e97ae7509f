"""`python -m trainer.preflight.netplugin`: does NCCL find the network plugin that image/efa.env asks for?

How NCCL 2.28 reads NCCL_NET_PLUGIN (NVIDIA/nccl v2.28.9-1, src/plugin/net.cc, ncclNetPluginInit):

- unset: the one default plugin, `libnccl-net.so`;
- set: a comma-separated list of plugin names; "none" (any case) counts as empty, and a set-but-empty value is a list
  of no names, so NCCL loads no external plugin at all and uses its internal IB or socket transports.

Each name is opened as src/plugin/plugin_open.cc (openPluginLib) does: dlopen() of the name as given; when that
fails and the name holds no '/' and is not a "lib*.so" name, dlopen() of "libnccl-net-<name>.so". A name without
'/' is searched by the dynamic loader in LD_LIBRARY_PATH, then the ld.so cache (built by ldconfig from
/etc/ld.so.conf.d), then /lib and /usr/lib (dlopen(3)).

The image build runs this module after the EFA installer, so `make image` fails when the plugin is not where NCCL
will look, or when the image's own environment (what `docker run --entrypoint python` sees, before
image/entrypoint.sh runs) would load none, instead of NCCL silently falling back to TCP sockets at the first job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from trainer.contract.image import efa_environment

PLUGIN_PREFIX = "libnccl-net"  # pluginPrefix[NET], NVIDIA/nccl src/plugin/plugin_open.cc
DEFAULT_PLUGIN = f"{PLUGIN_PREFIX}.so"  # defaultNetPlugin, src/plugin/net.cc (v2.28.9-1)
DEFAULT_DIRS = ("/lib", "/usr/lib")  # dlopen(3): searched after LD_LIBRARY_PATH and the ld.so cache
VARIABLE = "NCCL_NET_PLUGIN"


def plugin_names(value: str | None) -> list[str]:
    """The plugins NCCL tries for NCCL_NET_PLUGIN=value (None: unset); [] means no external plugin."""
    if value is None:
        return [DEFAULT_PLUGIN]
    if value.lower() == "none":
        return []
    return [name for name in value.split(",") if name]  # strtok_r skips empty fields


def library_names(name: str) -> list[str]:
    """The names openPluginLib passes to dlopen() for one plugin name, in order."""
    names = [name]
    if "/" not in name and not (name.startswith("lib") and name.endswith(".so")):
        names.append(f"{PLUGIN_PREFIX}-{name}.so")
    return names


def plugin_library_names(value: str | None) -> list[str]:
    """Every name NCCL passes to dlopen() for NCCL_NET_PLUGIN=value, in order."""
    return [library for name in plugin_names(value) for library in library_names(name)]


def search_dirs(ld_library_path: str | None, cache_dirs: Iterable[str]) -> list[str]:
    """The directories the dynamic loader searches for a name without '/', in order."""
    dirs = [d for d in (ld_library_path or "").split(":") if d]
    return dirs + [d for d in cache_dirs if d not in dirs] + [d for d in DEFAULT_DIRS if d not in dirs]


def resolve(value: str | None, dirs: list[str], root: Path = Path("/")) -> Path | None:
    """The file NCCL would load for NCCL_NET_PLUGIN=value, with the filesystem rooted at `root`."""
    for name in plugin_library_names(value):
        if "/" in name:
            candidate = root / name.lstrip("/")
            if candidate.is_file():
                return candidate
            continue
        for directory in dirs:
            candidate = root / directory.lstrip("/") / name
            if candidate.is_file():
                return candidate
    return None


def ld_cache_dirs() -> list[str]:
    """Directories holding the libraries in this system's ld.so cache (`ldconfig -p`)."""
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    dirs: list[str] = []
    for line in listing.splitlines():
        _, arrow, path = line.partition(" => ")
        directory = str(Path(path.strip()).parent) if arrow else None
        if directory and directory not in dirs:
            dirs.append(directory)
    return dirs


def environment_problem(configured: str, environment: dict[str, str]) -> str | None:
    """What is wrong with NCCL_NET_PLUGIN in this process's environment (the image's ENV at build time)."""
    value = environment.get(VARIABLE)
    if value is None:
        return None  # unset: entrypoint.sh or the job definition sets efa.env's value
    if not plugin_names(value):
        return (
            f"{VARIABLE} is set to {value!r} in this environment: NCCL 2.28 then loads no network plugin and runs "
            f"on its own IB/socket transports (src/plugin/net.cc); set it to {configured!r} (image/efa.env)"
        )
    if value != configured:
        return f"{VARIABLE}={value!r} in this environment, but image/efa.env says {configured!r}"
    return None


def main() -> int:
    value = efa_environment()[VARIABLE]
    problems = []
    if not plugin_names(value):
        problems.append(f"{VARIABLE}={value!r} (image/efa.env) loads no plugin; name aws-ofi-nccl's (ofi)")
    if problem := environment_problem(value, dict(os.environ)):
        problems.append(problem)
    dirs = search_dirs(os.environ.get("LD_LIBRARY_PATH"), ld_cache_dirs())
    found = resolve(value, dirs) if not problems else None
    if not problems and found is None:
        problems.append(
            f"{VARIABLE}={value} (image/efa.env): none of {', '.join(plugin_library_names(value))} is in "
            f"{':'.join(dirs)}; NCCL would not load aws-ofi-nccl"
        )
    for problem in problems:
        print(f"netplugin: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"netplugin: {VARIABLE}={value} loads {found}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
