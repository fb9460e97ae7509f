"""`python -m trainer.preflight.netplugin`: does NCCL find the network plugin that image/efa.env asks for?

NCCL opens its network plugin as NVIDIA/nccl src/plugin/plugin_open.cc does (openPluginLib): dlopen() of
NCCL_NET_PLUGIN as given (libnccl-net.so when unset or empty); when that fails and the value holds no '/' and is not
a "lib*.so" name, dlopen() of "libnccl-net-<value>.so". A name without '/' is searched by the dynamic loader in
LD_LIBRARY_PATH, then the ld.so cache (built by ldconfig from /etc/ld.so.conf.d), then /lib and /usr/lib (dlopen(3)).

The image build runs this module after the EFA installer, so `make image` fails when the plugin is not where NCCL
will look, instead of NCCL silently falling back to TCP sockets at the first job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from trainer.contract.image import efa_environment

PLUGIN_PREFIX = "libnccl-net"  # pluginPrefix[NET], NVIDIA/nccl src/plugin/plugin_open.cc
DEFAULT_DIRS = ("/lib", "/usr/lib")  # dlopen(3): searched after LD_LIBRARY_PATH and the ld.so cache


def plugin_library_names(value: str | None) -> list[str]:
    """The names NCCL passes to dlopen() for NCCL_NET_PLUGIN=value, in order."""
    if not value:
        return [f"{PLUGIN_PREFIX}.so"]
    names = [value]
    if "/" not in value and not (value.startswith("lib") and value.endswith(".so")):
        names.append(f"{PLUGIN_PREFIX}-{value}.so")
    return names


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


def main() -> int:
    value = efa_environment()["NCCL_NET_PLUGIN"]
    dirs = search_dirs(os.environ.get("LD_LIBRARY_PATH"), ld_cache_dirs())
    found = resolve(value, dirs)
    if found is None:
        print(
            f"netplugin: NCCL_NET_PLUGIN={value} (image/efa.env): none of "
            f"{', '.join(plugin_library_names(value))} is in {':'.join(dirs)}; NCCL would not load aws-ofi-nccl",
            file=sys.stderr,
        )
        return 1
    print(f"netplugin: NCCL_NET_PLUGIN={value} loads {found}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
