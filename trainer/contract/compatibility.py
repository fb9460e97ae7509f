"""`python -m trainer.contract.compatibility`: do the installed torch, TransformerEngine and megatron-core form the
tested set that image/compatibility.toml records? Run by `make image` inside the image; the table itself is
checked against the pins and megatron-core's metadata by tests/image/test_compatibility.py.
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

COMPATIBILITY_FILE = Path(__file__).resolve().parents[2] / "image" / "compatibility.toml"


def compatibility_table() -> dict:
    return tomllib.loads(COMPATIBILITY_FILE.read_text())


def declared_requirement(package: str, dependency: str, extra: str | None = None) -> SpecifierSet:
    """The version range `package`'s installed metadata (Requires-Dist) declares for `dependency`."""
    for line in metadata.requires(package) or []:
        requirement = Requirement(line)
        in_extra = requirement.marker is not None and requirement.marker.evaluate({"extra": extra or ""})
        if requirement.name == dependency and (requirement.marker is None or in_extra):
            return requirement.specifier
    raise LookupError(f"{package} does not declare {dependency}" + (f" (extra {extra!r})" if extra else ""))


def installed_problems(version_of: Callable[[str], str] = metadata.version) -> list[str]:
    """What is wrong with the installed set, one line each; [] when it is the table's tested set."""
    table = compatibility_table()["megatron_core"]
    wanted = {
        "megatron-core": SpecifierSet(f"=={table['version']}"),
        "torch": SpecifierSet(table["torch"]),
        "transformer-engine": SpecifierSet(table["transformer_engine"]),
    }
    problems = []
    for package, specifier in wanted.items():
        try:
            installed = Version(version_of(package))
        except metadata.PackageNotFoundError:
            problems.append(
                f"{package} is not installed; image/compatibility.toml needs {package}{specifier}"
            )
            continue
        if not specifier.contains(installed, prereleases=True):
            problems.append(
                f"{package} {installed} is outside {specifier} (image/compatibility.toml, megatron-core "
                f"{table['version']}'s declared requirement); choose a base image or megatron-core that fit"
            )
    return problems


def main() -> int:
    problems = installed_problems()
    for problem in problems:
        print(f"compatibility: {problem}", file=sys.stderr)
    if not problems:
        versions = ", ".join(
            f"{p} {metadata.version(p)}" for p in ("torch", "transformer-engine", "megatron-core")
        )
        print(f"compatibility: {versions}: the tested set of image/compatibility.toml")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
