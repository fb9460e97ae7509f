"""Without TransformerEngine or apex, megatron-core steps torch's AdamW; the trainer switches it to torch's fused
kernel, which must update every weight as the for-loop AdamW does."""

import pytest
import torch

from tests.model import attention_worker
from trainer.distributed import parallel
from trainer.distributed.optimizer import _torch_optimizers, build_optimizer
from trainer.model import llama


def updates(cfg, fused: bool) -> list[torch.Tensor]:
    """What two AdamW steps change in every parameter AdamW steps (the fp32 masters under bf16)."""
    built = llama.build(cfg)
    chunks = parallel.wrap_data_parallel(built.chunks, cfg, built.config)
    optimizer = build_optimizer(cfg, chunks)
    groups = [g for inner in _torch_optimizers(optimizer) for g in inner.param_groups]
    assert groups and all(g["fused"] and not g["foreach"] for g in groups)
    if not fused:
        for group in groups:
            group["fused"] = False  # the for-loop AdamW megatron-core would step without the switch
    stepped = [p for group in groups for p in group["params"]]
    initial = [p.detach().clone() for p in stepped]
    tokens = attention_worker.tokens()
    positions = torch.arange(tokens.shape[1])[None].expand_as(tokens)
    for _ in range(2):  # the second step reads Adam's moments from the first
        optimizer.zero_grad()
        for chunk in chunks:
            chunk.zero_grad_buffer()
        chunks[0](tokens, positions, None, labels=tokens.roll(-1, dims=1)).sum().backward()
        chunks[0].finish_grad_sync()
        assert optimizer.step()[0]
    return [p.detach() - before for p, before in zip(stepped, initial, strict=True)]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fused_adamw_updates_weights_as_the_for_loop_adamw_does(model_parallel, precision):
    cfg = attention_worker.model_only_config(attention_worker.MODEL, seq_length=attention_worker.SEQ)
    optimizer = cfg.optimizer.model_copy(update={"lr": 1e-3})
    cfg = cfg.model_copy(update={"precision": precision, "optimizer": optimizer})
    fused, loop = updates(cfg, fused=True), updates(cfg, fused=False)
    assert len(fused) == len(loop) == len(list(llama.build(cfg).chunks[0].parameters()))
    for index, (got, want) in enumerate(zip(fused, loop, strict=True)):
        assert want.dtype == torch.float32 and want.norm() > 0, f"parameter {index} did not move"
        assert ((got - want).norm() / want.norm()).item() < 1e-5, f"parameter {index}"
