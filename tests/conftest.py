"""Shared test setup: the repository root is importable (trainer, infra, policy packages); free local ports; a local
IMDSv2; no AWS credentials (`no_credentials`); and the training fixtures (tests/support/training.py: a tiny corpus
and config, multi-process runs)."""

import functools
import os
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import serve_in_background

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The trainer's session fixtures (tiny_corpus, tiny_config, launcher, single, tp2_pp2, ...), for every test folder.
pytest_plugins = ["tests.support.training"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(count: int) -> int:
    """A base port with `count` free ports from it (one per local rank); other programs share this machine."""
    for _ in range(100):
        base = free_port()
        sockets = []
        try:
            for port in range(base, base + count):
                probe = socket.socket()
                sockets.append(probe)
                probe.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for probe in sockets:
                probe.close()
    raise OSError(f"no {count} consecutive free ports found")


class Imds(BaseHTTPRequestHandler):
    """IMDSv2 (AWS EC2 User Guide, "Retrieve instance metadata"): a token from PUT /latest/api/token with a TTL
    header, then metadata only with that token; a request without it is refused."""

    token = "AQAEAExampleToken=="
    instance_id = "i-0123456789abcdef0"
    region = "us-east-1"

    def do_PUT(self):
        ok = (
            self.path == "/latest/api/token"
            and int(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", 0)) > 0
        )
        self._reply(200 if ok else 400, self.token)

    def do_GET(self):
        if self.headers.get("X-aws-ec2-metadata-token") != self.token:
            return self._reply(401, "")
        values = {
            "/latest/meta-data/instance-id": self.instance_id,
            "/latest/meta-data/placement/region": self.region,
        }
        self._reply(200, values[self.path]) if self.path in values else self._reply(404, "")

    def _reply(self, code: int, body: str):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def imds():
    """The endpoint of a local IMDSv2 (set Imds.instance_id with monkeypatch to change what it answers)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Imds)
    serve_in_background(server)
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@functools.cache
def stack_plan(stack: str, changes: tuple[tuple[str, Any], ...] = ()) -> Any:
    """A stack's offline preview (infra/preview.py under its mocks), its stack file with `changes` applied; run
    once a session for the infra and the policy tests alike."""
    from infra.config import read_stack_file
    from infra.preview import run_program

    return run_program(stack, {**read_stack_file(stack), **dict(changes)})


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    """No AWS credentials anywhere (environment, files, instance metadata): prices come from the checked-in
    snapshot, as on a laptop."""
    from trainer.cost.pricing import clients_for

    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    clients_for.cache_clear()  # a Region's clients are found once per process
    yield
    clients_for.cache_clear()  # nor kept for the tests after this one


def pytest_configure(config):
    """In each xdist worker, torch computes on one thread. Its default, a thread per core, has the two workers'
    threads spin against each other and against the runs they start: a tiny in-process fine-tune (40 AdamW steps,
    tests/data/test_packing.py) took 0.45 s alone, 6.8 s beside two busy cores with 2 threads and 0.8 s with 1, and
    16 s in the suite (docs/testing.md, "Idle waits"). Subprocesses set their own (OMP_NUM_THREADS=1)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """The slowest files first, so that xdist's workers end together (tests/support/durations.py)."""
    from tests.support.durations import file_seconds, order_longest_first

    order_longest_first(items, file_seconds())
