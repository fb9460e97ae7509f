"""Install pinned requirements into the environment of the interpreter that runs this script (the project's .venv),
with uv where it can honour pip's settings, else with pip:

    .venv/bin/python requirements/install.py -r requirements/train.txt

uv downloads, unpacks and byte-compiles in parallel: requirements/train.txt installs in about half pip's time on 2
cores, dev.txt in 43 % of it (docs/bench.md, "`make train` from a fresh clone"). uv reads neither pip.conf nor PIP_*
variables (docs.astral.sh/uv/pip/compatibility, "Configuration files and environment variables"), so the settings
that say where packages come from are read with `pip config list` and handed over as uv's options. A setting this
cannot hand over, or no uv to be had, installs with pip instead, and says why. Stdlib only: it runs before anything
is installed."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

# Every transitive pin, uv's included: the constraints of every install.
LOCK = Path(__file__).resolve().parent / "lock.txt"
# What `pip config list` prints a setting under (its files already merged), weakest first: the files' [global]
# section, their [install] section, then PIP_* variables (pip's "Configuration" guide, "Precedence / Override
# order": environment variables over files, a command's section over [global]).
SECTIONS = {"global": 0, "install": 1, ":env:": 2}
# pip settings that do not change what is installed or from where: nothing to hand over.
IGNORED = {
    "default-timeout",
    "timeout",
    "retries",
    "disable-pip-version-check",
    "no-cache-dir",
    "cache-dir",
    "progress-bar",
    "quiet",
    "verbose",
    "no-color",
    "no-input",
    "root-user-action",
    "config-file",  # which files pip read: their settings are already in the listing
}


class Unsupported(Exception):
    """A pip setting uv cannot be given: install with pip."""


def pip_settings(listing: str) -> dict[str, str]:
    """`pip config list`'s lines (`section.key='value'`) as the one value per key that `pip install` uses."""
    ranked: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        name, sep, quoted = line.partition("=")
        section, _, key = name.rpartition(".")
        rank = SECTIONS.get(section)
        if not sep or rank is None:  # another command's section (download, wheel, ...): not an install's
            continue
        if key not in ranked or rank > ranked[key][0]:
            ranked[key] = (rank, ast.literal_eval(quoted))
    return {key: value for key, (_, value) in ranked.items()}


def uv_arguments(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """uv's options and environment for pip's settings (uv's reference: `uv pip install` options,
    docs.astral.sh/uv/reference/cli/#uv-pip-install); Unsupported for a setting with no counterpart here."""
    args: list[str] = []
    env: dict[str, str] = {}
    for key, value in settings.items():
        values = value.split()
        if key in IGNORED:
            continue
        if key == "index-url":
            args += ["--index-url", value]
        elif key == "extra-index-url":
            args += [arg for url in values for arg in ("--extra-index-url", url)]
        elif key == "find-links":
            args += [arg for link in values for arg in ("--find-links", link)]
        elif key == "constraint":
            args += [arg for path in values for arg in ("--constraint", path)]
        elif key == "trusted-host":
            args += [arg for host in values for arg in ("--allow-insecure-host", host)]
        elif key == "no-index" and value.lower() in ("1", "true", "yes", "on"):
            args.append("--no-index")
        elif key == "cert":
            env["SSL_CERT_FILE"] = value  # uv's TLS roots from this file (uv's "TLS certificates" guide)
        elif key == "proxy":
            env["HTTPS_PROXY"] = env["HTTP_PROXY"] = value
        else:
            raise Unsupported(f"pip's setting {key}={value!r}")
    # pip takes the best version from every index; uv by default only the first index that has the package
    # (uv's compatibility page, "Packages that exist on multiple indexes"): ask for pip's behaviour.
    args += ["--index-strategy", "unsafe-best-match"]
    return args, env


def run(command: list[str], env: dict[str, str] | None = None) -> int:
    return subprocess.run(command, env={**os.environ, **(env or {})}).returncode


def main(requirements: list[str]) -> int:
    pip = [sys.executable, "-m", "pip"]
    quiet = ["--quiet", "--disable-pip-version-check"]
    with_pip = [*pip, "install", *quiet, "-c", str(LOCK), *requirements]
    listing = subprocess.run([*pip, "config", "list"], capture_output=True, text=True, check=True).stdout
    try:
        args, env = uv_arguments(pip_settings(listing))
    except Unsupported as reason:
        print(f"install: {reason} has no uv counterpart here; installing with pip", file=sys.stderr)
        return run(with_pip)
    if run([*pip, "install", *quiet, "-c", str(LOCK), "uv"]) != 0:
        print("install: could not install uv (above); installing with pip", file=sys.stderr)
        return run(with_pip)
    uv = Path(sys.executable).parent / "uv"
    # --compile-bytecode as pip does: without .pyc files every process compiles what it imports again.
    command = [str(uv), "pip", "install", "--quiet", "--python", sys.executable, "--compile-bytecode", *args]
    return run([*command, "-c", str(LOCK), *requirements], env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
