"""Every dependency is pinned exactly, and the full lock agrees with each requirements file."""

import re
import subprocess
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
