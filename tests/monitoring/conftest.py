"""A real Prometheus server (Debian's `prometheus` package) for the monitoring tests: installed when missing, started
on a free port with a temporary config, stopped after the test."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import free_port


def ensure_prometheus(
    package: str = "prometheus", tools: tuple[str, ...] = ("prometheus", "promtool")
) -> None:
    """Debian's prometheus package gives /usr/bin/prometheus and promtool, prometheus-alertmanager gives amtool;
    install one when absent (root, as in CI)."""
    if all(shutil.which(tool) for tool in tools):
        return
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", package], check=True, env=env
    )


class PrometheusServer:
    def __init__(self, directory: Path, targets: list[str], rules: dict | None = None) -> None:
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "trainstack", "static_configs": [{"targets": targets}]}],
        }
        if rules is not None:
            (directory / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
            config["rule_files"] = [str(directory / "rules.yml")]
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (directory / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1)
                return
            except OSError:
                assert self.process.poll() is None, (directory / "prometheus.log").read_text()
                time.sleep(0.5)
        raise TimeoutError("prometheus did not become ready in 60 s")

    def api(self, path: str, **params: str) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="session")
def promtool() -> str:
    ensure_prometheus()
    return shutil.which("promtool")


@pytest.fixture(scope="session")
def amtool() -> str:
    ensure_prometheus("prometheus-alertmanager", ("amtool",))
    return shutil.which("amtool")


@pytest.fixture
def prometheus_server(tmp_path):
    """`prometheus_server(targets, rules)`: a running server scraping `targets` and evaluating `rules` every
    second."""
    ensure_prometheus()
    servers = []

    def start(targets: list[str], rules: dict | None = None) -> PrometheusServer:
        servers.append(PrometheusServer(tmp_path, targets, rules))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()
