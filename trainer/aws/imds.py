"""This EC2 instance's metadata through IMDSv2: PUT /latest/api/token with X-aws-ec2-metadata-token-ttl-seconds,
then GET /latest/meta-data/<item> with the token in X-aws-ec2-metadata-token (AWS EC2 User Guide, "Retrieve
instance metadata", instancedata-data-retrieval.html). The straggler report names nodes by instance id; a node
that fails its preflight finds its id and region here to take itself out of service."""

from __future__ import annotations

import os
import urllib.request

IMDS = "http://169.254.169.254"
# botocore's own setting for another metadata endpoint (AWS SDKs and Tools Reference Guide, "IMDS credential
# provider"); tests point it at a local server.
IMDS_ENDPOINT_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"


def metadata(*items: str, endpoint: str | None = None, timeout_s: float = 2.0) -> list[str]:
    """The metadata items (e.g. "instance-id", "placement/region") with one token; raises OSError (URLError,
    timeouts, refused connections) where no IMDS answers."""
    endpoint = (endpoint or os.environ.get(IMDS_ENDPOINT_ENV) or IMDS).rstrip("/")
    token_request = urllib.request.Request(
        f"{endpoint}/latest/api/token", method="PUT", headers={TOKEN_TTL_HEADER: "60"}
    )
    with urllib.request.urlopen(token_request, timeout=timeout_s) as response:
        token = response.read().decode()
    values = []
    for item in items:
        request = urllib.request.Request(f"{endpoint}/latest/meta-data/{item}", headers={TOKEN_HEADER: token})
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            values.append(response.read().decode().strip())
    return values
