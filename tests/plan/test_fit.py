"""The memory check before the first step: the planner's peak against the device's free memory, refused with the
estimate, the free memory and the single changes that fit; and the largest micro-batch that fits (bench --gpu)."""

import pytest

from trainer.config import load_config
from trainer.plan.fit import GIB, USABLE_FRACTION, fit_problem, largest_micro_batch, micro_batch_sizes
from trainer.plan.memory import estimate_memory
from trainer.plan.search import vocab_size

# The H200 of the GPU report: 139.8 GiB, of which the CUDA context takes about half a GiB.
H200_FREE = 139.3 * GIB


@pytest.fixture(scope="module")
def bench_gpu():
    return load_config("trainer/configs/bench-gpu.yaml")


def test_a_layout_that_fits_passes(bench_gpu):
    assert fit_problem(bench_gpu, 1, vocab_size(bench_gpu), "local", H200_FREE) is None


def test_unfused_attention_at_micro_batch_2_is_refused_with_the_estimate_free_memory_and_what_fits(bench_gpu):
    # The GPU report: megatron's unfused attention at micro-batch 2 ran out of memory in its first step.
    problem = fit_problem(bench_gpu, 1, vocab_size(bench_gpu), "local-unfused", H200_FREE, "cuda:0")
    estimate = estimate_memory(bench_gpu, 1, vocab_size(bench_gpu), "local-unfused").total
    assert problem is not None
    assert f"{estimate / GIB:.1f} GiB per GPU" in problem and "cuda:0's 139.3 GiB free" in problem
    assert "schedule.micro_batch_size=1 (" in problem
    assert "parallel.recompute=selective" in problem and "parallel.recompute=full" in problem
    assert "parallel.tensor_model_parallel_size=2 on 2 GPUs" in problem


def test_nothing_single_fits_says_so(bench_gpu):
    problem = fit_problem(bench_gpu, 1, vocab_size(bench_gpu), "local", 8 * GIB)
    assert "no single change" in problem and "python -m trainer plan" in problem


def test_the_check_keeps_a_margin_for_the_allocator(bench_gpu):
    estimate = estimate_memory(bench_gpu, 1, vocab_size(bench_gpu), "local").total
    assert fit_problem(bench_gpu, 1, vocab_size(bench_gpu), "local", estimate / USABLE_FRACTION) is None
    assert fit_problem(bench_gpu, 1, vocab_size(bench_gpu), "local", estimate) is not None


def test_micro_batch_sizes_divide_the_replicas_share_of_the_global_batch(bench_gpu):
    assert micro_batch_sizes(bench_gpu, 1) == [8, 4, 2, 1]
    assert micro_batch_sizes(bench_gpu, 4) == [2, 1]


def test_largest_micro_batch_that_fits(bench_gpu):
    vocab = vocab_size(bench_gpu)
    assert largest_micro_batch(bench_gpu, 1, vocab, "local-unfused", H200_FREE) == 1
    sdpa = largest_micro_batch(bench_gpu, 1, vocab, "local", H200_FREE)
    assert sdpa is not None and sdpa > 1
    assert largest_micro_batch(bench_gpu, 1, vocab, "local", 8 * GIB) is None
