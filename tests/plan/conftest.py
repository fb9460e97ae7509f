"""Configs the planner tests plan: the shipped Llama 3 recipes, with their parallel sections free to change."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import TrainConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
LLAMA3_8B = ROOT / "trainer/configs/llama3-8b.yaml"
LLAMA3_70B = ROOT / "trainer/configs/llama3-70b.yaml"


def with_layout(cfg: TrainConfig, **layout) -> TrainConfig:
    """`cfg` with parallel.* and schedule.micro_batch_size changed (as the search does)."""
    micro_batch = layout.pop("micro_batch_size", cfg.schedule.micro_batch_size)
    return cfg.model_copy(
        update={
            "parallel": cfg.parallel.model_copy(update=layout),
            "schedule": cfg.schedule.model_copy(update={"micro_batch_size": micro_batch}),
        }
    )


@pytest.fixture(scope="session")
def llama3_8b() -> TrainConfig:
    return load_config(LLAMA3_8B)


@pytest.fixture(scope="session")
def llama3_70b() -> TrainConfig:
    return load_config(LLAMA3_70B)
