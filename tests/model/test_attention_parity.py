"""torch SDPA as megatron-core's core attention computes what megatron's unfused DotProductAttention computes: the
attention itself (causal, grouped-query, with a mask), a whole model's loss and gradients in fp32 at TP=1 x PP=1
in this process, and at TP=2 x PP=2 over 4 gloo processes; the trainer picks it when TransformerEngine is absent."""

import math
import os
import subprocess

import pytest
import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

from tests.conftest import ROOT
from tests.model import attention_worker
from tests.support.training import torchrun
from trainer.model import attention, llama

RELATIVE = 1e-5  # fp32: the two compute the same sums in a different order
HEADS, GROUPS, HEAD_DIM, SEQ, BATCH = 4, 2, 8, 12, 2


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def core_config(dropout: float = 0.0):
    cfg = attention_worker.model_only_config(
        attention_worker.MODEL.model_copy(
            update={"hidden_size": HEADS * HEAD_DIM, "num_attention_heads": HEADS, "num_query_groups": GROUPS}
        ),
        seq_length=SEQ,
    )
    config = llama.transformer_config(cfg, "cpu")
    config.attention_dropout = dropout
    return config


def qkv() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(11)
    shapes = [(SEQ, BATCH, HEADS, HEAD_DIM), (SEQ, BATCH, GROUPS, HEAD_DIM), (SEQ, BATCH, GROUPS, HEAD_DIM)]
    return [torch.randn(shape, generator=generator).requires_grad_() for shape in shapes]


def attend(module, mask: torch.Tensor | None = None):
    q, k, v = qkv()
    out = module(q, k, v, mask)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(5)))
    return out.detach(), [t.grad for t in (q, k, v)]


def core(cls, config):
    return cls(config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "explicit-mask"])
def test_sdpa_core_attention_matches_unfused_output_and_gradients(model_parallel, masked):
    config = core_config()
    # megatron's masks are True where attention is not allowed: causal plus the first two keys of every query
    mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)
    mask[2:, :2] = True
    mask = mask[None, None] if masked else None
    want, want_grads = attend(core(DotProductAttention, config), mask)
    got, got_grads = attend(core(attention.SDPAttention, config), mask)
    assert got.shape == want.shape == (SEQ, BATCH, HEADS * HEAD_DIM)
    assert relative_error(got, want) < RELATIVE
    for name, g, w in zip("qkv", got_grads, want_grads, strict=True):
        assert relative_error(g, w) < RELATIVE, f"gradient of {name}"


def test_sdpa_dropout_applies_in_training_only(model_parallel):
    module = core(attention.SDPAttention, core_config(dropout=0.5))
    plain = core(attention.SDPAttention, core_config())
    q, k, v = qkv()
    module.eval()
    assert torch.equal(module(q, k, v, None), plain(q, k, v, None))
    module.train()
    dropped = module(q, k, v, None)
    assert not torch.allclose(dropped, plain(q, k, v, None))


def test_sdpa_refuses_what_only_transformer_engine_does(model_parallel):
    config = core_config()
    config.window_size = (4, 0)
    with pytest.raises(ValueError, match=r"window_size=\(4, 0\).*valid: None"):
        core(attention.SDPAttention, config)


def test_model_with_sdpa_matches_unfused_loss_and_gradients(model_parallel):
    results = attention_worker.run(tp=1, pp=1)
    unfused, sdpa = results[attention.UNFUSED], results[attention.SDPA]
    assert sdpa["core_attention"] == {"SDPAttention"} and unfused["core_attention"] == {"DotProductAttention"}
    assert sdpa["loss"].item() == pytest.approx(unfused["loss"].item(), rel=RELATIVE)
    assert math.isfinite(sdpa["loss"].item())
    assert sdpa["gradients"].keys() == unfused["gradients"].keys() and sdpa["gradients"]
    for name, want in unfused["gradients"].items():
        assert relative_error(sdpa["gradients"][name], want) < RELATIVE, name


def test_sdpa_is_chosen_without_transformer_engine():
    assert attention.core_attention_backend("cpu", have_transformer_engine=False) == attention.SDPA
    assert attention.core_attention_backend("cuda", have_transformer_engine=False) == attention.SDPA
    assert attention.core_attention_backend("cpu", have_transformer_engine=True) == attention.SDPA
    assert (
        attention.core_attention_backend("cuda", have_transformer_engine=True) == attention.TRANSFORMER_ENGINE
    )
    assert "scaled_dot_product_attention" in attention.describe(attention.SDPA)


@pytest.mark.slow  # 4 gloo processes, two model builds each
def test_tp2_pp2_sdpa_matches_unfused(tmp_path):
    done = subprocess.run(
        torchrun(4, "tests.model.attention_worker", "2", "2", str(tmp_path)),
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(4)]
    losses = [r for r in ranks if r[attention.SDPA]["loss"] is not None]
    assert len(losses) == 2  # the last pipeline stage's two TP ranks
    for result in losses:
        assert result[attention.SDPA]["loss"].item() == pytest.approx(
            result[attention.UNFUSED]["loss"].item(), rel=RELATIVE
        )
    for rank, result in enumerate(ranks):
        unfused, sdpa = result[attention.UNFUSED]["gradients"], result[attention.SDPA]["gradients"]
        assert sdpa.keys() == unfused.keys() and sdpa, f"rank {rank}"
        for name, want in unfused.items():
            assert relative_error(sdpa[name], want) < RELATIVE, f"rank {rank}: {name}"
