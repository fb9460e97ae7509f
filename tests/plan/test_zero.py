"""The planner's DeepSpeed ZeRO model: bytes per parameter by stage and offload, and when it suggests
`engine: deepspeed` (a layout megatron cannot fit, or fits only slower) and when it does not."""

import pytest

from trainer.config import load_config
from trainer.contract.catalog import instance_type
from trainer.plan.command import write_config
from trainer.plan.memory import estimate_memory, model_states
from trainer.plan.search import GIB, search

from .conftest import BF16_LAYOUT_KEYS, BF16_WITHOUT_FAST_PATH, LLAMA3_8B, with_layout

VOCAB = 128256
# Llama 3.2 1B's shape with untied embeddings (1.50 B parameters), fine-tuned at 2048 tokens.
SMALL = [
    "model.num_layers=16",
    "model.hidden_size=2048",
    "model.ffn_hidden_size=8192",
    "model.num_attention_heads=32",
    "model.num_query_groups=8",
    "data.seq_length=2048",
    "schedule.global_batch_size=8",
]


def zero(cfg, stage, offload_optimizer="none", offload_param="none"):
    return cfg.model_copy(
        update={
            "engine": "deepspeed",
            "zero": cfg.zero.model_copy(
                update={
                    "stage": stage,
                    "offload_optimizer": offload_optimizer,
                    "offload_param": offload_param,
                }
            ),
        }
    )


@pytest.mark.parametrize(
    ("stage", "offload_optimizer", "offload_param", "gpu", "host"),
    [
        # (weights, gradients, optimizer states) on the GPU over 8 data-parallel ranks: ZeRO's 2 + 2 + 12 bytes.
        (1, "none", "none", (2, 2, 12 / 8), 0),
        (2, "none", "none", (2, 2 / 8, 12 / 8), 0),
        (3, "none", "none", (2 / 8, 2 / 8, 12 / 8), 0),
        # Offloaded: Adam's 12 bytes and the fp32 gradient partition (4) live on the host, the weights too.
        (2, "cpu", "none", (2, 0, 0), 16 / 8),
        (3, "cpu", "none", (2 / 8, 0, 0), 16 / 8),
        (3, "cpu", "cpu", (0, 0, 0), 18 / 8),
    ],
)
def test_zero_bytes_per_parameter_by_stage_and_offload(
    llama3_8b, stage, offload_optimizer, offload_param, gpu, host
):
    states = model_states(zero(llama3_8b, stage, offload_optimizer, offload_param), 8)
    assert (states.weights, states.gradients, states.optimizer) == pytest.approx(gpu)
    assert states.host == pytest.approx(host)


def test_zero_keeps_fp32_masters_even_for_fp32_weights(llama3_8b):
    states = model_states(zero(llama3_8b.model_copy(update={"precision": "fp32"}), 1), 1)
    assert (states.weights, states.gradients, states.optimizer) == (4, 4, 12)


def test_zero3_holds_a_sixteenth_of_megatrons_model_states_on_8_gpus(llama3_8b):
    tp1 = with_layout(llama3_8b, tensor_model_parallel_size=1, sequence_parallel=False)
    megatron = estimate_memory(tp1, 8, VOCAB, "transformer_engine")
    zero3 = estimate_memory(zero(tp1, 3), 8, VOCAB, "transformer_engine")
    assert megatron.states / GIB == pytest.approx(56.1, abs=0.05)  # 8.03 B x (2 + 4 + 12/8) bytes
    assert zero3.states / GIB == pytest.approx(15.0, abs=0.05)  # 8.03 B x 16/8 bytes
    assert zero3.activations == megatron.activations  # the same model runs at TP = PP = 1


def test_planner_suggests_zero2_for_llama3_8b_on_one_p5_where_megatron_fits_only_by_splitting_the_model():
    cfg = load_config(LLAMA3_8B, BF16_WITHOUT_FAST_PATH)
    plan = search(cfg, instance_type("p5.48xlarge"), 1, BF16_LAYOUT_KEYS)
    chosen = plan.chosen
    assert chosen.cfg.engine == "deepspeed" and chosen.sharding == "ZeRO-2"
    assert (chosen.data_parallel_size, chosen.cfg.parallel.recompute) == (8, "none")
    assert chosen.memory.total / GIB == pytest.approx(69.0, abs=0.05)  # of 72 usable
    # megatron at TP = PP = 1 with the distributed optimizer and no recompute does not fit: 7.5 bytes a parameter.
    (megatron,) = [
        c
        for c in plan.candidates
        if c.cfg.engine == "megatron"
        and c.cfg.parallel.tensor_model_parallel_size == c.cfg.parallel.pipeline_model_parallel_size == 1
        and c.cfg.parallel.use_distributed_optimizer
        and (c.cfg.parallel.recompute, c.cfg.schedule.micro_batch_size) == ("none", 1)
    ]
    assert not megatron.fits and megatron.memory.total / GIB == pytest.approx(96.1, abs=0.05)
    assert chosen.overrides()[-4:] == [
        "engine=deepspeed",
        "zero.stage=2",
        "zero.offload_optimizer=none",
        "zero.offload_param=none",
    ]


def test_planner_keeps_megatron_on_p4d_where_tensor_parallelism_is_faster_than_any_zero_that_fits():
    plan = search(load_config(LLAMA3_8B), instance_type("p4d.24xlarge"), 1)
    assert plan.chosen.cfg.engine == "megatron"
    assert plan.chosen.cfg.parallel.tensor_model_parallel_size == 4
    fitting_zero = [c for c in plan.candidates if c.fits and c.cfg.engine == "deepspeed"]
    assert fitting_zero and min(c.step.total_s for c in fitting_zero) > plan.chosen.step.total_s


def test_only_zero_offload_fits_a_1_5b_model_on_one_a10g_and_only_with_enough_host_memory():
    cfg = load_config(LLAMA3_8B, SMALL)
    plan = search(cfg, instance_type("g5.2xlarge"), 1)  # 1 x 24 GB A10G, 32 GiB of host memory
    assert not any(c.fits for c in plan.candidates if c.cfg.engine == "megatron")
    chosen = plan.chosen
    assert chosen.sharding == "ZeRO-2 +opt on CPU"
    assert chosen.memory.total / GIB == pytest.approx(7.5, abs=0.05)
    assert chosen.memory.host / GIB == pytest.approx(22.3, abs=0.05)  # 1.50 B x 16 bytes
    # g5.xlarge has the same GPU and 16 GiB of host memory: the offloaded states no longer fit anywhere.
    assert search(cfg, instance_type("g5.xlarge"), 1).chosen is None


def test_a_written_zero_layout_is_a_config_train_accepts(tmp_path):
    plan = search(
        load_config(LLAMA3_8B, BF16_WITHOUT_FAST_PATH), instance_type("p5.48xlarge"), 1, BF16_LAYOUT_KEYS
    )
    write_config(plan.chosen, tmp_path / "planned.yaml", str(LLAMA3_8B))
    written = load_config(tmp_path / "planned.yaml")
    assert (written.engine, written.zero.stage, written.parallel.tensor_model_parallel_size) == (
        "deepspeed",
        2,
        1,
    )
    assert not written.parallel.use_distributed_optimizer and not written.parallel.overlap_grad_reduce
