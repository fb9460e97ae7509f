"""One process of the attention parity run, launched by torchrun (or called in-process at TP=1 x PP=1): builds the
tiny Llama twice from one seed, with megatron-core's unfused core attention and with torch SDPA, runs one batch
forward and backward through megatron's pipeline schedule, and writes both losses and every local gradient.

    attention_worker.py TP PP OUT      OUT/rank{N}.pt: {"unfused": {...}, "sdpa": {...}}
"""

import sys
from pathlib import Path

import torch
from megatron.core.pipeline_parallel import get_forward_backward_func

from trainer.config import ModelConfig
from trainer.distributed import parallel
from trainer.model import attention, llama
from trainer.model.weights import model_only_config

# 4 heads in 2 query groups (grouped-query attention at TP=2 too), 4 layers for 2 pipeline stages.
MODEL = ModelConfig(
    num_layers=4,
    hidden_size=32,
    ffn_hidden_size=64,
    num_attention_heads=4,
    num_query_groups=2,
    vocab_size=96,
    share_embeddings_and_output_weights=True,
)
SEQ, BATCH = 16, 2


def tokens() -> torch.Tensor:
    return torch.randint(0, MODEL.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(3))


def loss_and_gradients(cfg, backend: str) -> dict:
    """One forward and backward of a fixed batch; the loss (last stage only) and this rank's gradients."""
    config = llama.transformer_config(cfg, "cpu")
    padded = MODEL.padded_vocab_size(MODEL.vocab_size)
    chunks = llama.build_model(cfg, config, padded, attention_backend=backend)
    batch = tokens()
    losses = []

    def forward_step(batches, chunk):
        data = next(batches)
        positions = torch.arange(SEQ)[None].expand_as(data)
        return chunk(data, positions, None, labels=data.roll(-1, dims=1)), loss_sum

    def loss_sum(per_token_loss):
        total = per_token_loss.sum()
        losses.append(total.detach())
        return total, torch.tensor(per_token_loss.numel()), {}

    get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter([batch]),
        model=chunks[0],
        num_microbatches=1,
        seq_length=SEQ,
        micro_batch_size=BATCH,
    )
    gradients = {name: p.grad.clone() for name, p in chunks[0].named_parameters() if p.grad is not None}
    cores = {type(layer.self_attention.core_attention).__name__ for layer in chunks[0].decoder.layers}
    return {"loss": losses[0] if losses else None, "gradients": gradients, "core_attention": cores}


def run(tp: int, pp: int) -> dict:
    cfg = model_only_config(MODEL, tensor_parallel=tp, pipeline_parallel=pp, seq_length=SEQ)
    return {backend: loss_and_gradients(cfg, backend) for backend in (attention.UNFUSED, attention.SDPA)}


def main() -> None:
    tp, pp, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    parallel.initialize(model_only_config(MODEL, tensor_parallel=tp, pipeline_parallel=pp, seq_length=SEQ))
    try:
        torch.save(run(tp, pp), out / f"rank{torch.distributed.get_rank()}.pt")
    finally:
        parallel.shutdown()


if __name__ == "__main__":
    main()
