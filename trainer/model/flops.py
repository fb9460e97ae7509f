"""Transformer arithmetic of the Llama this trainer builds: parameter counts and model FLOPs, without torch.

The one place for both facts: the trainer's MFU (trainer/loop.py) and the planner (trainer/plan/) read them.
Llama as trainer/model/llama.py builds it: RMSNorm (one weight vector), SwiGLU MLP (three matrices), grouped-query
attention, rotary positions (no parameters), no biases, an untied output layer unless
`share_embeddings_and_output_weights`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trainer.config import ModelConfig

# Which layers run a model's blocks, as the memory model counts what each saves for backward (trainer/plan/
# memory.py): TransformerEngine's fused ones, megatron-core's local spec, or the local spec unfused (CPU).
Kernels = Literal["transformer_engine", "local", "local-unfused"]


@dataclass(frozen=True)
class ParameterCounts:
    """Parameters by piece; `layer` is one transformer layer, `layer_norms` the part of it TP does not split."""

    embedding: int
    layer: int
    layer_norms: int
    num_layers: int
    final_norm: int
    output_layer: int  # 0 when tied to the embedding

    @property
    def total(self) -> int:
        return self.embedding + self.num_layers * self.layer + self.final_norm + self.output_layer


def parameter_counts(model: ModelConfig, padded_vocab_size: int) -> ParameterCounts:
    h, heads, groups = model.hidden_size, model.num_attention_heads, model.query_groups
    head_dim = model.kv_channels or h // heads
    qkv = h * (heads + 2 * groups) * head_dim
    projection = heads * head_dim * h
    mlp = 3 * h * model.ffn_hidden_size  # gate, up (fused as linear_fc1) and down
    norms = 2 * h
    embedding = padded_vocab_size * h
    return ParameterCounts(
        embedding=embedding,
        layer=qkv + projection + mlp + norms,
        layer_norms=norms,
        num_layers=model.num_layers,
        final_norm=h,
        output_layer=0 if model.share_embeddings_and_output_weights else embedding,
    )


@dataclass(frozen=True)
class ForwardFlops:
    """Forward FLOPs of one sequence by part (multiply-adds count 2). Backward costs twice the forward."""

    dense: float  # QKV, attention output projection, SwiGLU: the matmuls with weights
    attention: float  # scores and weighted values, causal half only
    logits: float  # the output layer

    @property
    def total(self) -> float:
        return self.dense + self.attention + self.logits


def forward_flops_per_sequence(model: ModelConfig, seq_length: int, padded_vocab_size: int) -> ForwardFlops:
    """Megatron-LM's accounting (num_floating_point_operations): every matmul of the model, with the causal
    attention's masked half left out; norms, rotary, softmax and the loss are not counted."""
    s, h, layers = seq_length, model.hidden_size, model.num_layers
    heads, groups = model.num_attention_heads, model.query_groups
    head_dim = model.kv_channels or h // heads
    qkv = 2 * s * h * (heads + 2 * groups) * head_dim
    projection = 2 * s * heads * head_dim * h
    mlp = 2 * s * 3 * h * model.ffn_hidden_size
    attention = 2 * (2 * s * s * heads * head_dim) / 2
    return ForwardFlops(
        dense=layers * (qkv + projection + mlp),
        attention=layers * attention,
        logits=2 * s * h * padded_vocab_size,
    )


def model_flops_per_sequence(model: ModelConfig, seq_length: int, padded_vocab_size: int) -> float:
    """Forward + backward model FLOPs of one sequence: what MFU counts (recomputation is not model work)."""
    return 3 * forward_flops_per_sequence(model, seq_length, padded_vocab_size).total
