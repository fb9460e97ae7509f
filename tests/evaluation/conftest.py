"""What the evaluation tests share: the TP=2 x PP=2 run's checkpoint exported to Hugging Face."""

import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def exported_tp2_pp2(tp2_pp2, launcher) -> Path:
    """The TP=2 x PP=2 run's last checkpoint as a Hugging Face model."""
    out = launcher.base / "generate-export" / "hf"
    launcher.run_once(
        "generate-export",
        [
            sys.executable,
            "-m",
            "trainer",
            "convert",
            "--to-hf",
            str(tp2_pp2.run_dir / "checkpoints"),
            "--out",
            str(out),
        ],
    )
    return out
