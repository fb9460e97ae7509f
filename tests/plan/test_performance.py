"""The step-time model: pipeline bubbles, ring collectives, and how the parts add up to tokens/s and MFU."""

import pytest

from trainer.contract.catalog import instance_type
from trainer.model.flops import model_flops_per_sequence
from trainer.plan.memory import estimate_memory
from trainer.plan.performance import (
    Assumptions,
    bubble_fraction,
    estimate_step_time,
    network_gbytes_per_s_per_gpu,
    ring_seconds,
)

from .conftest import with_layout

P5 = instance_type("p5.48xlarge")
VOCAB = 128256


@pytest.mark.parametrize(("p", "m"), [(2, 8), (4, 8), (8, 64)])
def test_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(p, m):
    assert bubble_fraction(p, 1, m) == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize(("p", "v", "m"), [(4, 2, 8), (4, 5, 4), (8, 10, 64)])
def test_interleaving_divides_the_bubble_by_the_virtual_stages(p, v, m):
    fraction = bubble_fraction(p, v, m)
    # Narayanan et al. 2021 state it against the ideal (bubble-free) time: (p - 1) / (v m).
    assert fraction / (1 - fraction) == pytest.approx((p - 1) / (v * m))


def test_no_pipeline_no_bubble():
    assert bubble_fraction(1, 1, 16) == 0


def test_ring_all_reduce_moves_twice_the_data_of_a_reduce_scatter():
    one_gb = 1e9
    assert ring_seconds(one_gb, 8, 100) == pytest.approx(7 / 8 * 0.01)
    assert ring_seconds(one_gb, 8, 100, passes=2) == pytest.approx(2 * 7 / 8 * 0.01)
    assert ring_seconds(one_gb, 1, 100) == 0


def test_eight_p5_gpus_share_the_node_bandwidth_that_nccl_tests_measure_between_two_nodes():
    # FACTS.md: nccl-tests all_reduce between two p5.48xlarge: about 390 GB/s bus bandwidth at 512 MB.
    assert 8 * network_gbytes_per_s_per_gpu(P5) == pytest.approx(400)


def step_time(cfg, nodes, assumptions=None):
    memory = estimate_memory(cfg, nodes * 8, VOCAB, "transformer_engine")
    return estimate_step_time(cfg, P5, nodes, VOCAB, memory.parameters, assumptions or Assumptions())


def test_tokens_per_second_and_mfu_follow_from_the_step_time(llama3_8b):
    step = step_time(llama3_8b, 4)
    s = llama3_8b.schedule
    assert step.tokens_per_s * step.total_s == pytest.approx(s.global_batch_size * 8192)
    flops = model_flops_per_sequence(llama3_8b.model, 8192, VOCAB) * s.global_batch_size
    assert step.mfu == pytest.approx(flops / (step.total_s * 32 * P5.peak_bf16_tflops_per_gpu * 1e12))
    assert step.mfu < Assumptions().matmul_efficiency  # communication only adds time


def test_recompute_costs_time(llama3_8b):
    times = [
        step_time(with_layout(llama3_8b, recompute=mode), 4).total_s for mode in ("none", "selective", "full")
    ]
    assert times[0] < times[1] < times[2]


def test_interleaving_shrinks_the_bubble_but_sends_more(llama3_70b):
    plain = step_time(with_layout(llama3_70b, virtual_pipeline_model_parallel_size=1), 32)
    interleaved = step_time(llama3_70b, 32)
    assert interleaved.bubble_s < plain.bubble_s
    assert interleaved.pipeline_p2p_s > plain.pipeline_p2p_s


def test_faster_compute_shortens_the_step(llama3_8b):
    slow = step_time(llama3_8b, 4, Assumptions(matmul_efficiency=0.4))
    fast = step_time(llama3_8b, 4, Assumptions(matmul_efficiency=0.8))
    assert fast.compute_s == pytest.approx(slow.compute_s / 2)
    assert fast.total_s < slow.total_s


def test_data_parallel_across_nodes_is_slower_than_inside_one(llama3_8b):
    cfg = with_layout(llama3_8b, overlap_grad_reduce=False)
    one_node = step_time(
        with_layout(cfg, tensor_model_parallel_size=1, sequence_parallel=False), 1
    )  # DP=8 over NVLink
    across = step_time(with_layout(cfg, tensor_model_parallel_size=8), 8)  # DP=8, one GPU per node
    assert across.data_parallel_s > one_node.data_parallel_s
