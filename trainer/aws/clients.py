"""boto3 clients for a stack's region, with adaptive retries. AWS_PROFILE, AWS_ENDPOINT_URL and credentials are
boto3's own; the region is the stack's, where its resources live."""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import quote

import boto3
import botocore.session
from botocore.config import Config
from botocore.loaders import Loader

RETRIES = Config(retries={"mode": "adaptive", "max_attempts": 10})

_loader: Loader | None = None
_loader_lock = threading.Lock()


def session() -> boto3.session.Session:
    """A new session (credentials, profile and endpoint read afresh, as a team's or a test's may change), sharing
    one loader of botocore's service models: each session otherwise parses every model it uses from JSON again,
    about 0.1 s a client (botocore/session.py: the `data_loader` component, `register_component`)."""
    global _loader
    core = botocore.session.Session()
    with _loader_lock:
        if _loader is None:
            _loader = core.get_component("data_loader")
        else:
            core.register_component("data_loader", _loader)
    return boto3.session.Session(botocore_session=core)


def client(service: str, region: str) -> Any:
    return session().client(service, region_name=region, config=RETRIES)


def _console_path(name: str) -> str:
    # The CloudWatch console wants names URL-encoded twice with '%' written as '$'.
    return quote(quote(name, safe=""), safe="").replace("%", "$")


def batch_job_url(region: str, job_id: str) -> str:
    return f"https://{region}.console.aws.amazon.com/batch/home?region={region}#jobs/mnp-job/{job_id}"


def log_group_url(region: str, group: str) -> str:
    return (
        f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#logsV2:log-groups/log-group/"
        f"{_console_path(group)}"
    )


def log_stream_url(region: str, group: str, stream: str) -> str:
    return f"{log_group_url(region, group)}/log-events/{_console_path(stream)}"
