"""The GPU fast path's config plumbing, on CPU: each key lands in megatron-core 0.16.1's own config objects
(TransformerConfig, DistributedDataParallelConfig, OptimizerConfig) under its real field name, and what needs a
GPU or TransformerEngine is refused with the key, the value, why and what works."""

import dataclasses
from pathlib import Path

import pytest
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig
from megatron.core.transformer import TransformerConfig

from trainer.config import ConfigError, ParallelDims, accelerator_problems, layout_problems, load_config
from trainer.distributed.optimizer import optimizer_config
from trainer.distributed.parallel import ddp_config
from trainer.model.llama import transformer_config

CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"
LLAMA3_8B = CONFIGS / "llama3-8b.yaml"
# The fast path's keys that CPUs run (gloo, local spec).
CPU_RUNNABLE = [
    "parallel.use_distributed_optimizer=true",
    "parallel.overlap_grad_reduce=true",
    "parallel.overlap_param_gather=true",
    "parallel.recompute=full",
    "parallel.recompute_method=block",
    "parallel.recompute_num_layers=3",
]
EVERY_KNOB = [
    "parallel.tensor_model_parallel_size=2",
    "parallel.sequence_parallel=true",
    "parallel.context_parallel_size=2",
    "parallel.tp_comm_overlap=true",
    *CPU_RUNNABLE,
    "fp8.format=hybrid",
    "fp8.recipe=tensorwise",
    "fusion.gradient_accumulation_fusion=true",
    "fusion.cross_entropy_loss_fusion=true",
]
GPU_ONLY_KEYS = (
    "parallel.context_parallel_size",
    "parallel.tp_comm_overlap",
    "fp8.format",
    "fusion.gradient_accumulation_fusion",
    "fusion.cross_entropy_loss_fusion",
)


def test_every_knob_lands_in_megatron_cores_objects_by_its_real_field_name():
    cfg = load_config(LLAMA3_8B, EVERY_KNOB)
    config = transformer_config(cfg, "cuda")
    assert isinstance(config, TransformerConfig)  # megatron-core's __post_init__ accepted it
    expected = {
        "context_parallel_size": 2,
        "cp_comm_type": "p2p",
        "tp_comm_overlap": True,
        "sequence_parallel": True,
        "fp8": "hybrid",
        "fp8_recipe": "tensorwise",
        "fp8_param": False,  # weights stay bf16: an FP8-trained checkpoint holds no FP8 weights
        "gradient_accumulation_fusion": True,
        "cross_entropy_loss_fusion": True,
        "cross_entropy_fusion_impl": "te",
        "recompute_granularity": "full",
        "recompute_method": "block",
        "recompute_num_layers": 3,
    }
    assert {field: getattr(config, field) for field in expected} == expected
    ddp = ddp_config(cfg)
    assert isinstance(ddp, DistributedDataParallelConfig)
    assert dataclasses.asdict(ddp) | {
        "overlap_grad_reduce": True,
        "overlap_param_gather": True,
        "align_param_gather": True,
        "use_distributed_optimizer": True,
        "grad_reduce_in_fp32": True,
    } == dataclasses.asdict(ddp)
    optimizer = optimizer_config(cfg)
    assert isinstance(optimizer, OptimizerConfig)
    assert (optimizer.overlap_param_gather, optimizer.fp8_recipe, optimizer.use_distributed_optimizer) == (
        True,
        "tensorwise",
        True,
    )
    dims = ParallelDims.from_config(cfg.parallel, 32)
    assert (dims.tp, dims.cp, dims.dp, str(dims)) == (2, 2, 8, "TP=2 x PP=1 x CP=2 x DP=8")


def test_the_defaults_leave_every_knob_off_and_full_recompute_covers_every_layer():
    cfg = load_config(CONFIGS / "local.yaml", ["parallel.recompute=full"])
    config = transformer_config(cfg, "cpu")
    assert (config.fp8, config.context_parallel_size, config.cp_comm_type, config.tp_comm_overlap) == (
        None,
        1,
        None,
        False,
    )
    assert not (config.gradient_accumulation_fusion or config.cross_entropy_loss_fusion)
    assert (config.recompute_method, config.recompute_num_layers) == ("uniform", 1)
    ddp = ddp_config(cfg)
    assert not (ddp.overlap_param_gather or ddp.align_param_gather)
    assert optimizer_config(cfg).fp8_recipe is None


def test_cpu_refuses_each_gpu_only_knob_naming_key_value_why_and_what_works():
    cfg = load_config(LLAMA3_8B, EVERY_KNOB)
    problems = layout_problems(cfg, 32, "cpu")
    for key in GPU_ONLY_KEYS:
        [line] = [p for p in problems if p.startswith(f"{key} = ")]
        assert "cannot run on CPU" in line and "TransformerEngine" in line and "remove it here" in line
    assert any(
        "context parallelism (only TEDotProductAttention implements it) needs a GPU" in p for p in problems
    )
    # The same config on GPUs of the cluster (TransformerEngine in the image): nothing refused.
    assert layout_problems(cfg, 32, "cuda") == []


def test_a_gpu_without_transformer_engine_refuses_each_knob_and_fp8_needs_the_right_gpu():
    cfg = load_config(LLAMA3_8B, EVERY_KNOB)
    without_te = accelerator_problems(cfg, transformer_engine=False, compute_capability=(9, 0))
    assert [p.split(" = ")[0] for p in without_te] == list(GPU_ONLY_KEYS)
    assert all("needs TransformerEngine" in p for p in without_te)
    assert accelerator_problems(cfg, transformer_engine=True, compute_capability=(9, 0)) == []
    [a100] = accelerator_problems(cfg, transformer_engine=True, compute_capability=(8, 0))
    assert a100.startswith("fp8.format = 'hybrid': this GPU (compute capability 8.0) has no FP8")
    mxfp8 = load_config(LLAMA3_8B, [*EVERY_KNOB, "fp8.recipe=mxfp8"])
    [hopper] = accelerator_problems(mxfp8, transformer_engine=True, compute_capability=(9, 0))
    assert "fp8.recipe = 'mxfp8' needs a Blackwell GPU" in hopper and "tensorwise or delayed" in hopper
    assert accelerator_problems(mxfp8, transformer_engine=True, compute_capability=(10, 0)) == []


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["parallel.recompute=selective", "parallel.recompute_num_layers=2"],
            "parallel.recompute_num_layers = 2",
        ),
        (["parallel.recompute_method=block"], "it chooses the layers of full recompute only"),
        (["precision=fp32", "fp8.format=hybrid"], "fp8.format = 'hybrid' needs precision: bf16"),
        (["fp8.format=null", "fp8.recipe=mxfp8"], "fp8.recipe = 'mxfp8' is set but fp8.format is null"),
        (
            ["parallel.use_distributed_optimizer=false", "parallel.overlap_param_gather=true"],
            "parallel.overlap_param_gather = true needs parallel.use_distributed_optimizer = true",
        ),
        (
            ["parallel.sequence_parallel=false", "parallel.tp_comm_overlap=true"],
            "parallel.tp_comm_overlap = true needs parallel.sequence_parallel = true",
        ),
        (
            ["engine=deepspeed", "fp8.format=hybrid", "parallel.tensor_model_parallel_size=1"],
            "fp8.format = 'hybrid' needs engine: megatron",
        ),
        (
            ["engine=deepspeed", "parallel.tensor_model_parallel_size=1"],
            "parallel.overlap_param_gather is megatron's (its distributed optimizer's)",
        ),
    ],
)
def test_inconsistent_fast_path_keys_are_refused_at_load(overrides, expected):
    with pytest.raises(ConfigError) as error:
        load_config(LLAMA3_8B, overrides)
    assert expected in str(error.value)


def test_layout_checks_for_context_parallelism_and_partial_recompute():
    cfg = load_config(LLAMA3_8B, ["parallel.context_parallel_size=3"])
    problems = layout_problems(cfg, 48, "cuda")
    assert any(
        "data.seq_length = 8192 is not divisible by 2 x parallel.context_parallel_size = 6" in p
        for p in problems
    )
    assert layout_problems(cfg, 32, "cuda")[0].startswith(
        "world size 32 is not divisible by parallel.tensor_model_parallel_size x "
        "parallel.pipeline_model_parallel_size x context_parallel_size = 2 x 1 x 3 = 6"
    )
    block = load_config(LLAMA3_8B, ["parallel.recompute=full", "parallel.recompute_num_layers=33"])
    assert any(
        "recompute_num_layers = 33 is above the 32 layers of a model chunk" in p
        for p in layout_problems(block, 32, "cuda")
    )


@pytest.mark.slow
def test_overlapped_weight_gather_and_partial_recompute_train_as_a_single_process_does(launcher, single):
    # The CPU-runnable part of the fast path, really run (gloo): DP=2 with the distributed optimizer, the
    # gradient reduce-scatter overlapped with backward, the weight all-gather overlapped with the next forward
    # (evaluation and the final checkpoint first finish it), and full recompute of 3 of the 8 layers.
    from .test_parity import assert_same_training

    layout = launcher.launch(
        "dp2_overlap_block_recompute",
        2,
        *CPU_RUNNABLE,
        "schedule.train_iters=3",
    )
    assert_same_training(layout, single)
    # Validation after the last step sees the last update's weights (a stale, un-gathered shard would not).
    reference = launcher.launch("single_3_steps", 1, "schedule.train_iters=3")
    assert last_val_loss(layout) == pytest.approx(last_val_loss(reference), rel=1e-5)


def last_val_loss(result) -> float:
    return [r["val_loss"] for r in result.records if r.get("val_loss") is not None][-1]
