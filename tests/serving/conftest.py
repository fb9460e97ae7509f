"""The serving tests' model: a Llama-3-style export built once per session (tests/support/llama3_export.py), and
`trainer serve --export` over it on 127.0.0.1, or the endpoint BASE_URL names (docs/serving.md, "The conformance
suite")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port
from tests.support.llama3_export import write_llama3_export

START_TIMEOUT_S = 240


@pytest.fixture(scope="session")
def llama3_export(tmp_path_factory) -> Path:
    return write_llama3_export(tmp_path_factory.mktemp("export") / "llama3-tiny")


@dataclass
class Endpoint:
    """An OpenAI-compatible endpoint and the model it serves."""

    url: str
    model: str
    export: Path | None = None  # the export `trainer serve` serves; None for BASE_URL's

    @property
    def ours(self) -> bool:
        return self.export is not None

    def tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.export)

    def client(self):
        from openai import OpenAI

        key = os.environ.get("OPENAI_API_KEY", "unused")
        return OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=120)


def wait_for_health(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail(f"the server did not start:\n{log.read_text()[-6000:]}")
        time.sleep(0.3)


def stop(process: subprocess.Popen, log: Path) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        # uvicorn shuts down gracefully, then raises the signal it caught again (uvicorn/server.py
        # capture_signals): the process ends by SIGTERM, after its answers were sent.
        assert process.wait(timeout=30) == -signal.SIGTERM, log.read_text()[-4000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def start_server(arguments: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    """`trainer serve ARGUMENTS` on a free port of 127.0.0.1, answering /health; its process and URL."""
    port = free_port()
    with log.open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "trainer", "serve", *arguments, "--port", str(port)],
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    wait_for_health(url, process, log)
    return process, url


@pytest.fixture(scope="module")
def endpoint(request, tmp_path_factory) -> Endpoint:
    """BASE_URL (with MODEL, else the endpoint's first model) when set, else `trainer serve --export` over the
    session's Llama-3-style export, one server for the module."""
    if base := os.environ.get("BASE_URL"):
        base = base.rstrip("/").removesuffix("/v1")
        model = os.environ.get("MODEL") or Endpoint(base, "").client().models.list().data[0].id
        yield Endpoint(base, model)
        return
    export = request.getfixturevalue("llama3_export")
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    process, url = start_server(["--export", str(export)], log)
    yield Endpoint(url, export.name, export)
    stop(process, log)
