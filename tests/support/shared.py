"""What a pytest run builds once and every xdist worker reads: a prepared corpus, a trained tiny run, an export.

pytest-xdist runs each worker as its own session, so a session fixture is built once per worker; the xdist docs
("How-tos: Making session-scoped fixtures execute only once") give the way to share one: a directory under the
run's common temporary root and a file lock around its build. Builds happen in place (paths inside the artifact,
such as a config's data prefix or a checkpoint's manifest, stay true) and count only once their `.done` marker is
written, after the build returned; a build that raised leaves no marker, and the next caller starts it over.

Tests only read what these return; a test that changes a run copies it first (shutil.copytree to its tmp_path).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory every worker of this pytest run shares: under xdist each worker's base temporary directory
    is <run root>/popen-gw<N> (xdist's workermanage sets basetemp so), without xdist the base itself."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if "PYTEST_XDIST_WORKER" in os.environ else base) / "shared"
    root.mkdir(exist_ok=True)
    return root


def build_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """`<run root>/<name>`, built by `build(path)` in the first worker that asks, waited for by the others."""
    root = run_root(tmp_path_factory)
    path, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)  # a build that raised part-way, in another worker
            path.mkdir(parents=True)
            build(path)
            done.touch()
    return path
