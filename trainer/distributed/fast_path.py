"""The GPU fast path's runtime pieces (docs/trainer.md, "GPU fast path"); the config keys map onto megatron-core's
objects in trainer/model/llama.py (TransformerConfig), trainer/distributed/parallel.py (DDP) and
trainer/distributed/optimizer.py (OptimizerConfig).

- `accelerator()`: whether TransformerEngine is installed and the GPU's compute capability, which
  trainer/config/checks.py's `accelerator_problems` checks the config against before any process group starts;
- `initialize_tp_communicators()`: TransformerEngine's userbuffers for `parallel.tp_comm_overlap`;
- `this_context_parallel_rank()`: this CP rank's two chunks of every sequence;
- `weights_gathered()`: with `parallel.overlap_param_gather` the updated weights arrive during the next forward,
  so evaluation and checkpoints first finish the all-gather (as Megatron-LM's training loop does).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from megatron.core.distributed import DistributedDataParallel
from megatron.core.utils import get_batch_on_this_cp_rank

from trainer.config import TrainConfig


def accelerator() -> tuple[bool, tuple[int, int]]:
    """(TransformerEngine installed, this GPU's compute capability)."""
    return importlib.util.find_spec("transformer_engine") is not None, torch.cuda.get_device_capability()


def initialize_tp_communicators(cfg: TrainConfig) -> None:
    """TransformerEngine's userbuffers, sized for one micro-batch's (sequence / CP) x hidden activations; after
    megatron/training/initialize.py `_initialize_tp_communicators` (Megatron-LM core_r0.16.1), default ub_cfgs."""
    from transformer_engine.pytorch import module as te_module

    p = cfg.parallel
    shape = [
        cfg.data.seq_length * cfg.schedule.micro_batch_size // p.context_parallel_size,
        cfg.model.hidden_size,
    ]
    fp8 = cfg.fp8.format is not None
    if hasattr(te_module.base, "UserBufferQuantizationMode"):  # TransformerEngine >= 2.7
        mode = te_module.base.UserBufferQuantizationMode
        te_module.base.initialize_ub(
            shape=shape,
            tp_size=p.tensor_model_parallel_size,
            quantization_modes=[mode.FP8 if fp8 else mode.NONE],
            bootstrap_backend="nccl",
        )
    else:
        te_module.base.initialize_ub(
            shape=shape, tp_size=p.tensor_model_parallel_size, use_fp8=fp8, bootstrap_backend="nccl"
        )


def this_context_parallel_rank(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This CP rank's part of a micro-batch: chunks r and 2 CP - 1 - r of 2 x CP (balanced causal attention);
    the whole batch when CP = 1."""
    return get_batch_on_this_cp_rank(batch)


@contextmanager
def weights_gathered(chunks: list[DistributedDataParallel], overlap_param_gather: bool) -> Iterator[None]:
    """Inside: every weight is the optimizer's latest (the pending all-gather finished, forward hooks off)."""
    if not overlap_param_gather:
        yield
        return
    for chunk in chunks:
        chunk.disable_forward_pre_hook(param_sync=True)
    try:
        yield
    finally:
        for chunk in chunks:
            chunk.enable_forward_pre_hook()
