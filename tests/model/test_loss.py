"""The loss is the mean per token over the whole global batch, not a mean of micro-batch means: with loss masks
that keep very different numbers of tokens per sample, the gradient split over micro-batches, DP ranks and
pipeline stages equals the one of the whole global batch as a single micro-batch in one process (where the two
means coincide)."""

import pytest

from tests.distributed.test_parity import RELATIVE, relative_error

pytestmark = pytest.mark.slow


def uneven(launcher, name: str, nproc: int, *overrides: str):
    return launcher.launch(name, nproc, "schedule.global_batch_size=8", *overrides, mode="uneven")


def assert_same_gradients(got: dict, want: dict) -> None:
    if "output_layer.weight" in got:  # with PP > 1 the last stage holds a copy of the tied embedding
        got = {name: grad for name, grad in got.items() if name != "output_layer.weight"}
    assert got.keys() == want.keys()
    errors = {name: relative_error(got[name], want[name]) for name in want}
    worst = max(errors, key=errors.get)
    assert errors[worst] < RELATIVE, f"{worst} differs by {errors[worst]:.2e}"


@pytest.fixture(scope="module")
def whole_batch(launcher):
    """The global batch of 8 as one micro-batch in one process: its per-token mean's gradient."""
    return uneven(launcher, "uneven_whole", 1, "schedule.micro_batch_size=8").gradients()[0]


def test_micro_batches_over_dp_give_the_per_token_mean(launcher, whole_batch):
    split = uneven(launcher, "uneven_dp2", 2, "schedule.micro_batch_size=1").gradients()[0]
    assert_same_gradients(split, whole_batch)


def test_micro_batches_over_pipeline_stages_give_the_per_token_mean(launcher, whole_batch):
    split = uneven(
        launcher, "uneven_pp2", 2, "schedule.micro_batch_size=2", "parallel.pipeline_model_parallel_size=2"
    ).gradients()[0]
    assert_same_gradients(split, whole_batch)
