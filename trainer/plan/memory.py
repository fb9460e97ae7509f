"""Per-GPU memory of a training layout, as this trainer allocates it (what `torch.cuda.max_memory_allocated`
reports at the steady-state peak: from the second step on, when Adam's states exist).

Model states, per parameter held by the GPU (trainer/distributed/parallel.py, trainer/distributed/optimizer.py):
- weights in the compute precision: bf16 (megatron's Float16Module casts the fp32-initialized model), or fp32;
- gradients in megatron DDP's fp32 buffer (`grad_reduce_in_fp32=True`), whole on every data-parallel rank;
- optimizer states: Adam's two fp32 moments, plus fp32 master weights when the weights are bf16 (fp32 weights
  are their own masters); the distributed optimizer shards all of it over the data-parallel ranks (ZeRO-1).
`model_states()` is the one place that maps an engine's configuration to those bytes. `engine: deepspeed` follows
the ZeRO paper's accounting (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", section 5): weights and gradients in the compute precision (2 bytes in bf16), and 12 bytes of
optimizer state (fp32 masters, which ZeRO keeps even for fp32 weights, and Adam's two moments); stage 1 shards
the optimizer states over the N data-parallel ranks (2 + 2 + 12/N), stage 2 the gradients too (2 + 14/N), stage
3 the weights too (16/N). `zero.offload_optimizer: cpu` (ZeRO-Offload, Ren et al. 2021) moves the optimizer
states and the gradients (reduced, then kept as the fp32 partition the host's Adam steps from, 4/N) to host
memory, `zero.offload_param: cpu` the weight shards: the GPU keeps none of them, only the reduce buckets of
stage 2 and 3 (DeepSpeed's default reduce_bucket_size, 5e8 elements in the compute precision). ZeRO-3 gathers each layer's weights whole while it runs: the largest layer (or the embedding),
twice (the one running and the one prefetched), is a working set on every GPU.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"):
per layer, the tensors autograd saves for backward, adapted to this Llama (RMSNorm, SwiGLU, grouped-query
attention, rotary positions, no dropout, so no dropout masks) and to the kernels that run:
- "transformer_engine" (GPUs; the image ships TransformerEngine): RMSNorm fused into the next linear, flash
  attention (no s x s matrix; fp32 softmax statistics instead), fused SwiGLU;
- "local" (megatron-core's plain-torch layer spec with torch SDPA as its core attention, trainer/model/attention.py:
  CPUs, or GPUs without TransformerEngine): unfused RMSNorm keeping fp32 copies, flash-style attention (query and
  key after rotary embeddings, the whole linear_qkv output that value is a view of, its output and fp32 log-sum-exp
  per head; no s x s matrix), SwiGLU's intermediates,
  torch's single-tensor AdamW (two fp32 temporaries of the largest parameter during the step);
- "local-unfused" (the same spec with megatron-core's DotProductAttention, for comparison): attention scores
  materialized (fp32 softmax and bf16 probabilities) in a kept buffer, keys and values repeated to every head.
The pipeline keeps several micro-batches in flight: 1F1B's first stage holds min(PP, m) of them, the interleaved
schedule's first rank min(v m, 2 (PP - 1) + (v - 1) PP + 1) model chunks (megatron-core's warm-up counts). Full
recompute keeps only each layer's input and rebuilds one layer's activations at a time during backward. The last
stage also holds one micro-batch's logits: the bf16 output and the fp32 copy that the vocab-parallel cross
entropy turns into its saved softmax, 6 bytes per token per vocabulary entry over TP.
The GPU fast path (docs/trainer.md): context parallelism gives each GPU 1/CP of every sequence's tokens (and
their activations and logits), and the distributed optimizer shards over DP x CP ranks; FP8 (TransformerEngine,
weights kept in bf16) saves the inputs of the weight GEMMs as FP8 (1 byte) and keeps an FP8 copy of each layer
weight in both layouts the GEMMs need (2 bytes per layer parameter); partial recompute (`recompute_method: block`,
N layers of each chunk) keeps the input of those N layers and every activation of the rest, `uniform` with N
keeps one input per group of N layers and rebuilds a whole group at a time.
Left out as small: rotary tables, token ids and loss masks, bucket padding, communication buffers (the K,V ring
of context parallelism, TransformerEngine's userbuffers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trainer.config import ParallelDims, TrainConfig
from trainer.model.flops import Kernels, ParameterCounts, parameter_counts

FP32 = 4
REDUCE_BUCKET_ELEMENTS = 5e8  # DeepSpeed's default zero_optimization.reduce_bucket_size


@dataclass(frozen=True)
class StateBytes:
    """Bytes on one GPU per parameter that the GPU's model chunks hold, and in host memory (ZeRO-Offload)."""

    weights: float
    gradients: float
    optimizer: float
    host: float = 0.0


def model_states(cfg: TrainConfig, data_parallel_size: int) -> StateBytes:
    """Megatron: DDP with fp32 gradient buffers, and its (optionally distributed) mixed-precision Adam.
    DeepSpeed: ZeRO's sharding by stage, and its offload to host memory."""
    weight_bytes = 2 if cfg.precision == "bf16" else FP32
    if cfg.engine == "deepspeed":
        return zero_states(cfg, data_parallel_size, weight_bytes)
    masters = FP32 if cfg.precision == "bf16" else 0
    shards = data_parallel_size if cfg.parallel.use_distributed_optimizer else 1
    return StateBytes(weights=weight_bytes, gradients=FP32, optimizer=(masters + 2 * FP32) / shards)


def zero_states(cfg: TrainConfig, data_parallel_size: int, weight_bytes: int) -> StateBytes:
    """ZeRO stage 1/2/3 over N data-parallel ranks: what each GPU keeps, and what offload moves to the host."""
    z, n = cfg.zero, data_parallel_size
    weights = weight_bytes / (n if z.stage == 3 else 1)
    gradients = weight_bytes / (n if z.stage >= 2 else 1)
    optimizer = 3 * FP32 / n  # fp32 masters + Adam's two moments
    host = 0.0
    if z.offload_optimizer == "cpu":
        host += optimizer + FP32 / n  # with the fp32 gradient partition the host's Adam steps from
        optimizer = gradients = 0.0
    if z.offload_param == "cpu":
        host += weights
        weights = 0.0
    return StateBytes(weights=weights, gradients=gradients, optimizer=optimizer, host=host)


@dataclass(frozen=True)
class SavedTensor:
    """One tensor a layer saves for backward, in bytes per token of the micro-batch (before any split)."""

    name: str
    bytes_per_token: float
    split_by: Literal["tp", "sp"]  # "tp": always split over TP; "sp": only under sequence parallelism


def saved_per_layer(cfg: TrainConfig, kernels: Kernels) -> list[SavedTensor]:
    """What one transformer layer keeps for backward per token, with `parallel.recompute` applied
    (full recompute is handled by the caller: a layer then keeps only its input)."""
    m, s = cfg.model, cfg.data.seq_length
    h, a, g, ffn = m.hidden_size, m.num_attention_heads, m.query_groups, m.ffn_hidden_size
    d = m.kv_channels or h // a
    e = 2 if cfg.precision == "bf16" else FP32  # activation bytes
    selective = cfg.parallel.recompute == "selective"
    if kernels == "transformer_engine":
        gemm_input = 1 if cfg.fp8.format is not None else e  # FP8 GEMMs save their input quantized
        norm = [
            SavedTensor("norm input", e * h, "sp"),
            SavedTensor("norm 1/rms (fp32)", FP32, "sp"),
            SavedTensor("normalized input of the next linear", gemm_input * h, "sp"),
        ]
        attention = [
            SavedTensor("query, key, value", e * d * (a + 2 * g), "tp"),
            SavedTensor("attention output (the projection's input)", gemm_input * d * a, "tp"),
        ]
        if not selective:  # recomputing core attention drops flash attention's saved statistics
            attention.append(SavedTensor("softmax log-sum-exp (fp32)", FP32 * a, "tp"))
        mlp = [
            SavedTensor("SwiGLU input (FC1 output; fused kernel)", e * 2 * ffn, "tp"),
            SavedTensor("FC2 input", gemm_input * ffn, "tp"),
        ]
    else:
        norm = [
            SavedTensor("norm input, fp32 copy", FP32 * h, "sp"),
            SavedTensor("norm 1/rms (fp32)", FP32, "sp"),
            SavedTensor("normalized input, fp32", FP32 * h, "sp"),
            SavedTensor("normalized input of the next linear", e * h, "sp"),
        ]
        if selective:  # core attention recomputed: its checkpoint keeps query and the grouped key, value
            attention = [SavedTensor("query, key, value", e * d * (a + 2 * g), "tp")]
        elif kernels == "local":
            # SDPA's flash backward reads query, key, value, out, logsumexp (torch 2.13's schema of
            # aten::_scaled_dot_product_flash_attention_backward, and of its _for_cpu and cudnn variants)
            # Value is a view of linear_qkv's output (megatron-core 0.16.1 transformer/attention.py
            # get_query_key_value_tensors splits it), so that whole output stays; rotary made query and key anew.
            attention = [
                SavedTensor("query and key after rotary embeddings", e * d * (a + g), "tp"),
                SavedTensor("linear_qkv output (value is a view of it)", e * d * (a + 2 * g), "tp"),
                SavedTensor("SDPA output (kept for its backward)", e * d * a, "tp"),
                SavedTensor("softmax log-sum-exp (fp32)", FP32 * a, "tp"),
            ]
        else:
            attention = [
                SavedTensor("query, key and value repeated to every head", 3 * e * d * a, "tp"),
                SavedTensor("softmax output (fp32)", FP32 * a * s, "tp"),
            ]
            if e != FP32:
                attention.append(SavedTensor("attention probabilities", e * a * s, "tp"))
        attention.append(SavedTensor("attention output (the projection's input)", e * d * a, "tp"))
        mlp = [
            SavedTensor("FC1 output (gate and up)", e * 2 * ffn, "tp"),
            SavedTensor("silu(gate) and up + offset", e * 2 * ffn, "tp"),
            SavedTensor("FC2 input", e * ffn, "tp"),
        ]
    return [*norm, *attention, *norm, *mlp]


# The moments of a step whose peaks an estimate compares.
Moment = Literal["loss", "backward", "optimizer step"]


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes at the steady-state peak of one pipeline rank's GPU, and the moment of the step it falls in."""

    pipeline_rank: int
    moment: Moment
    parameters: int  # held by this GPU (its TP shard of its stages)
    weights: float
    gradients: float
    optimizer_states: float
    workspace: float  # kept between steps: the unfused attention's score buffer
    activations: float  # saved for backward by every micro-batch in flight
    logits: float  # at the loss: one micro-batch's bf16 logits and fp32 softmax
    transient: float  # in backward: gradients being formed (and full recompute's rebuilt layer); in the step: temporaries
    host: float = (
        0.0  # in host memory for this GPU: ZeRO-Offload's optimizer states and weights (not in total)
    )

    @property
    def states(self) -> float:
        return self.weights + self.gradients + self.optimizer_states

    @property
    def total(self) -> float:
        return self.states + self.workspace + self.activations + self.logits + self.transient


def in_flight_chunks(cfg: TrainConfig, pipeline_rank: int, num_microbatches: int) -> int:
    """Model chunks whose activations a pipeline rank holds at once (megatron-core's 1F1B warm-up + 1)."""
    pp, vp = cfg.parallel.pipeline_model_parallel_size, cfg.parallel.virtual_pipeline_model_parallel_size
    if pp == 1:
        return 1
    if vp == 1:
        return min(pp - pipeline_rank, num_microbatches)
    warmup = 2 * (pp - pipeline_rank - 1) + (vp - 1) * pp
    return min(warmup + 1, num_microbatches * vp)


def stage_parameters(counts: ParameterCounts, cfg: TrainConfig, pipeline_rank: int) -> int:
    """Parameters on one GPU of a pipeline rank: its layers' TP shards, replicated norms, embedding, output."""
    tp = cfg.parallel.tensor_model_parallel_size
    pp = cfg.parallel.pipeline_model_parallel_size
    layers = counts.num_layers // pp
    params = layers * ((counts.layer - counts.layer_norms) / tp + counts.layer_norms)
    if pipeline_rank == 0:
        params += counts.embedding / tp
    if pipeline_rank == pp - 1:
        params += counts.final_norm
        tied_copy = counts.embedding if pp > 1 and counts.output_layer == 0 else 0
        params += (counts.output_layer + tied_copy) / tp
    return round(params)


def estimate_stages(
    cfg: TrainConfig, world_size: int, padded_vocab_size: int, kernels: Kernels
) -> list[MemoryEstimate]:
    """The steady-state peak of every pipeline rank's GPUs (all TP and DP ranks of a stage are alike): the
    largest of three moments, the loss (last stage), the first layer of a backward, and the optimizer step."""
    p, s, m = cfg.parallel, cfg.schedule, cfg.model
    dims = ParallelDims.from_config(p, world_size)
    tp, pp, vp, cp, dp = dims.tp, dims.pp, dims.vp, dims.cp, dims.dp
    sp = tp if p.sequence_parallel else 1
    num_microbatches = dims.micro_batches(s.global_batch_size, s.micro_batch_size)
    seq = cfg.data.seq_length
    tokens = s.micro_batch_size * seq / cp  # this GPU's share of the micro-batch's tokens
    e = 2 if cfg.precision == "bf16" else FP32
    heads = m.num_attention_heads / tp
    counts = parameter_counts(m, padded_vocab_size)
    state = model_states(cfg, dp * cp)  # megatron shards over DP x CP (deepspeed runs CP = 1)

    def per_token(saved: list[SavedTensor]) -> float:
        return sum(t.bytes_per_token / (tp if t.split_by == "tp" else sp) for t in saved)

    no_recompute = cfg.model_copy(update={"parallel": p.model_copy(update={"recompute": "none"})})
    layer = per_token(saved_per_layer(cfg, kernels)) * tokens
    rebuilt_layer = per_token(saved_per_layer(no_recompute, kernels)) * tokens
    local = kernels != "transformer_engine"
    scores = kernels == "local-unfused"  # megatron's DotProductAttention forms [b, heads, s, s]
    workspace = 0.0
    backward_working_set = 0.0
    weight_bytes = 2 if cfg.precision == "bf16" else FP32
    if cfg.engine == "deepspeed" and cfg.zero.stage >= 2:
        workspace += min(REDUCE_BUCKET_ELEMENTS, counts.total) * weight_bytes  # gradients reduced in buckets
    if cfg.engine == "deepspeed" and cfg.zero.stage == 3:
        # The gathered weights of the running and the prefetched module: at most a layer or the embedding each.
        workspace += 2 * max(counts.layer, counts.embedding) * weight_bytes
    if scores:
        # Attention scores are formed in megatron's global memory buffer, kept for the next step.
        workspace += s.micro_batch_size * heads * seq**2 * e
        # Softmax backward forms an fp32 gradient the size of the scores.
        backward_working_set = FP32 * s.micro_batch_size * heads * seq**2
        if p.recompute != "full":
            layer += seq**2  # each layer's copy of the causal mask (bool)
    layers_per_chunk = m.num_layers // (pp * vp)
    estimates = []
    for rank in range(pp):
        chunks = in_flight_chunks(cfg, rank, num_microbatches)
        params = stage_parameters(counts, cfg, rank)
        if p.recompute == "full":
            layer_input = e * m.hidden_size / sp * tokens
            n = min(p.recompute_num_layers, layers_per_chunk)
            if p.recompute_method == "block":  # N layers keep their input, the others everything
                activations = chunks * (n * layer_input + (layers_per_chunk - n) * rebuilt_layer)
                in_backward = backward_working_set + rebuilt_layer
            else:  # one input per group of N layers; a group is rebuilt at a time
                activations = chunks * -(-layers_per_chunk // n) * layer_input
                in_backward = backward_working_set + n * rebuilt_layer
        else:
            activations = chunks * layers_per_chunk * layer
            in_backward = backward_working_set
            if local and e != FP32 and (rank > 0 or vp > 1):
                # A received input stays for its backward; the local norm saved an fp32 copy beside it.
                received = chunks if rank > 0 else chunks * (vp - 1) / vp
                activations += received * e * m.hidden_size * tokens
        moments: dict[Moment, tuple[float, float, float]] = {"backward": (activations, 0.0, in_backward)}
        if rank == pp - 1:
            # The output layer's GEMM stays bf16 under FP8: the final norm saves its input unquantized.
            bf16_gemms = cfg.model_copy(update={"fp8": cfg.fp8.model_copy(update={"format": None})})
            final_norm = per_token(saved_per_layer(bf16_gemms, kernels)[: 4 if local else 3]) * tokens
            logits = (FP32 + (e if e != FP32 else 0)) * padded_vocab_size / tp * tokens
            moments["loss"] = (activations + final_norm, logits, 0.0)
        if local and cfg.engine == "deepspeed" and cfg.zero.offload_optimizer == "none":
            # torch's AdamW steps ZeRO's flat fp32 partition: two fp32 temporaries of its size.
            moments["optimizer step"] = (0.0, 0.0, 2 * FP32 * params / dp)
        elif local and cfg.engine == "megatron":
            # torch's single-tensor AdamW: sqrt and divide make two fp32 temporaries of the largest parameter.
            shards = dp if p.use_distributed_optimizer else 1
            moments["optimizer step"] = (0.0, 0.0, 2 * FP32 * _largest_parameter(cfg, rank, counts) / shards)
        moment, (saved, logits, transient) = max(moments.items(), key=lambda item: sum(item[1]))
        fp8_weights = 0.0
        if cfg.fp8.format is not None and kernels == "transformer_engine":
            layer_weights = counts.num_layers // pp * (counts.layer - counts.layer_norms) / tp
            fp8_weights = 2 * layer_weights  # an FP8 copy in each of the two layouts the GEMMs read
        estimates.append(
            MemoryEstimate(
                pipeline_rank=rank,
                moment=moment,
                parameters=params,
                weights=params * state.weights + fp8_weights,
                gradients=params * state.gradients,
                optimizer_states=params * state.optimizer,
                workspace=workspace,
                activations=saved,
                logits=logits,
                transient=transient,
                host=params * state.host,
            )
        )
    return estimates


def _largest_parameter(cfg: TrainConfig, pipeline_rank: int, counts: ParameterCounts) -> float:
    m, tp = cfg.model, cfg.parallel.tensor_model_parallel_size
    d = m.kv_channels or m.hidden_size // m.num_attention_heads
    in_layers = max(
        m.hidden_size * (m.num_attention_heads + 2 * m.query_groups) * d,
        2 * m.hidden_size * m.ffn_hidden_size,
    )
    has_vocab = pipeline_rank in (0, cfg.parallel.pipeline_model_parallel_size - 1)
    return max(in_layers, counts.embedding if has_vocab else 0) / tp


def estimate_memory(
    cfg: TrainConfig, world_size: int, padded_vocab_size: int, kernels: Kernels
) -> MemoryEstimate:
    """The GPU with the highest peak: what must fit."""
    return max(estimate_stages(cfg, world_size, padded_vocab_size, kernels), key=lambda e: e.total)
