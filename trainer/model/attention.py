"""Core attention without TransformerEngine: torch's scaled_dot_product_attention as megatron-core's core attention.

megatron-core's local spec computes attention unfused (`DotProductAttention`: baddbmm into a [b, heads, s, s] score
tensor, softmax, bmm), which keeps the scores and probabilities of every layer for the backward pass. torch's
`scaled_dot_product_attention` computes the same function but dispatches to FlashAttention, cuDNN or memory-efficient
kernels on GPUs, which keep no scores. `SDPAttention` takes the place of `DotProductAttention` in the local spec
(same constructor, same forward, same [s, b, heads x head_dim] output); `core_attention_backend` says which one a run
uses, and `layer_spec` builds the spec with it.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math

import torch
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide

from trainer.model.flops import Kernels

# The names runs print and the bench records: TransformerEngine's fused attention, torch SDPA, megatron's unfused.
TRANSFORMER_ENGINE, SDPA, UNFUSED = "transformer_engine", "sdpa", "unfused"

# enable_gqa arrived in torch 2.5 (torch docs, torch.nn.functional.scaled_dot_product_attention); before it, repeat.
_SDPA_HAS_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


def core_attention_backend(device: str, have_transformer_engine: bool) -> str:
    """The core attention a run uses: TransformerEngine's on GPUs that have it, torch SDPA everywhere else."""
    return TRANSFORMER_ENGINE if device == "cuda" and have_transformer_engine else SDPA


# The planner's name for the layers each backend runs (trainer/model/flops.py Kernels).
PLANNER_KERNELS: dict[str, Kernels] = {
    TRANSFORMER_ENGINE: "transformer_engine",
    SDPA: "local",
    UNFUSED: "local-unfused",
}


def describe(backend: str) -> str:
    """One line for the run's first lines: which attention kernel and why."""
    return {
        TRANSFORMER_ENGINE: "attention: TransformerEngine fused attention",
        SDPA: "attention: torch scaled_dot_product_attention (TransformerEngine is not installed or not on CUDA; "
        "FlashAttention/cuDNN/memory-efficient kernels on GPUs, no stored scores)",
        UNFUSED: "attention: megatron-core unfused DotProductAttention (stores [batch, heads, seq, seq] scores)",
    }[backend]


def layer_spec(backend: str) -> ModuleSpec:
    """megatron-core's local (plain torch) Llama layer spec with `backend`'s core attention (SDPA or unfused)."""
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    if backend == UNFUSED:
        return spec
    if backend != SDPA:
        raise ValueError(f"core attention {backend!r} has no local spec; valid: {SDPA!r}, {UNFUSED!r}")
    spec = copy.deepcopy(spec)
    # megatron-core 0.16.1 models/gpt/gpt_layer_specs.py get_gpt_layer_local_spec: layer -> self_attention -> core
    spec.submodules.self_attention.submodules.core_attention = SDPAttention
    return spec


class SDPAttention(MegatronModule):
    """Causal (or masked) grouped-query attention through torch SDPA, with megatron-core 0.16.1 DotProductAttention's
    constructor and forward (transformer/dot_product_attention.py): query [sq, b, heads/tp, head_dim], key and value
    [sk, b, groups/tp, head_dim], a boolean mask where True means masked out, output [sq, b, heads/tp x head_dim]."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection=None,
    ):
        super().__init__(config=config)
        unsupported = {
            "context_parallel_size": (config.context_parallel_size, 1),
            "window_size": (config.window_size, None),
            "softmax_type": (config.softmax_type, "vanilla"),
        }
        for key, (value, supported) in unsupported.items():
            if value != supported:
                raise ValueError(
                    f"SDPA core attention does not support {key}={value!r} (valid: {supported!r}); "
                    "those need TransformerEngine's attention"
                )
        tp = (
            pg_collection.tp.size()
            if pg_collection is not None
            else parallel_state.get_tensor_model_parallel_world_size()
        )
        head_dim = config.kv_channels
        self.heads_per_partition = divide(config.num_attention_heads, tp)
        self.groups_per_partition = divide(config.num_query_groups, tp)
        self.hidden_size_per_partition = self.heads_per_partition * head_dim
        self.attn_mask_type = attn_mask_type
        # DotProductAttention's scale; its apply_query_key_layer_scaling divides here and multiplies back in the
        # softmax, the same product.
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout

    def sharded_state_dict(
        self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None
    ) -> dict:
        """Nothing: no parameters and, as megatron-core 0.16.1 DotProductAttention.sharded_state_dict with a vanilla
        softmax (transformer/dot_product_attention.py), no `_extra_state` either, so a checkpoint holds the same keys
        whichever local core attention wrote it, and loads into either."""
        return {}

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        if attention_bias is not None:
            raise ValueError("SDPA core attention takes no attention bias (TransformerEngine's does)")
        if packed_seq_params is not None:
            return self._per_segment(query, key, value, packed_seq_params)
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        # [s, b, heads, head_dim] -> [b, heads, s, head_dim]: SDPA's layout (a view; the last dim stays contiguous)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        repeat = self.heads_per_partition // self.groups_per_partition
        if repeat > 1 and not _SDPA_HAS_GQA:
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        # Megatron's mask is True where attention is not allowed; SDPA's boolean mask is True where it is.
        causal = mask_type == AttnMaskType.causal and attention_mask is None and q.size(2) > 1
        mask = None if attention_mask is None else ~attention_mask
        dropout = self.dropout_p if self.training else 0.0
        gqa = {"enable_gqa": True} if repeat > 1 and _SDPA_HAS_GQA else {}
        # Dropout draws from megatron's model-parallel RNG outside sequence parallelism, as DotProductAttention's.
        forked = dropout > 0 and not self.config.sequence_parallel
        with tensor_parallel.get_cuda_rng_tracker().fork() if forked else contextlib.nullcontext():
            context = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal, scale=self.softmax_scale, **gqa
            )
        # [b, heads, sq, head_dim] -> [sq, b, heads x head_dim]
        sq, b = context.size(2), context.size(0)
        return context.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)

    def _per_segment(self, query, key, value, packed_seq_params) -> torch.Tensor:
        """Packed sequences (megatron-core's thd format: [tokens, heads, head_dim], segments bounded by cu_seqlens,
        as transformer/attention.py passes them): causal attention within each segment alone, [tokens, 1, heads x
        head_dim] out, which Attention reshapes as it does TransformerEngine's thd output."""
        if packed_seq_params.qkv_format != "thd":
            raise ValueError(
                f"SDPA core attention packs only the thd format, not {packed_seq_params.qkv_format!r}"
            )
        bounds = packed_seq_params.cu_seqlens_q.tolist()
        return torch.cat(
            [
                self.forward(
                    query[start:end].unsqueeze(1),
                    key[start:end].unsqueeze(1),
                    value[start:end].unsqueeze(1),
                    None,
                    AttnMaskType.causal,
                )
                for start, end in itertools.pairwise(bounds)
            ]
        )
