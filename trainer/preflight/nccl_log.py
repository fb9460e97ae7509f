"""What NCCL and aws-ofi-nccl say in an NCCL_DEBUG=INFO log: the network NCCL chose and the libfabric provider,
fabric and NIC count the plugin selected.

The line formats come from the upstream sources, not from a sample log:
- NCCL's INFO prefix is "%s:%d:%d [%d] NCCL INFO " (host, pid, tid, CUDA device; NVIDIA/nccl src/debug.cc) and
  its network choice is INFO(NCCL_INIT, "Using network %s", ...) (src/init.cc), logged under the INIT subsystem.
- aws-ofi-nccl prefixes its messages with "NET/OFI " (include/nccl_ofi_log.h) and logs the provider it selected as
  "Selected Provider is %s (found %d nics)" in v1.7.0-aws..v1.13.2-aws and as
  "Selected provider is %s, fabric is %s (found %d nics)" from v1.14.0 on (src/nccl_ofi_net.c, .cpp from
  v1.15.0); tests/fixtures/aws_ofi_nccl_provider_formats.json holds the string of every release tag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Both aws-ofi-nccl formats: the fabric clause exists from v1.14.0 on (see the module docstring).
_PROVIDER = re.compile(
    r"NET/OFI Selected [Pp]rovider is (?P<provider>[^\s,]+)(?:, fabric is (?P<fabric>[^\s,]+))?"
    r" \(found (?P<nics>\d+) nics\)"
)
_NETWORK = re.compile(r"NCCL INFO Using network (?P<name>.+?)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class ProviderSelection:
    provider: str
    fabric: str | None  # None: a plugin older than v1.14.0 does not log it
    nics: int


def nccl_network(log_text: str) -> str | None:
    """The network NCCL chose: the plugin's name (aws-ofi-nccl: 'AWS Libfabric' when NCCL_NET asks for it,
    otherwise 'Libfabric' or 'OFI'), or NCCL's own 'IB' / 'Socket'."""
    match = _NETWORK.search(log_text)
    return match.group("name") if match else None


def provider_selections(log_text: str) -> list[ProviderSelection]:
    """Every provider selection aws-ofi-nccl logged (one per process that loaded the plugin)."""
    return [
        ProviderSelection(m.group("provider"), m.group("fabric"), int(m.group("nics")))
        for m in _PROVIDER.finditer(log_text)
    ]
