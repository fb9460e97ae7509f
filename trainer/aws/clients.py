"""boto3 clients for a stack's region, with adaptive retries. AWS_PROFILE, AWS_ENDPOINT_URL and credentials are
boto3's own; the region is the stack's, where its resources live."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import boto3
from botocore.config import Config

RETRIES = Config(retries={"mode": "adaptive", "max_attempts": 10})


def client(service: str, region: str) -> Any:
    return boto3.session.Session().client(service, region_name=region, config=RETRIES)


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
