"""The model: megatron-core's GPTModel configured as Llama, and an initialization that ignores the layout.

Llama = RMSNorm, SwiGLU MLP, rotary position embeddings, grouped-query attention, no biases. On GPUs with
TransformerEngine the layers use TE's fused modules; otherwise megatron-core's local (plain torch) spec with torch
SDPA as its core attention (trainer/model/attention.py).

Initialization: every parameter is drawn at its full (TP=1) shape from a generator seeded by the run seed and
the parameter's global name (which carries the global layer number), then this rank keeps its TP shard. The same
seed therefore gives the same full model at any (TP, PP, DP), and runs at different layouts match step for step.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
from megatron.core.transformer import TransformerConfig

from trainer.config import TrainConfig
from trainer.device import device_type
from trainer.model import attention
from trainer.model.flops import Kernels

try:
    import transformer_engine  # noqa: F401

    HAVE_TRANSFORMER_ENGINE = True
except ImportError:
    HAVE_TRANSFORMER_ENGINE = False


def transformer_config(cfg: TrainConfig, device: str) -> TransformerConfig:
    """megatron-core's TransformerConfig for `cfg` (the GPU fast path's keys by their megatron-core names;
    trainer/config/checks.py has refused those this device cannot run before this is called)."""
    m, p = cfg.model, cfg.parallel
    fused = device == "cuda" and HAVE_TRANSFORMER_ENGINE  # megatron's fused kernels need CUDA
    recompute = {"none": {}, "selective": {"recompute_granularity": "selective"}}.get(
        p.recompute,
        {
            "recompute_granularity": "full",
            "recompute_method": p.recompute_method,
            "recompute_num_layers": p.recompute_num_layers,
        },
    )
    return TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.query_groups,
        kv_channels=m.kv_channels,
        normalization="RMSNorm",
        layernorm_epsilon=m.norm_epsilon,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=m.init_method_std,
        # Megatron's own init also tags TP-split weights (grad norm, checkpoints rely on it); then
        # initialize_parameters() overwrites the values, independent of the layout.
        perform_initialization=True,
        use_cpu_initialization=device == "cpu",
        tensor_model_parallel_size=p.tensor_model_parallel_size,
        pipeline_model_parallel_size=p.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=_virtual_stages(cfg),
        sequence_parallel=p.sequence_parallel,
        context_parallel_size=p.context_parallel_size,
        # The ring exchange of keys and values (overlapped with attention), megatron-LM's default --cp-comm-type.
        cp_comm_type="p2p" if p.context_parallel_size > 1 else None,
        tp_comm_overlap=p.tp_comm_overlap,
        bf16=cfg.precision == "bf16",
        params_dtype=torch.float32,  # Float16Module casts after initialization; the optimizer keeps fp32 masters
        pipeline_dtype=torch.bfloat16 if cfg.precision == "bf16" else torch.float32,
        bias_activation_fusion=fused,
        masked_softmax_fusion=fused,
        bias_dropout_fusion=fused,
        apply_rope_fusion=fused,
        persist_layer_norm=fused,
        gradient_accumulation_fusion=cfg.fusion.gradient_accumulation_fusion,
        cross_entropy_loss_fusion=cfg.fusion.cross_entropy_loss_fusion,
        cross_entropy_fusion_impl="te",
        fp8=cfg.fp8.format,
        fp8_recipe=cfg.fp8.recipe,
        deallocate_pipeline_outputs=True,
        calculate_per_token_loss=True,  # loss per token of the global batch (trainer/engines/megatron.py)
        **recompute,
    )


def _virtual_stages(cfg: TrainConfig) -> int | None:
    vp = cfg.parallel.virtual_pipeline_model_parallel_size
    return vp if vp > 1 else None


@dataclass(frozen=True)
class Built:
    """This rank's model chunks (one per virtual pipeline stage), their megatron config, the padded vocabulary."""

    chunks: list[GPTModel]
    config: TransformerConfig
    padded_vocab_size: int


def build(cfg: TrainConfig) -> Built:
    """The one model recipe every path uses (both engines, score, conversions, checkpoint readers): pad the
    vocabulary, configure megatron-core for this device, build this rank's chunks, initialize them from the seed.
    cfg.model.vocab_size must be set (trainer.data.tokenizer.resolved_model fills it from the tokenizer)."""
    m = cfg.model
    assert m.vocab_size is not None, "build needs resolved_model's vocabulary"
    padded_vocab_size = m.padded_vocab_size(m.vocab_size)
    config = transformer_config(cfg, device_type())
    return Built(build_model(cfg, config, padded_vocab_size), config, padded_vocab_size)


def build_model(
    cfg: TrainConfig, config: TransformerConfig, padded_vocab_size: int, attention_backend: str | None = None
) -> list[GPTModel]:
    """This rank's model chunks (one per virtual pipeline stage), initialized from the seed; attention_backend
    (trainer/model/attention.py) overrides the automatic choice, for parity tests against megatron's unfused one."""
    backend = attention_backend or core_attention(config)
    spec = (
        get_gpt_layer_with_transformer_engine_spec()
        if backend == attention.TRANSFORMER_ENGINE
        else attention.layer_spec(backend)
    )
    vp = _virtual_stages(cfg)
    chunks = []
    for vp_stage in range(vp or 1):
        stage = vp_stage if vp else None
        chunk = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=padded_vocab_size,
            max_sequence_length=cfg.data.seq_length,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
            share_embeddings_and_output_weights=cfg.model.share_embeddings_and_output_weights,
            position_embedding_type="rope",
            rotary_base=cfg.model.rotary_base,
            rope_scaling=cfg.model.rope_scaling_factor is not None,
            rope_scaling_factor=cfg.model.rope_scaling_factor or 1.0,  # 1.0: unused without rope_scaling
            vp_stage=stage,
        )
        initialize_parameters(chunk, cfg)
        chunks.append(chunk)
    return chunks


def core_attention(config: TransformerConfig) -> str:
    """The core attention this model uses (trainer/model/attention.py): TransformerEngine's, else torch SDPA."""
    device = "cpu" if config.use_cpu_initialization else "cuda"
    return attention.core_attention_backend(device, HAVE_TRANSFORMER_ENGINE)


def attention_note(device: str) -> str:
    """The run's first-lines note naming its core attention kernel."""
    return attention.describe(attention.core_attention_backend(device, HAVE_TRANSFORMER_ENGINE))


def planner_kernels(device: str) -> Kernels:
    """The planner's name (trainer/plan/memory.py) for the layers a run on `device` builds."""
    return attention.PLANNER_KERNELS[attention.core_attention_backend(device, HAVE_TRANSFORMER_ENGINE)]


def global_name(chunk: GPTModel, name: str) -> str:
    """A parameter's name with its global layer number, the same at any pipeline layout."""
    match = re.match(r"decoder\.layers\.(\d+)\.(.*)", name)
    if match is None:
        return name
    layer = chunk.decoder.layers[int(match.group(1))]
    return f"decoder.layers.{layer.layer_number - 1}.{match.group(2)}"


# TransformerEngine's spec fuses each norm into the next linear; the local spec's names are the full weights'.
_LOCAL_SPEC_NAME = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}


def full_weight_name(chunk: GPTModel, name: str, tied: bool) -> str:
    """The full (TP=1, one-stage, local-spec) weight a parameter holds a shard of; see trainer/model/weights.py."""
    if name == "output_layer.weight" and tied:
        return "embedding.word_embeddings.weight"  # the last stage's copy of a tied embedding
    return local_spec_name(global_name(chunk, name))


def local_spec_name(name: str) -> str:
    """A whole model's parameter name under the local spec: TransformerEngine's fused norm names mapped back."""
    for fused, local in _LOCAL_SPEC_NAME.items():
        name = re.sub(rf"\.{re.escape(fused)}$", f".{local}", name)
    return name


# The dimension along which megatron-core splits each Llama weight over TP ranks; None: replicated.
# (TransformerEngine fuses the norms into the next linear as `layer_norm_weight`.)
_TP_DIM = {
    "embedding.word_embeddings.weight": 0,
    "output_layer.weight": 0,
    "self_attention.linear_qkv.weight": 0,
    "self_attention.linear_proj.weight": 1,
    "mlp.linear_fc1.weight": 0,
    "mlp.linear_fc2.weight": 1,
    "input_layernorm.weight": None,
    "pre_mlp_layernorm.weight": None,
    "self_attention.linear_qkv.layer_norm_weight": None,
    "mlp.linear_fc1.layer_norm_weight": None,
    "final_layernorm.weight": None,
}


def tp_dim(name: str) -> int | None:
    """The TP split dimension of a parameter, by its (local or global) name."""
    short = re.sub(r"^(decoder\.layers\.\d+\.|decoder\.)", "", name)
    if short not in _TP_DIM:
        raise KeyError(
            f"parameter {name!r} is not part of the Llama layout this trainer knows ({', '.join(_TP_DIM)})"
        )
    return _TP_DIM[short]


def tp_shard(full: torch.Tensor, name: str) -> torch.Tensor:
    """This TP rank's part of a full (TP=1) tensor, laid out as megatron-core lays it out."""
    dim = tp_dim(name)
    if dim is None:
        return full
    rank = parallel_state.get_tensor_model_parallel_rank()
    size = parallel_state.get_tensor_model_parallel_world_size()
    if name.endswith("linear_fc1.weight"):
        # SwiGLU's fused fc1 holds [gate; up]; each TP rank stores [its gate rows; its up rows].
        return torch.cat([half.chunk(size, dim)[rank] for half in full.chunk(2, dim)], dim)
    # linear_qkv is grouped per query group, so whole groups form a contiguous slice too.
    return full.chunk(size, dim)[rank]


def _full_shape(name: str, param: torch.nn.Parameter) -> list[int]:
    shape = list(param.shape)
    dim = tp_dim(name)
    if dim is not None:
        shape[dim] *= parallel_state.get_tensor_model_parallel_world_size()
    return shape


@torch.no_grad()
def initialize_parameters(chunk: GPTModel, cfg: TrainConfig) -> None:
    """Llama initialization: N(0, std), output projections scaled by 1/sqrt(2 x layers), norms at one."""
    std = cfg.model.init_method_std
    for name, param in chunk.named_parameters():
        key = full_weight_name(chunk, name, cfg.model.share_embeddings_and_output_weights)
        if tp_dim(name) is None:  # the norms
            param.fill_(1.0)
            continue
        scale = (
            std / math.sqrt(2 * cfg.model.num_layers)
            if re.search(r"linear_(proj|fc2)\.weight$", name)
            else std
        )
        generator = torch.Generator(device=param.device).manual_seed(_seed_for(cfg.seed, key))
        full = torch.empty(_full_shape(name, param), device=param.device).normal_(
            0.0, scale, generator=generator
        )
        param.copy_(tp_shard(full, name))


def _seed_for(seed: int, key: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{key}".encode()).digest()[:8], "little") >> 1
