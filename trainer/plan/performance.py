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
- left out: the optimizer step (memory-bound, milliseconds), data loading, kernel launch gaps, stragglers.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config import TrainConfig
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

    def lines(self) -> list[str]:
        return [
            f"compute at {self.matmul_efficiency:.0%} of the dense bf16 peak; recompute adds its FLOPs",
            f"tensor-parallel collectives over NVLink at {self.nvlink_efficiency:.0%} of the catalog's per-GPU "
            "bandwidth, not overlapped with compute",
            f"data-parallel and inter-node pipeline traffic over EFA at {self.network_efficiency:.0%} of each "
            "GPU's share of the instance's bandwidth",
            "the gradient reduce-scatter hides behind the last micro-batch's backward only with "
            "parallel.overlap_grad_reduce; the weight all-gather is never hidden",
            f"DeepSpeed ZeRO-Offload: PCIe at {self.pcie_gbytes_per_s:g} GB/s per GPU, the host's Adam at "
            f"{self.host_adam_gparams_per_s:g} B parameters/s per GPU",
            f"fits: the memory estimate is at most {self.memory_usable_fraction:.0%} of the GPU's memory (and "
            "ZeRO-Offload's host memory of its share of the node's)",
            "not counted: the optimizer step, data loading, kernel launch gaps, stragglers",
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

    @property
    def total_s(self) -> float:
        return (
            self.compute_s
            + self.tensor_parallel_s
            + self.pipeline_p2p_s
            + self.bubble_s
            + self.data_parallel_s
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
    tp, pp, vp = (
        p.tensor_model_parallel_size,
        p.pipeline_model_parallel_size,
        p.virtual_pipeline_model_parallel_size,
    )
    world = nodes * instance.gpus
    dp = world // (tp * pp)
    micro_batches = s.global_batch_size // (s.micro_batch_size * dp)
    seq = cfg.data.seq_length
    activation_bytes = 2 if cfg.precision == "bf16" else FP32

    # Compute: the last stage (its layers and the output layer) is the slowest.
    forward = forward_flops_per_sequence(m, seq, padded_vocab_size)
    stage_layers = (forward.dense + forward.attention) / pp
    repeated = {"none": 0.0, "selective": forward.attention / pp, "full": stage_layers}[p.recompute]
    stage_flops = (3 * (stage_layers + forward.logits) + repeated) * s.micro_batch_size / tp
    flops_per_s = instance.peak_bf16_tflops_per_gpu * 1e12 * assumptions.matmul_efficiency
    micro_batch_compute = stage_flops / flops_per_s

    network = network_gbytes_per_s_per_gpu(instance) * assumptions.network_efficiency
    # Single-GPU types have no NVLink; their one GPU never talks inside the node anyway.
    nvlink = instance.nvlink_gbytes_per_s * assumptions.nvlink_efficiency or network
    activations = s.micro_batch_size * seq * m.hidden_size * activation_bytes
    collectives_per_layer = 6 if p.recompute == "full" else 4
    layers_per_stage = m.num_layers // pp
    micro_batch_tp = collectives_per_layer * layers_per_stage * ring_seconds(activations, tp, nvlink, 2)

    # Pipeline neighbours are TP x DP ranks apart: on another node once that reaches a node's GPUs.
    p2p_bandwidth = network if tp * dp >= instance.gpus else nvlink
    sent = activations / (tp if p.sequence_parallel else 1)
    pipeline_p2p = 2 * micro_batches * vp * sent / (p2p_bandwidth * 1e9) if pp > 1 else 0.0
    micro_batch = micro_batch_compute + micro_batch_tp
    bubble = (pp - 1) / vp * micro_batch

    # Data parallelism: a DP group has min(DP, GPUs per node / TP) ranks in each node.
    ranks_per_node = min(dp, instance.gpus // tp)
    dp_bandwidth = nvlink if ranks_per_node == dp else min(nvlink, ranks_per_node * network)
    if cfg.engine == "deepspeed":
        reduce, gather = (
            zero_seconds(cfg, parameters_per_gpu, dp, dp_bandwidth, micro_batches, assumptions),
            0.0,
        )
    elif p.use_distributed_optimizer:
        reduce = ring_seconds(FP32 * parameters_per_gpu, dp, dp_bandwidth)
        gather = ring_seconds(activation_bytes * parameters_per_gpu, dp, dp_bandwidth)
    else:
        reduce, gather = ring_seconds(FP32 * parameters_per_gpu, dp, dp_bandwidth, 2), 0.0
    if p.overlap_grad_reduce:
        reduce = max(0.0, reduce - 2 / 3 * micro_batch_compute)
    data_parallel = reduce + gather

    compute = micro_batches * micro_batch_compute
    total = compute + micro_batches * micro_batch_tp + pipeline_p2p + bubble + data_parallel
    model_flops = model_flops_per_sequence(m, seq, padded_vocab_size) * s.global_batch_size
    return StepTime(
        compute_s=compute,
        tensor_parallel_s=micro_batches * micro_batch_tp,
        pipeline_p2p_s=pipeline_p2p,
        bubble_s=bubble,
        data_parallel_s=data_parallel,
        bubble_fraction=bubble_fraction(pp, vp, micro_batches),
        tokens_per_s=s.global_batch_size * seq / total,
        mfu=model_flops / (total * world * instance.peak_bf16_tflops_per_gpu * 1e12),
    )


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
