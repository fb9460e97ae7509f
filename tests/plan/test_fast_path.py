"""The planner's models of the GPU fast path: FP8's memory and compute peak, overlap as hidden communication,
context parallelism's split and ring, partial recompute; the search explores them and the table shows them."""

import pytest

from trainer.__main__ import main as trainer_main
from trainer.config import load_config
from trainer.contract.catalog import INSTANCE_TYPES, instance_type
from trainer.model.flops import forward_flops_per_sequence, parameter_counts
from trainer.plan.memory import estimate_memory
from trainer.plan.performance import Assumptions, estimate_step_time
from trainer.plan.search import GIB, search

from .conftest import LLAMA3_8B, with_layout

P5 = instance_type("p5.48xlarge")
VOCAB = 128256
ASSUME = Assumptions()
HYBRID = {"format": "hybrid", "recipe": "tensorwise"}


def with_fp8(cfg, **fp8):
    return cfg.model_copy(update={"fp8": cfg.fp8.model_copy(update=fp8)})


def step(cfg, nodes=4):
    memory = estimate_memory(cfg, nodes * 8, VOCAB, "transformer_engine")
    return estimate_step_time(cfg, P5, nodes, VOCAB, memory.parameters, ASSUME)


def test_catalog_fp8_peaks_are_half_the_datasheets_with_sparsity_figures():
    # NVIDIA H100 / H200 datasheets: FP8 3,958 TFLOPS with sparsity; HGX B200: FP8 9 PFLOPS per GPU with sparsity.
    sparse = {"H100": 3958, "H200": 3958, "B200": 9000, "A100": 0, "A10G": 0}
    for t in INSTANCE_TYPES.values():
        assert t.peak_fp8_tflops_per_gpu == pytest.approx(sparse[t.gpu_model] / 2, abs=0.5)
        assert ("mxfp8" in t.fp8_recipes) == (t.gpu_model == "B200")
        assert bool(t.fp8_recipes) == (t.peak_fp8_tflops_per_gpu > 0)


def test_fp8_saves_gemm_inputs_in_one_byte_and_keeps_two_fp8_copies_of_each_layer_weight(llama3_8b):
    bf16 = with_layout(llama3_8b, tensor_model_parallel_size=2, recompute="none")
    fp8 = with_fp8(bf16, **HYBRID)
    a, b = (estimate_memory(c, 32, VOCAB, "transformer_engine") for c in (bf16, fp8))
    counts = parameter_counts(bf16.model, VOCAB)
    assert b.weights - a.weights == pytest.approx(
        2 * counts.num_layers * (counts.layer - counts.layer_norms) / 2
    )
    m, tokens = bf16.model, bf16.data.seq_length  # micro-batch 1, TP=2 with sequence parallelism
    gemm_inputs = (2 * m.hidden_size / 2 + (m.hidden_size + m.ffn_hidden_size) / 2) * tokens * m.num_layers
    assert a.activations - b.activations == pytest.approx(gemm_inputs)  # one byte saved per element


def test_fp8_runs_the_weight_gemms_at_the_fp8_peak_and_attention_and_logits_in_bf16(llama3_8b):
    bf16 = with_layout(llama3_8b, tensor_model_parallel_size=2, recompute="none")
    a, b = step(bf16), step(with_fp8(bf16, **HYBRID))
    forward = forward_flops_per_sequence(bf16.model, bf16.data.seq_length, VOCAB)
    micro_batches = 256 // 16
    dense_bf16 = 3 * forward.dense / 2 / (989e12 * ASSUME.matmul_efficiency)
    dense_fp8 = 3 * forward.dense / 2 / (1979e12 * ASSUME.fp8_matmul_efficiency)
    assert a.compute_s - b.compute_s == pytest.approx(micro_batches * (dense_bf16 - dense_fp8))
    assert b.mfu / a.mfu == pytest.approx(a.total_s / b.total_s)  # MFU stays against the bf16 peak


def test_overlap_hides_the_weight_gather_behind_a_forward_and_most_tp_traffic_behind_the_gemms(llama3_8b):
    base = with_layout(llama3_8b, tensor_model_parallel_size=2, overlap_grad_reduce=False, recompute="none")
    plain = step(base)
    gathered = step(with_layout(base, overlap_param_gather=True))
    assert gathered.data_parallel_s < plain.data_parallel_s
    assert gathered.hidden_s == pytest.approx(plain.data_parallel_s - gathered.data_parallel_s)
    tp = step(with_layout(base, tp_comm_overlap=True))
    assert tp.tensor_parallel_s == pytest.approx(plain.tensor_parallel_s * (1 - ASSUME.tp_overlap_hidden))
    assert tp.total_s < plain.total_s and tp.compute_s == plain.compute_s


def test_context_parallelism_splits_tokens_and_compute_and_shards_the_optimizer_over_dp_x_cp(llama3_8b):
    cfg = with_layout(llama3_8b, tensor_model_parallel_size=2, recompute="none")
    cp = with_layout(cfg, context_parallel_size=2)
    one, two = (estimate_memory(c, 32, VOCAB, "transformer_engine") for c in (cfg, cp))
    assert two.activations == pytest.approx(one.activations / 2)
    assert two.logits == pytest.approx(one.logits / 2)
    assert two.optimizer_states == pytest.approx(one.optimizer_states)  # DP halves, DP x CP does not
    a, b = step(cfg), step(cp)
    assert b.compute_s == pytest.approx(a.compute_s)  # half the tokens per GPU, twice the micro-batches
    # The K,V ring of 8192 tokens over NVLink hides behind attention entirely.
    assert b.context_parallel_s == 0 and b.hidden_s > a.hidden_s


def test_a_ring_longer_than_attention_shows_its_excess(llama3_8b):
    # Short sequences: attention is short, and CP=8 across nodes (TP=2 x CP=8 > 8 GPUs) runs the ring over EFA.
    short = llama3_8b.model_copy(update={"data": llama3_8b.data.model_copy(update={"seq_length": 4096})})
    cfg = with_layout(short, tensor_model_parallel_size=2, context_parallel_size=8, recompute="none")
    assert step(cfg, nodes=16).context_parallel_s > 0


def test_block_recompute_sits_between_none_and_full_in_memory_and_time(llama3_8b):
    cfg = with_layout(llama3_8b, tensor_model_parallel_size=1, sequence_parallel=False)
    layouts = {
        "none": with_layout(cfg, recompute="none"),
        "block 16": with_layout(cfg, recompute="full", recompute_method="block", recompute_num_layers=16),
        "full": with_layout(cfg, recompute="full"),
    }
    memory = {k: estimate_memory(c, 32, VOCAB, "transformer_engine").activations for k, c in layouts.items()}
    assert memory["full"] < memory["block 16"] < memory["none"]
    assert memory["block 16"] == pytest.approx((memory["none"] + memory["full"]) / 2)  # half the layers each
    seconds = {k: step(c).compute_s for k, c in layouts.items()}
    assert seconds["block 16"] == pytest.approx((seconds["none"] + seconds["full"]) / 2)


def test_the_search_explores_fp8_cp_partial_recompute_and_overlap_and_the_table_shows_them(capsys):
    plan = search(load_config(LLAMA3_8B), P5, 4)
    cfgs = [c.cfg for c in plan.candidates if c.cfg.engine == "megatron"]
    assert {c.fp8.format for c in cfgs} == {None, "hybrid"} and {c.fp8.recipe for c in cfgs} >= {"tensorwise"}
    assert {c.parallel.context_parallel_size for c in cfgs} == {1, 2}  # 8192 tokens: at least 4096 per rank
    assert {c.parallel.recompute_method for c in cfgs} == {"uniform", "block"}
    assert all(c.parallel.tp_comm_overlap == c.parallel.sequence_parallel for c in cfgs)
    assert not any(
        c.fp8.format
        for c in (c.cfg for c in search(load_config(LLAMA3_8B), instance_type("p4d.24xlarge"), 1).candidates)
    )
    status = trainer_main(
        ["plan", "--config", str(LLAMA3_8B), "--instance", "p5.48xlarge", "--nodes", "4", "--top", "3"]
    )
    out = capsys.readouterr().out
    assert status == 0
    for column in ("CP", "precision", "overlap"):
        assert f" {column} " in out
    assert "fp8 tensorwise" in out and "grad+param+tp" in out and "context parallel ring" in out


@pytest.mark.parametrize(
    ("recipe", "nodes", "gib", "seconds"),
    [("llama3-8b", 4, 48.5, 4.23), ("llama3-70b", 32, 59.7, 10.04), ("llama3-8b-128k", 8, 47.1, 29.80)],
)
def test_the_recipes_are_the_planners_choice_with_the_figures_their_comments_state(
    recipe, nodes, gib, seconds
):
    path = LLAMA3_8B.with_name(f"{recipe}.yaml")
    cfg = load_config(path)
    chosen = search(cfg, P5, nodes).chosen
    for key, value in chosen.layout.items():
        section, name = key.split(".")
        assert getattr(getattr(cfg, section), name) == value, key
    assert chosen.memory.total / GIB == pytest.approx(gib, abs=0.05)
    assert chosen.step.total_s == pytest.approx(seconds, abs=0.005)
    assert f"{gib} GiB" in path.read_text() or f"{gib} GiB of 72" in path.read_text()
