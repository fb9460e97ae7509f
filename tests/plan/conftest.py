"""Configs the planner tests plan: the shipped Llama 3 recipes, with their parallel sections free to change."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from trainer.config import LAYOUT_KEYS, TrainConfig, load_config

LLAMA3_8B = ROOT / "trainer/configs/llama3-8b.yaml"
LLAMA3_70B = ROOT / "trainer/configs/llama3-70b.yaml"
# The recipes as they were before the GPU fast path (bf16, no TP or weight-gather overlap, no fused kernels), and
# the layout keys of that search: the scenarios whose published comparisons the ZeRO tests pin.
BF16_WITHOUT_FAST_PATH = [
    "fp8.format=null",
    "fp8.recipe=delayed",
    "fusion.gradient_accumulation_fusion=false",
    "fusion.cross_entropy_loss_fusion=false",
    "parallel.overlap_param_gather=false",
    "parallel.tp_comm_overlap=false",
]
BF16_LAYOUT_KEYS = LAYOUT_KEYS[: LAYOUT_KEYS.index("schedule.micro_batch_size") + 1]


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
    """The 8B recipe in bf16 without the fast path: the scenario the pinned figures describe."""
    return load_config(LLAMA3_8B, BF16_WITHOUT_FAST_PATH)


@pytest.fixture(scope="session")
def llama3_70b() -> TrainConfig:
    """The 70B recipe in bf16 without the fast path: the scenario the pinned figures describe."""
    return load_config(LLAMA3_70B, BF16_WITHOUT_FAST_PATH)
