"""One fact for the IMDS hop limit: the launch templates' value, and what docs/cluster.md and docs/infra.md say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infra.cluster import IMDS_HOP_LIMIT
from tests.infra.conftest import planned

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("name", ["dev", "staging", "prod"])
def test_every_launch_template_uses_the_one_hop_limit(name):
    for template in planned(name).all("ec2.LaunchTemplate"):
        assert template.inputs["metadataOptions"]["httpPutResponseHopLimit"] == IMDS_HOP_LIMIT, template.name


@pytest.mark.parametrize("page", ["cluster.md", "infra.md"])
def test_the_docs_state_the_same_hop_limit(page):
    text = " ".join((DOCS / page).read_text().split())
    stated = [int(n) for n in re.findall(r"IMDS hop limit (\d+)", text)]
    assert stated and set(stated) == {IMDS_HOP_LIMIT}, f"docs/{page} says IMDS hop limit {stated}"
    assert not re.search(r"hop_limit` \d", text.replace(f"hop_limit` {IMDS_HOP_LIMIT}", ""))
