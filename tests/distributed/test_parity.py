"""The same seed gives the same training at any (TP, PP, DP) layout: losses and gradients, fp32, for 3 steps."""

import pytest
import torch

pytestmark = pytest.mark.slow  # multi-process runs against a single process (make test runs them)

RELATIVE = 1e-5
PARITY_STEPS = 3


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def assert_same_training(layout, single):
    losses, reference = layout.losses(), single.losses()
    for step in range(1, PARITY_STEPS + 1):
        assert losses[step] == pytest.approx(reference[step], rel=RELATIVE), f"loss at step {step}"
    gradients, reference_gradients = layout.gradients(), single.gradients()
    assert len(gradients) == len(reference_gradients) == PARITY_STEPS
    for step, (got, want) in enumerate(zip(gradients, reference_gradients, strict=True), start=1):
        if "output_layer.weight" in got:  # with PP > 1 the last stage holds a copy of the tied embedding
            assert torch.equal(got.pop("output_layer.weight"), got["embedding.word_embeddings.weight"])
        assert got.keys() == want.keys()
        errors = {name: relative_error(got[name], want[name]) for name in want}
        worst = max(errors, key=errors.get)
        assert errors[worst] < RELATIVE, f"step {step}: {worst} differs by {errors[worst]:.2e}"


def test_tp2_pp2_matches_single_process(tp2_pp2, single):
    assert_same_training(tp2_pp2, single)


def test_tp2_dp2_matches_single_process(launcher, single):
    # Also overlaps the gradient reduce-scatter with backward and recomputes attention, as production runs do.
    layout = launcher.launch(
        "tp2_dp2",
        4,
        "parallel.tensor_model_parallel_size=2",
        "parallel.overlap_grad_reduce=true",
        "parallel.recompute=selective",
        "schedule.train_iters=3",
    )
    assert_same_training(layout, single)


def test_pp4_interleaved_matches_single_process(launcher, single):
    # Also recomputes every layer's activations in backward.
    layout = launcher.launch(
        "pp4_vp2",
        4,
        "parallel.pipeline_model_parallel_size=4",
        "parallel.virtual_pipeline_model_parallel_size=2",
        "parallel.recompute=full",
        "schedule.train_iters=3",
    )
    assert_same_training(layout, single)
