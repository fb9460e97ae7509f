"""The NCCL log parser against lines rendered from upstream's own format strings: aws-ofi-nccl's provider line at
every release tag from v1.7.0 to the newest (fixture extracted from the tags), NCCL's INFO prefix and its
"Using network %s" (NVIDIA/nccl src/debug.cc, src/init.cc)."""

import json

import pytest

from tests.conftest import ROOT
from trainer.contract.catalog import instance_type
from trainer.preflight.checks import FAILED, OK, check_nccl_network
from trainer.preflight.nccl_log import ProviderSelection, nccl_network, provider_selections

FIXTURE = json.loads((ROOT / "tests" / "fixtures" / "aws_ofi_nccl_provider_formats.json").read_text())
NCCL_INFO = "%s:%d:%d [%d] NCCL INFO "  # NVIDIA/nccl src/debug.cc
USING_NETWORK = "Using network %s"  # NVIDIA/nccl src/init.cc, INFO(NCCL_INIT, ...)
P5 = instance_type("p5.48xlarge")


def render(fmt: str, provider: str, fabric: str, nics: int) -> str:
    """A log line as NCCL writes it for aws-ofi-nccl's NCCL_OFI_INFO(fmt, ...) (C printf: %s, %d)."""
    args = (provider, fabric, nics) if fmt.count("%") == 3 else (provider, nics)
    return NCCL_INFO % ("ip-10-0-1-17", 12, 40, 0) + FIXTURE["prefix"] + fmt % args


def log_for(fmt: str, provider: str = "efa", nics: int = 32, network: str = "AWS Libfabric") -> str:
    return "\n".join(
        [
            render(fmt, provider, "efa-direct", nics),
            NCCL_INFO % ("ip-10-0-1-17", 12, 12, 0) + USING_NETWORK % network,
        ]
    )


def test_the_fixture_covers_every_release_from_v1_7_to_both_formats():
    tags = [entry["tag"] for entry in FIXTURE["formats"]]
    assert tags[0] == "v1.7.0-aws" and "v1.13.2-aws" in tags and "v1.14.0" in tags
    assert {entry["format"] for entry in FIXTURE["formats"]} == {
        "Selected Provider is %s (found %d nics)",
        "Selected provider is %s, fabric is %s (found %d nics)",
    }


@pytest.mark.parametrize("entry", FIXTURE["formats"], ids=lambda e: f"{e['tag']}:{e['file']}")
def test_provider_line_of_every_tag_parses(entry):
    (selection,) = provider_selections(log_for(entry["format"]))
    with_fabric = "fabric" in entry["format"]
    assert selection == ProviderSelection("efa", "efa-direct" if with_fabric else None, 32)
    assert check_nccl_network(P5, log_for(entry["format"])).status == OK


@pytest.mark.parametrize("fmt", sorted({e["format"] for e in FIXTURE["formats"]}))
def test_wrong_provider_or_missing_nics_fail(fmt):
    tcp = check_nccl_network(P5, log_for(fmt, provider="tcp"))
    assert tcp.status == FAILED and "selected tcp with 32 nics" in tcp.detail
    half = check_nccl_network(P5, log_for(fmt, nics=16))
    assert half.status == FAILED and "all 32 EFA interfaces" in half.detail


def test_socket_fallback_fails():
    socket_log = NCCL_INFO % ("ip-10-0-1-17", 12, 12, 0) + USING_NETWORK % "Socket"
    assert nccl_network(socket_log) == "Socket"
    fallback = check_nccl_network(P5, socket_log)
    assert fallback.status == FAILED and "NCCL is using Socket instead of EFA" in fallback.detail
    assert check_nccl_network(P5, "").status == FAILED
