"""Step time of a training layout on a cluster: compute, the pipeline bubble, and communication.

A first-order model (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", sections 2-3), with every assumption in `Assumptions` and printed with each plan:
- compute: the slowest pipeline stage's FLOPs per micro-batch (its layers over TP, the output layer on the last
  stage; forward, backward = 2 x forward, plus what recompute repeats) at `matmul_efficiency` of the catalog's
  dense bf16 peak;
- tensor parallelism: per layer and micro-batch, two collectives of the activations in forward and two in
  backward (all-reduces, or all-gather + reduce-scatter of the same volume under sequence parallelism), two more
  when full recompute repeats the forward, as NCCL rings over NVLink: 2 (t-1)/t x bytes / bandwidth; not
  overlapped with compute;
- pipeline: 1F1B's idle time is (p-1) micro-batch times, (p-1)/v with v interleaved chunks, so the bubble is
  (p-1)/(m+p-1) of the step, (p-1)/(v m + p-1) interleaved (Narayanan's (p-1)/m and (p-1)/(v m) of the ideal
  time); each chunk sends its activations forward and their gradient back, over NVLink when neighbouring stages
  share a node and over EFA otherwise;
- data parallelism: per step, a reduce-scatter of the fp32 gradient buffer and an all-gather of the bf16 weights
  (distributed optimizer), or an all-reduce of the gradients, as rings over the group. Megatron orders ranks TP
  first, then DP, then PP: a DP group inside one node runs over NVLink; across nodes each of its k ranks per node
  drives its GPU's share of the node's EFA bandwidth (bus bandwidth = k x network / GPUs per node; two p5 nodes,
  k = 8: 400 GB/s, and nccl-tests measure about 390 GB/s at 512 MB). With `overlap_grad_reduce` the
  reduce-scatter hides behind the last micro-batch's backward; the all-gather is not overlapped;
- DeepSpeed ZeRO (`engine: deepspeed`, TP = PP = 1; Rajbhandari et al. 2020, section 7): gradients and weights
  travel in the compute precision, none of it overlapped. Stage 1 reduce-scatters the gradients and all-gathers
  the updated weights once a step (megatron's distributed optimizer's volume); stage 2 reduce-scatters every
  micro-batch's gradients, as it keeps only its shard; stage 3 also all-gathers the weights in every micro-batch's
  forward and again in its backward (1.5x data parallelism's volume at one micro-batch). ZeRO-Offload copies the
  gradient shard (fp32) to the host and the updated weight shard back over PCIe and steps Adam on the host's
  cores; offloaded weights cross PCIe in every forward and backward;
- the GPU fast path (docs/trainer.md): FP8 (`fp8.format`) runs the layers' weight GEMMs at
  `fp8_matmul_efficiency` of the catalog's dense FP8 peak, attention and the output layer stay bf16;
  `parallel.overlap_param_gather` hides the weight all-gather behind the first micro-batch's forward;
  `parallel.tp_comm_overlap` hides `tp_overlap_hidden` of the TP collectives, at most the GEMMs' time; context
  parallelism (CP ranks split every sequence) divides a micro-batch's compute and activations by CP and adds
  the ring exchange of keys and values (forward: CP-1 sends of each rank's K,V; backward: K,V again and their
  gradients), which TransformerEngine's attention overlaps with the attention compute: only what exceeds it
  counts. Megatron orders ranks TP, CP, DP, PP: a CP group is in one node while TP x CP fits in it. DP reduces
  gradients over DP x CP ranks (megatron's data-parallel group with context parallelism);
- partial recompute (`recompute_method: block`, N layers of each chunk) repeats only those layers' forward;
- left out: the optimizer step (memory-bound, milliseconds), data loading, kernel launch gaps, stragglers, and
  the SMs that overlapped communication takes from compute.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config import ParallelDims, TrainConfig
from trainer.contract.catalog import InstanceType
from trainer.model.flops import forward_flops_per_sequence, model_flops_per_sequence

FP32 = 4


@dataclass(frozen=True)
class Assumptions:
    matmul_efficiency: float = 0.6  # of the dense bf16 peak that a layer's GEMMs and attention kernels reach
    nvlink_efficiency: float = 0.7  # of the catalog's per-GPU NVLink bandwidth that NCCL rings reach
    network_efficiency: float = 0.7  # of the per-GPU share of the instance's EFA bandwidth
    memory_usable_fraction: float = 0.9  # of GPU memory for tensors; the CUDA context, NCCL and fragmentation
    pcie_gbytes_per_s: float = 25.0  # host <-> GPU copies of ZeRO-Offload (PCIe Gen4 x16 in practice)
    host_adam_gparams_per_s: float = (
        1.0  # DeepSpeed's CPU Adam, billions of parameters a second per GPU's cores
    )
    fp8_matmul_efficiency: float = 0.45  # of the dense FP8 peak that FP8 weight GEMMs reach (with the casts)
    tp_overlap_hidden: float = (
        0.8  # share of TP collectives that userbuffer overlap hides (at most the GEMMs)
    )

    def lines(self) -> list[str]:
        return [
            f"compute at {self.matmul_efficiency:.0%} of the dense bf16 peak; recompute adds its FLOPs",
            f"tensor-parallel collectives over NVLink at {self.nvlink_efficiency:.0%} of the catalog's per-GPU "
            "bandwidth, not overlapped with compute unless parallel.tp_comm_overlap",
            f"data-parallel and inter-node pipeline traffic over EFA at {self.network_efficiency:.0%} of each "
            "GPU's share of the instance's bandwidth",
            "the gradient reduce-scatter hides behind the last micro-batch's backward only with "
            "parallel.overlap_grad_reduce; the weight all-gather only with parallel.overlap_param_gather",
            f"DeepSpeed ZeRO-Offload: PCIe at {self.pcie_gbytes_per_s:g} GB/s per GPU, the host's Adam at "
            f"{self.host_adam_gparams_per_s:g} B parameters/s per GPU",
            f"fits: the memory estimate is at most {self.memory_usable_fraction:.0%} of the GPU's memory (and "
            "ZeRO-Offload's host memory of its share of the node's)",
            f"FP8: weight GEMMs at {self.fp8_matmul_efficiency:.0%} of the dense FP8 peak, attention and "
            "logits in bf16; MFU stays against the dense bf16 peak",
            f"parallel.tp_comm_overlap hides {self.tp_overlap_hidden:.0%} of the TP collectives (at most the GEMMs' "
            "time); parallel.overlap_param_gather hides the weight all-gather behind the first forward",
            "context parallelism: the K,V ring is hidden behind attention compute, only the excess counts",
            "not counted: the optimizer step, data loading, kernel launch gaps, stragglers, SMs taken by overlap",
        ]


@dataclass(frozen=True)
class StepTime:
    compute_s: float  # the slowest stage's micro-batches, back to back
    tensor_parallel_s: float
    pipeline_p2p_s: float
    bubble_s: float
    data_parallel_s: float  # exposed part
    bubble_fraction: float
    tokens_per_s: float
    mfu: float
    context_parallel_s: float = 0.0  # the exposed part of the K,V ring
    hidden_s: float = 0.0  # communication that overlap hid behind compute (not in total_s)

    @property
    def total_s(self) -> float:
        return (
            self.compute_s
            + self.tensor_parallel_s
            + self.pipeline_p2p_s
            + self.bubble_s
            + self.data_parallel_s
            + self.context_parallel_s
        )


def ring_seconds(bytes_per_rank: float, ranks: int, gbytes_per_s: float, passes: int = 1) -> float:
    """An NCCL ring reduce-scatter or all-gather (passes=1), or all-reduce (passes=2), at a bus bandwidth."""
    if ranks == 1:
        return 0.0
    return passes * (ranks - 1) / ranks * bytes_per_rank / (gbytes_per_s * 1e9)


def network_gbytes_per_s_per_gpu(instance: InstanceType) -> float:
    return instance.network_gbps / 8 / instance.gpus


def estimate_step_time(
    cfg: TrainConfig,
    instance: InstanceType,
    nodes: int,
    padded_vocab_size: int,
    parameters_per_gpu: int,
    assumptions: Assumptions,
) -> StepTime:
    p, s, m = cfg.parallel, cfg.schedule, cfg.model
    dims = ParallelDims.from_config(p, nodes * instance.gpus)
    tp, pp, vp, cp, dp = dims.tp, dims.pp, dims.vp, dims.cp, dims.dp
    micro_batches = dims.micro_batches(s.global_batch_size, s.micro_batch_size)
    seq = cfg.data.seq_length
    activation_bytes = 2 if cfg.precision == "bf16" else FP32
    layers_per_stage = m.num_layers // pp

    # Compute: the last stage (its layers and the output layer) is the slowest; CP splits every sequence.
    forward = forward_flops_per_sequence(m, seq, padded_vocab_size)
    bf16_rate = instance.peak_bf16_tflops_per_gpu * 1e12 * assumptions.matmul_efficiency
    fp8 = cfg.fp8.format is not None and instance.peak_fp8_tflops_per_gpu > 0
    dense_rate = (
        instance.peak_fp8_tflops_per_gpu * 1e12 * assumptions.fp8_matmul_efficiency if fp8 else bf16_rate
    )
    split = s.micro_batch_size / (tp * cp)  # sequences of a micro-batch, per GPU
    dense_s = forward.dense / pp * split / dense_rate  # one forward of the stage's weight GEMMs
    attention_s = forward.attention / pp * split / bf16_rate
    logits_s = forward.logits * split / bf16_rate
    recomputed = recomputed_fraction(cfg)
    repeated = {"none": 0.0, "selective": attention_s, "full": recomputed * (dense_s + attention_s)}[
        p.recompute
    ]
    micro_batch_compute = 3 * (dense_s + attention_s + logits_s) + repeated

    network = network_gbytes_per_s_per_gpu(instance) * assumptions.network_efficiency
    # Single-GPU types have no NVLink; their one GPU never talks inside the node anyway.
    nvlink = instance.nvlink_gbytes_per_s * assumptions.nvlink_efficiency or network
    activations = s.micro_batch_size * seq / cp * m.hidden_size * activation_bytes
    collectives_per_layer = 4 + (2 * recomputed if p.recompute == "full" else 0)
    micro_batch_tp = collectives_per_layer * layers_per_stage * ring_seconds(activations, tp, nvlink, 2)
    tp_hidden = 0.0
    if p.tp_comm_overlap:
        tp_hidden = min(assumptions.tp_overlap_hidden * micro_batch_tp, 3 * dense_s)
        micro_batch_tp -= tp_hidden

    # Context parallelism: per layer, the K,V ring (forward) and K,V plus their gradients (backward), hidden
    # behind that layer's attention (forward + backward = 3 x its forward).
    micro_batch_cp = cp_hidden = 0.0
    if cp > 1:
        d = m.kv_channels or m.hidden_size // m.num_attention_heads
        kv_chunk = 2 * s.micro_batch_size * seq / cp * m.query_groups / tp * d * activation_bytes
        cp_bandwidth = nvlink if tp * cp <= instance.gpus else network
        ring = 3 * (cp - 1) * kv_chunk / (cp_bandwidth * 1e9) * layers_per_stage
        cp_hidden = min(ring, 3 * attention_s)
        micro_batch_cp = ring - cp_hidden

    # Pipeline neighbours are TP x CP x DP ranks apart: on another node once that reaches a node's GPUs.
    p2p_bandwidth = network if tp * cp * dp >= instance.gpus else nvlink
    sent = activations / (tp if p.sequence_parallel else 1)
    pipeline_p2p = 2 * micro_batches * vp * sent / (p2p_bandwidth * 1e9) if pp > 1 else 0.0
    micro_batch = micro_batch_compute + micro_batch_tp + micro_batch_cp
    bubble = (pp - 1) / vp * micro_batch

    # Data parallelism (gradients over DP x CP ranks): a group has min(DP x CP, GPUs per node / TP) per node.
    replicas = dp * cp
    ranks_per_node = min(replicas, instance.gpus // tp)
    dp_bandwidth = nvlink if ranks_per_node == replicas else min(nvlink, ranks_per_node * network)
    if cfg.engine == "deepspeed":
        reduce, gather = (
            zero_seconds(cfg, parameters_per_gpu, dp, dp_bandwidth, micro_batches, assumptions),
            0.0,
        )
    elif p.use_distributed_optimizer:
        reduce = ring_seconds(FP32 * parameters_per_gpu, replicas, dp_bandwidth)
        gather = ring_seconds(activation_bytes * parameters_per_gpu, replicas, dp_bandwidth)
    else:
        reduce, gather = ring_seconds(FP32 * parameters_per_gpu, replicas, dp_bandwidth, 2), 0.0
    dp_hidden = 0.0
    if p.overlap_grad_reduce:
        dp_hidden += min(reduce, 2 / 3 * micro_batch_compute)  # the last micro-batch's backward
        reduce -= min(reduce, 2 / 3 * micro_batch_compute)
    if p.overlap_param_gather:
        dp_hidden += min(gather, 1 / 3 * micro_batch_compute)  # the first micro-batch's forward
        gather -= min(gather, 1 / 3 * micro_batch_compute)
    data_parallel = reduce + gather

    compute = micro_batches * micro_batch_compute
    total = (
        compute + micro_batches * (micro_batch_tp + micro_batch_cp) + pipeline_p2p + bubble + data_parallel
    )
    model_flops = model_flops_per_sequence(m, seq, padded_vocab_size) * s.global_batch_size
    return StepTime(
        compute_s=compute,
        tensor_parallel_s=micro_batches * micro_batch_tp,
        pipeline_p2p_s=pipeline_p2p,
        bubble_s=bubble,
        data_parallel_s=data_parallel,
        bubble_fraction=bubble_fraction(pp, vp, micro_batches),
        tokens_per_s=s.global_batch_size * seq / total,
        mfu=model_flops / (total * dims.world_size * instance.peak_bf16_tflops_per_gpu * 1e12),
        context_parallel_s=micro_batches * micro_batch_cp,
        hidden_s=micro_batches * (tp_hidden + cp_hidden) + dp_hidden,
    )


def recomputed_fraction(cfg: TrainConfig) -> float:
    """The share of a chunk's layers that full recompute repeats: all with `uniform`, N of them with `block`."""
    p, m = cfg.parallel, cfg.model
    if p.recompute != "full" or p.recompute_method == "uniform":
        return 1.0 if p.recompute == "full" else 0.0
    layers_per_chunk = m.num_layers // (
        p.pipeline_model_parallel_size * p.virtual_pipeline_model_parallel_size
    )
    return min(p.recompute_num_layers, layers_per_chunk) / layers_per_chunk


def zero_seconds(
    cfg: TrainConfig,
    parameters: int,
    data_parallel_size: int,
    bandwidth: float,
    micro_batches: int,
    assumptions: Assumptions,
) -> float:
    """ZeRO's data-parallel traffic and offload copies in one step (see the module's docstring)."""
    z, dp = cfg.zero, data_parallel_size
    weights = (2 if cfg.precision == "bf16" else FP32) * parameters
    collective = ring_seconds(weights, dp, bandwidth)
    passes = {1: 2, 2: micro_batches + 1, 3: 3 * micro_batches}[z.stage]
    seconds = passes * collective
    pcie = assumptions.pcie_gbytes_per_s * 1e9
    if z.offload_optimizer == "cpu":
        seconds += (FP32 * parameters + weights) / dp / pcie
        seconds += parameters / dp / (assumptions.host_adam_gparams_per_s * 1e9)
    if z.offload_param == "cpu":
        seconds += 2 * micro_batches * weights / dp / pcie
    return seconds


def bubble_fraction(pipeline_stages: int, virtual_stages: int, micro_batches: int) -> float:
    """The share of a step a pipeline rank idles: (p-1)/(m+p-1) for 1F1B, (p-1)/(v m + p-1) interleaved."""
    p, v, m = pipeline_stages, virtual_stages, micro_batches
    return (p - 1) / (v * m + p - 1)
