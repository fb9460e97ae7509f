"""Full weights: the model's parameters as unsharded tensors under one naming, the intermediate every checkpoint
conversion goes through (Hugging Face in trainer/interop/hf.py; another format plugs into the same two functions).

The naming is the trainer's model at TP=1, PP=1 with megatron-core's local layer spec: `embedding.word_embeddings
.weight`, `decoder.layers.<global layer>.input_layernorm.weight`, `...self_attention.linear_qkv.weight` (grouped
per query group: [its query heads; key; value]), `...mlp.linear_fc1.weight` ([gate; up]), `decoder.final_layernorm
.weight`, and `output_layer.weight` unless the embeddings are tied. The embedding (and output layer) rows are
padded to model.make_vocab_size_divisible_by. `load_into` gives each rank its shard at any (TP, PP, virtual
stages); `gather` reads them back from a one-process model, whose checkpoint load already resharded them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from megatron.core import parallel_state
from megatron.core.utils import unwrap_model

from trainer.config import (
    DataConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    ScheduleConfig,
    TrainConfig,
)
from trainer.model import llama


@torch.no_grad()
def load_into(chunks: list[torch.nn.Module], full_weight: Callable[[str], torch.Tensor]) -> None:
    """Overwrite every parameter of this rank's chunks with its shard of `full_weight(name)`."""
    for chunk in unwrap_model(chunks):
        tied = chunk.share_embeddings_and_output_weights
        for name, param in chunk.named_parameters():
            full = full_weight(llama.full_weight_name(chunk, name, tied))
            param.copy_(llama.tp_shard(full, name))


def gather(chunks: list[torch.nn.Module]) -> dict[str, torch.Tensor]:
    """Every full weight of a model built at TP=1, PP=1 (one process holds them all)."""
    (chunk,) = unwrap_model(chunks)
    if (
        not (chunk.pre_process and chunk.post_process)
        or parallel_state.get_tensor_model_parallel_world_size() > 1
    ):
        raise ValueError("gather() reads full weights from a model built at TP=1, PP=1")
    tied = chunk.share_embeddings_and_output_weights
    return {llama.full_weight_name(chunk, n, tied): p.detach() for n, p in chunk.named_parameters()}


def model_only_config(
    model: ModelConfig,
    *,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    seq_length: int,
    global_batch_size: int = 1,
) -> TrainConfig:
    """A config that builds `model` at (TP, PP) in fp32 for conversion or evaluation. parallel.initialize and
    model.llama.build read a TrainConfig; these paths never read its data files, optimizer or LR schedule."""
    return TrainConfig(
        name="model-only",
        precision="fp32",
        model=model,
        parallel=ParallelConfig(
            tensor_model_parallel_size=tensor_parallel, pipeline_model_parallel_size=pipeline_parallel
        ),
        data=DataConfig(prefixes=["unused"], seq_length=seq_length, tokenizer_path="unused"),
        optimizer=OptimizerConfig(lr=1.0),
        schedule=ScheduleConfig(train_iters=1, micro_batch_size=1, global_batch_size=global_batch_size),
    )
