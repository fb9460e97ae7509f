"""engine: deepspeed: what it refuses before any process starts, and the DeepSpeed config it derives."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from trainer.config import ConfigError, load_config
from trainer.engines.deepspeed_config import deepspeed_problems, derived_config, merged_config

CONFIGS = ROOT / "trainer" / "configs"


def zero3(*overrides: str):
    return load_config(CONFIGS / "local-zero3.yaml", list(overrides))


def problems_of(config: Path, *overrides: str) -> str:
    with pytest.raises(ConfigError) as error:
        load_config(config, list(overrides))
    return str(error.value)


def test_zero3_with_tensor_or_pipeline_parallelism_is_refused_naming_the_key():
    message = problems_of(
        CONFIGS / "local-zero3.yaml",
        "parallel.tensor_model_parallel_size=2",
        "parallel.pipeline_model_parallel_size=2",
    )
    assert (
        "parallel.tensor_model_parallel_size = 2 needs engine: megatron; engine: deepspeed (ZeRO stage 3)"
        in (message)
    )
    assert "parallel.pipeline_model_parallel_size = 2 needs engine: megatron" in message


@pytest.mark.parametrize("stage", [1, 2])
def test_any_zero_stage_with_tensor_parallelism_is_refused(stage):
    message = problems_of(
        CONFIGS / "local-zero3.yaml", f"zero.stage={stage}", "parallel.tensor_model_parallel_size=2"
    )
    assert f"engine: deepspeed (ZeRO stage {stage}) runs data parallelism only (TP = PP = 1)" in message


def test_optimizer_offload_needs_stage_2_or_3():
    message = problems_of(CONFIGS / "local-zero3.yaml", "zero.stage=1", "zero.offload_optimizer=cpu")
    assert "zero.offload_optimizer = 'cpu' needs zero.stage 2 or 3 (got 1)" in message


def test_parameter_offload_needs_stage_3():
    message = problems_of(CONFIGS / "local-zero3.yaml", "zero.stage=2", "zero.offload_param=cpu")
    assert "zero.offload_param = 'cpu' needs zero.stage 3 (got 2)" in message


def test_megatron_data_parallel_keys_are_refused_under_deepspeed():
    message = problems_of(
        CONFIGS / "local-zero3.yaml", "parallel.overlap_grad_reduce=true", "parallel.sequence_parallel=true"
    )
    assert "parallel.overlap_grad_reduce is megatron's (its DDP)" in message
    assert "deepspeed.zero_optimization.overlap_comm does this" in message
    assert "parallel.sequence_parallel = true needs engine: megatron" in message


def test_zero_and_deepspeed_sections_are_refused_under_the_megatron_engine():
    message = problems_of(
        CONFIGS / "local.yaml", "zero.stage=3", "deepspeed.zero_optimization.overlap_comm=true"
    )
    assert "zero is set but engine is megatron; set engine: deepspeed to use it" in message
    assert "deepspeed is set but engine is megatron" in message


def test_derived_config_carries_batches_precision_clipping_zero_and_offload():
    cfg = zero3(
        "precision=bf16", "zero.offload_optimizer=cpu", "zero.offload_param=cpu", "optimizer.clip_grad=0.5"
    )
    derived = derived_config(cfg, 2, torch_optimizer_offload=False)
    assert derived["train_batch_size"] == 16
    assert derived["train_micro_batch_size_per_gpu"] == 4
    assert derived["gradient_accumulation_steps"] == 2  # 16 / (4 x DP 2)
    assert derived["gradient_clipping"] == 0.5
    assert derived["bf16"] == {"enabled": True}
    assert derived["zero_optimization"] == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "offload_param": {"device": "cpu"},
    }
    assert "zero_force_ds_cpu_optimizer" not in derived  # only when torch's AdamW steps host-resident states
    assert derived_config(zero3("precision=fp32"), 4, torch_optimizer_offload=False)["bf16"] == {
        "enabled": False
    }


def test_raw_keys_merge_over_the_derived_ones_section_by_section():
    cfg = zero3(
        "deepspeed.zero_optimization.overlap_comm=true",
        "deepspeed.zero_optimization.reduce_bucket_size=1000000",
    )
    assert deepspeed_problems(cfg, 2) == []
    merged = merged_config(derived_config(cfg, 2, torch_optimizer_offload=False), cfg.deepspeed)
    assert merged["zero_optimization"] == {"stage": 3, "overlap_comm": True, "reduce_bucket_size": 1000000}


def test_raw_key_that_sets_a_derived_value_differently_names_the_trainer_key():
    problems = deepspeed_problems(
        zero3("deepspeed.train_micro_batch_size_per_gpu=8", "deepspeed.zero_optimization.stage=2"), 2
    )
    assert problems == [
        "deepspeed.train_micro_batch_size_per_gpu = 8 conflicts with 4, which the trainer derives from "
        "schedule.micro_batch_size; change that key instead, or drop this one",
        "deepspeed.zero_optimization.stage = 2 conflicts with 3, which the trainer derives from zero.stage; "
        "change that key instead, or drop this one",
    ]
    assert (
        deepspeed_problems(zero3("deepspeed.gradient_clipping=1.0"), 2) == []
    )  # the same value: no conflict


@pytest.mark.parametrize(
    ("key", "instead"),
    [
        ("optimizer.type=Adam", "optimizer.*"),
        ("activation_checkpointing.partition_activations=true", "parallel.recompute"),
    ],
)
def test_raw_sections_the_trainer_provides_are_refused(key, instead):
    (problem,) = deepspeed_problems(zero3(f"deepspeed.{key}"), 2)
    assert problem.startswith(f"deepspeed.{key.split('.')[0]} is set by the trainer; use {instead}")


def test_misspelt_top_level_key_is_refused_with_the_key_deepspeed_reads():
    assert deepspeed_problems(zero3("deepspeed.zero_optimisation.overlap_comm=true"), 2) == [
        "deepspeed.zero_optimisation: not a DeepSpeed config key; did you mean 'zero_optimization'?"
    ]


def test_deepspeed_own_config_model_refuses_bad_section_keys_and_values():
    assert deepspeed_problems(zero3("deepspeed.zero_optimization.overlap_com=true"), 2) == [
        "deepspeed.zero_optimization.overlap_com = True: Extra inputs are not permitted"
    ]
    assert deepspeed_problems(zero3("deepspeed.zero_optimization.stage3_prefetch_bucket_size=-1"), 2) == [
        "deepspeed.zero_optimization.stage3_prefetch_bucket_size = -1: Input should be greater than or equal to 0"
    ]


def test_train_refuses_a_bad_deepspeed_key_before_starting_any_process():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "train",
            "--config",
            str(CONFIGS / "local-zero3.yaml"),
            "--set",
            "data.prefixes=[" + str(ROOT / "tests" / "trainer" / "missing") + "]",
            "--set",
            "deepspeed.zero_optimization.overlap_com=true",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "deepspeed.zero_optimization.overlap_com = True: Extra inputs are not permitted" in result.stderr
    assert "torchrun" not in result.stderr
