"""The memory model: the trainer's bytes per parameter, what TP/PP/DP and recompute do to each part, and
megatron-core's in-flight micro-batches. (Measured against real CPU runs: tests/bench, docs/bench.md.)"""

from types import SimpleNamespace

import pytest

from trainer.config import load_config
from trainer.model.flops import parameter_counts
from trainer.plan.memory import (
    estimate_memory,
    estimate_stages,
    in_flight_chunks,
    model_states,
    saved_per_layer,
)

from .conftest import LLAMA3_70B, with_layout

VOCAB = 128256
GIB = 2**30


def test_bf16_training_keeps_2_byte_weights_4_byte_gradients_and_12_bytes_of_optimizer_state(llama3_8b):
    replicated = model_states(with_layout(llama3_8b, use_distributed_optimizer=False), 16)
    assert (replicated.weights, replicated.gradients, replicated.optimizer) == (2, 4, 12)
    sharded = model_states(llama3_8b, 16)
    assert sharded.optimizer == pytest.approx(12 / 16)


def test_fp32_weights_are_their_own_master_copy(llama3_8b):
    states = model_states(llama3_8b.model_copy(update={"precision": "fp32"}), 1)
    assert (states.weights, states.gradients, states.optimizer) == (4, 4, 8)


def test_one_stage_one_tp_rank_holds_every_parameter(llama3_8b):
    cfg = with_layout(llama3_8b, tensor_model_parallel_size=1, sequence_parallel=False)
    estimate = estimate_memory(cfg, 32, VOCAB, "transformer_engine")
    assert estimate.parameters == parameter_counts(cfg.model, VOCAB).total


def test_more_tensor_parallelism_means_fewer_weight_bytes_per_gpu(llama3_70b):
    weights = [
        estimate_memory(
            with_layout(llama3_70b, tensor_model_parallel_size=tp), 256, VOCAB, "transformer_engine"
        ).weights
        for tp in (2, 4, 8)
    ]
    assert weights[0] > weights[1] > weights[2]
    assert weights[0] / weights[2] == pytest.approx(4, rel=0.01)  # all but the norms split


def test_more_pipeline_stages_mean_fewer_parameters_per_gpu(llama3_70b):
    params = [
        estimate_memory(
            with_layout(llama3_70b, pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=1),
            256,
            VOCAB,
            "transformer_engine",
        ).parameters
        for pp in (2, 4, 8)
    ]
    assert params[0] > params[1] > params[2]


@pytest.mark.parametrize("kernels", ["transformer_engine", "local"])
def test_full_recompute_keeps_less_than_selective_which_keeps_less_than_none(llama3_8b, kernels):
    cfg = with_layout(
        llama3_8b, pipeline_model_parallel_size=4, sequence_parallel=kernels == "transformer_engine"
    )
    first_stage = {
        mode: estimate_stages(with_layout(cfg, recompute=mode), 32, VOCAB, kernels)[0]
        for mode in ("none", "selective", "full")
    }
    assert all(stage.moment == "backward" for stage in first_stage.values())
    kept = {mode: stage.activations + stage.transient for mode, stage in first_stage.items()}
    assert kept["full"] < kept["selective"] < kept["none"]


def test_sequence_parallelism_splits_what_tensor_parallelism_leaves_whole(llama3_8b):
    without = estimate_memory(
        with_layout(llama3_8b, sequence_parallel=False), 32, VOCAB, "transformer_engine"
    )
    with_sp = estimate_memory(llama3_8b, 32, VOCAB, "transformer_engine")
    assert with_sp.activations < without.activations


def test_the_distributed_optimizer_divides_optimizer_states_by_data_parallel_size(llama3_8b):
    replicated = estimate_memory(
        with_layout(llama3_8b, use_distributed_optimizer=False), 32, VOCAB, "transformer_engine"
    )
    sharded = estimate_memory(llama3_8b, 32, VOCAB, "transformer_engine")
    assert replicated.optimizer_states / sharded.optimizer_states == pytest.approx(16)
    assert replicated.weights == sharded.weights and replicated.gradients == sharded.gradients


def test_last_stage_of_a_large_vocabulary_holds_6_bytes_of_logits_per_token_and_entry(llama3_8b):
    cfg = with_layout(llama3_8b, pipeline_model_parallel_size=4)
    last = estimate_stages(cfg, 32, VOCAB, "transformer_engine")[-1]
    assert last.moment == "loss"
    assert last.logits == 6 * VOCAB / 2 * 8192  # bf16 logits + fp32 softmax, one micro-batch of 8192 tokens


@pytest.mark.parametrize(
    ("pp", "vp", "micro_batches"), [(2, 1, 8), (4, 1, 2), (4, 1, 16), (4, 2, 8), (4, 5, 4), (8, 2, 16)]
)
def test_in_flight_micro_batches_are_megatron_cores_warm_up_plus_one(llama3_70b, pp, vp, micro_batches):
    from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches

    cfg = with_layout(llama3_70b, pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vp)
    for rank in range(pp):
        communicator = SimpleNamespace(
            pp_group=SimpleNamespace(size=lambda: pp, rank=lambda rank=rank: rank),
            virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
        )
        total, all_warmup, warmup, _ = get_pp_rank_microbatches(
            micro_batches, vp, pp, p2p_communicator=communicator
        )
        assert in_flight_chunks(cfg, rank, micro_batches) == (total if all_warmup else warmup + 1)


def test_llama3_70b_recipe_fits_an_h100_as_its_comment_says():
    recipe = load_config(LLAMA3_70B)  # the shipped recipe, fast path on
    estimate = estimate_memory(recipe, 256, VOCAB, "transformer_engine")
    assert estimate.parameters == pytest.approx(4.54e9, rel=0.01)  # "4.54 B parameters" per GPU
    assert estimate.total / GIB == pytest.approx(59.7, abs=0.05)  # "59.7 GiB of 72 usable"


def test_transformer_engine_layer_keeps_korthikantis_34_sbh_less_the_two_dropout_masks(llama3_8b):
    # Korthikanti et al. 2022, eq. 1 / table 2: a GPT layer (multi-head attention, 4h GeLU MLP, dropout) keeps
    # 34 s b h + 5 a s^2 b bytes in 16-bit. Flash attention drops the 5 a s^2 b (it keeps fp32 softmax
    # statistics, 4 a s b, instead); no dropout drops the two s b h masks; RMSNorm keeps an fp32 1/rms per
    # token (4 s b) per norm. A SwiGLU of 8h/3 has the 4h MLP's size, so the rest must match: 32 s b h.
    h, heads = 3072, 24
    gpt_shaped = llama3_8b.model.model_copy(
        update={
            "hidden_size": h,
            "ffn_hidden_size": 8 * h // 3,
            "num_attention_heads": heads,
            "num_query_groups": heads,
        }
    )
    cfg = with_layout(llama3_8b.model_copy(update={"model": gpt_shaped}), recompute="none")
    per_token = sum(t.bytes_per_token for t in saved_per_layer(cfg, "transformer_engine"))
    assert per_token == 32 * h + 2 * 4 + 4 * heads


def _at_sequence(cfg, seq: int):
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"seq_length": seq})})


def test_sdpa_attention_keeps_no_scores_so_its_activations_grow_linearly_with_sequence(llama3_8b):
    cfg = with_layout(llama3_8b, recompute="none", micro_batch_size=1)

    def doubling(kernels: str) -> float:
        short, long = (estimate_stages(_at_sequence(cfg, s), 8, VOCAB, kernels)[0] for s in (4096, 8192))
        return long.activations / short.activations

    assert doubling("local") == pytest.approx(2.0)
    assert doubling("local-unfused") > 2.5  # the s x s scores
    sdpa = estimate_stages(cfg, 8, VOCAB, "local")[0]
    assert sdpa.workspace == 0.0  # megatron's global score buffer is the unfused attention's alone


def test_sdpa_layer_keeps_flash_attentions_tensors_beside_the_local_norms_and_swiglu(llama3_8b):
    # SDPA's backward reads query, key, value, its output and the fp32 log-sum-exp (torch 2.13's schema of
    # aten::_scaled_dot_product_flash_attention_backward); the rest of the layer is the local spec's.
    cfg = with_layout(llama3_8b, recompute="none")
    m = cfg.model
    d = m.hidden_size // m.num_attention_heads
    sdpa = {t.name: t.bytes_per_token for t in saved_per_layer(cfg, "local")}
    unfused = {t.name: t.bytes_per_token for t in saved_per_layer(cfg, "local-unfused")}
    # Value stays a view of linear_qkv's whole output (megatron-core 0.16.1 get_query_key_value_tensors)
    assert sdpa["query and key after rotary embeddings"] == 2 * d * (m.num_attention_heads + m.query_groups)
    assert sdpa["linear_qkv output (value is a view of it)"] == 2 * d * (
        m.num_attention_heads + 2 * m.query_groups
    )
    assert sdpa["SDPA output (kept for its backward)"] == 2 * d * m.num_attention_heads
    assert sdpa["softmax log-sum-exp (fp32)"] == 4 * m.num_attention_heads
    assert "softmax output (fp32)" in unfused and "softmax output (fp32)" not in sdpa
    assert {k: v for k, v in sdpa.items() if "norm" in k or "FC" in k or "silu" in k} == {
        k: v for k, v in unfused.items() if "norm" in k or "FC" in k or "silu" in k
    }
