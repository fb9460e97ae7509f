"""Parallelism as a layer you can see: the (TP, PP, DP) layout, its process groups, and megatron's DDP.

The layout itself (`ParallelDims`, world = TP x PP x CP x DP checked once) is trainer/config/layout.py's; `initialize()` starts the process group (NCCL on GPUs, gloo on
CPU) and megatron-core's parallel_state; `wrap_data_parallel()` puts each model chunk under megatron's
DistributedDataParallel (gradient buckets, reduce-scatter for the distributed optimizer).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from megatron.core.optimizer import MegatronOptimizer
from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.module import Float16Module

from trainer.config import ParallelDims, TrainConfig
from trainer.device import device_type
from trainer.distributed import fast_path, megatron_compat


def initialize(cfg: TrainConfig, dims: ParallelDims | None = None) -> ParallelDims:
    """Start the process groups for a layout the verb has validated already (`train`, `score` and `convert`
    check it before any work); call once per process. Without dims: cfg's layout over the launched world."""
    if dims is None:
        dims = ParallelDims.from_config(cfg.parallel, int(os.environ.get("WORLD_SIZE", "1")))
    device = device_type()
    timeout = timedelta(minutes=cfg.parallel.distributed_timeout_minutes)
    if device == "cuda":
        # Megatron overlaps TP communication with compute only with one hardware queue (image/efa.env sets it too).
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    megatron_compat.apply()
    torch.distributed.init_process_group(backend="nccl" if device == "cuda" else "gloo", timeout=timeout)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=dims.tp,
        pipeline_model_parallel_size=dims.pp,
        virtual_pipeline_model_parallel_size=dims.vp if dims.vp > 1 else None,
        context_parallel_size=dims.cp,
        distributed_timeout_minutes=cfg.parallel.distributed_timeout_minutes,
    )
    # Dropout-free model, but megatron's RNG tracker must exist (TP regions fork it).
    tensor_parallel.model_parallel_cuda_manual_seed(cfg.seed)
    if cfg.parallel.tp_comm_overlap:
        fast_path.initialize_tp_communicators(cfg)
    return dims


def shutdown() -> None:
    parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def wrap_data_parallel(
    chunks: list[torch.nn.Module], cfg: TrainConfig, config: TransformerConfig
) -> list[DistributedDataParallel]:
    """Cast to bf16 when asked (fp32 masters live in the optimizer) and wrap each chunk in megatron's DDP."""
    ddp = ddp_config(cfg)
    wrapped = []
    for i, chunk in enumerate(chunks):
        module = Float16Module(config, chunk) if config.bf16 else chunk
        # Only the first chunk is bucketed, as in Megatron-LM: later chunks' grads are ready together.
        wrapped.append(DistributedDataParallel(config, ddp, module, disable_bucketing=i > 0))
    return wrapped


def ddp_config(cfg: TrainConfig) -> DistributedDataParallelConfig:
    """megatron DDP's settings: fp32 gradient reduction, and the overlap of the reduce-scatter with backward and
    of the distributed optimizer's all-gather with the next forward."""
    p = cfg.parallel
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=p.overlap_grad_reduce,
        use_distributed_optimizer=p.use_distributed_optimizer,
        overlap_param_gather=p.overlap_param_gather,
        # Every pipeline stage starts its all-gathers from the schedule (connect_schedule), as Megatron-LM's
        # default --align-param-gather does.
        align_param_gather=p.overlap_param_gather,
    )


def connect_schedule(
    config: TransformerConfig,
    chunks: list[DistributedDataParallel],
    optimizer: MegatronOptimizer,
    cfg: TrainConfig,
) -> None:
    """Tell the pipeline schedule how to reduce gradients (overlapped with backward when asked)."""
    config.finalize_model_grads_func = finalize_model_grads  # DP reduction, tied-embedding and norm sync
    config.grad_scale_func = optimizer.scale_loss

    def per_chunk(hooks: list):
        return hooks[0] if len(hooks) == 1 else hooks

    if cfg.parallel.overlap_grad_reduce:
        config.no_sync_func = per_chunk([chunk.no_sync for chunk in chunks])
        config.grad_sync_func = per_chunk([chunk.start_grad_sync for chunk in chunks])
    if cfg.parallel.overlap_param_gather:
        config.param_sync_func = per_chunk([chunk.start_param_sync for chunk in chunks])


_pipeline_wait_listeners: list[Callable[[float], None]] = []


def on_pipeline_wait(listener: Callable[[float], None]) -> None:
    """Call `listener(seconds)` after each pipeline send/receive of this process, with its wall time: where a stage
    waits for its neighbours (the pipeline's idle time, transfers included). Every schedule's transfers go through
    P2PCommunicator._communicate (megatron-core 0.16.1 pipeline_parallel/p2p_communication.py), wrapped once per
    process; a listener added twice is called once."""
    if not _pipeline_wait_listeners:
        communicate = P2PCommunicator._communicate

        def timed(communicator, *args, **kwargs):
            started = time.perf_counter()
            try:
                return communicate(communicator, *args, **kwargs)
            finally:
                seconds = time.perf_counter() - started
                for call in _pipeline_wait_listeners:
                    call(seconds)

        P2PCommunicator._communicate = timed
    if listener not in _pipeline_wait_listeners:
        _pipeline_wait_listeners.append(listener)
