"""The image's settings files, in shell syntax (KEY="value" per line), each the one source of its facts:

- image/container.env: the container contract (FSx mount, data and checkpoint directories, default command),
  read through trainer/contract/container.py;

- image/efa.env: the NCCL/EFA environment; the Batch job definition sets it on every node and
  image/entrypoint.sh exports it for runs outside Batch;
- image/versions.env: the image's pins (base image, EFA installer); `make image` passes them as build args and
  the cluster's host user data installs the same EFA installer version.
"""

from __future__ import annotations

import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGE_DIR = ROOT / "image"
# The trainer runtime's exact pins: what `make train` installs and the image adds on top of its base.
TRAIN_REQUIREMENTS = ROOT / "requirements" / "train.txt"
EFA_ENV_FILE = IMAGE_DIR / "efa.env"
VERSIONS_FILE = IMAGE_DIR / "versions.env"
CONTAINER_ENV_FILE = IMAGE_DIR / "container.env"


def read_settings(path: Path) -> dict[str, str]:
    """KEY="value" lines; comments and blank lines ignored."""
    settings: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        words = shlex.split(line, comments=True)
        if not words:
            continue
        key, sep, value = words[0].partition("=")
        if len(words) != 1 or not sep or not key.isidentifier():
            raise ValueError(f'{path}:{number}: expected KEY="value", got {line!r}')
        settings[key] = value
    return settings


def efa_environment() -> dict[str, str]:
    return read_settings(EFA_ENV_FILE)


def image_pins() -> dict[str, str]:
    return read_settings(VERSIONS_FILE)


def container_environment() -> dict[str, str]:
    return read_settings(CONTAINER_ENV_FILE)


def requirement_pin(package: str) -> str:
    """The exact version requirements/train.txt pins `package` to (`name==version` lines)."""
    for line in TRAIN_REQUIREMENTS.read_text().splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep and name.lower() == package.lower():
            return version
    raise KeyError(f"{TRAIN_REQUIREMENTS} pins no {package}")
