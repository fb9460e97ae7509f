"""AdamW through megatron-core's optimizer stack, and the warmup + decay learning-rate schedule.

megatron-core picks the implementation: the distributed optimizer shards fp32 master weights and Adam state over
data-parallel ranks (ZeRO-1); with bf16 it keeps fp32 masters of the bf16 model weights; it clips by the global
gradient norm. Norms and biases get no weight decay (megatron's default).
"""

from __future__ import annotations

import torch
from megatron.core.optimizer import MegatronOptimizer, get_megatron_optimizer
from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from trainer.config import TrainConfig


def build_optimizer(cfg: TrainConfig, model: list[torch.nn.Module]) -> MegatronOptimizer:
    optimizer = get_megatron_optimizer(optimizer_config(cfg), model)
    use_fused_adamw(optimizer)
    return optimizer


def use_fused_adamw(optimizer: MegatronOptimizer) -> None:
    """Without TransformerEngine or apex, megatron-core steps torch.optim.AdamW with its defaults (megatron-core
    0.16.1 optimizer/__init__.py _get_megatron_optimizer_based_on_param_groups, USING_PYTORCH_OPTIMIZER): a
    for-loop over parameters on CPUs, the foreach kernels on GPUs. torch's fused AdamW does every parameter of a
    group in one kernel (torch docs, torch.optim.AdamW `fused`, CPU and CUDA); docs/bench.md has the measured gain.
    AdamW reads each group's `fused` and `foreach` at every step (torch 2.13 optim/adam.py `step`), so setting
    them on megatron's groups switches the kernel; TE's and apex's FusedAdam are left alone."""
    for inner in _torch_optimizers(optimizer):
        if type(inner) is not torch.optim.AdamW:
            continue
        for group in inner.param_groups:
            group["foreach"], group["fused"] = False, True


def _torch_optimizers(optimizer) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside megatron's wrappers (ChainedOptimizer holds one wrapper per parameter kind)."""
    if hasattr(optimizer, "chained_optimizers"):
        return [inner for chained in optimizer.chained_optimizers for inner in _torch_optimizers(chained)]
    return [optimizer.optimizer] if getattr(optimizer, "optimizer", None) is not None else []


def optimizer_config(cfg: TrainConfig) -> MegatronOptimizerConfig:
    """megatron-core's OptimizerConfig for `cfg` (overlap and FP8 recipe as DDP and TransformerConfig have them)."""
    o = cfg.optimizer
    return MegatronOptimizerConfig(
        optimizer="adam",
        lr=o.lr,
        min_lr=o.min_lr,
        weight_decay=o.weight_decay,
        adam_beta1=o.adam_beta1,
        adam_beta2=o.adam_beta2,
        adam_eps=o.adam_eps,
        clip_grad=o.clip_grad,
        bf16=cfg.precision == "bf16",
        params_dtype=torch.bfloat16 if cfg.precision == "bf16" else torch.float32,
        use_distributed_optimizer=cfg.parallel.use_distributed_optimizer,
        overlap_param_gather=cfg.parallel.overlap_param_gather,
        fp8_recipe=cfg.fp8.recipe if cfg.fp8.format is not None else None,
    )


def build_scheduler(cfg: TrainConfig, optimizer: MegatronOptimizer) -> OptimizerParamScheduler:
    """Linear warmup from 0 to optimizer.lr, then decay to optimizer.min_lr; stepped once per iteration. On
    resume the config's values win over the checkpoint's (override_opt_param_scheduler, megatron-core 0.16.1
    optimizer_param_scheduler.py _check_and_set); the step count comes from the checkpoint. A config that differs
    from the checkpoint is refused before start unless checkpoint.allow_schedule_change (trainer/checkpoint/
    settings.py), so this only takes effect when asked for."""
    s, o = cfg.schedule, cfg.optimizer
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=o.lr,
        min_lr=o.min_lr,
        lr_warmup_steps=s.lr_warmup_iters,
        lr_decay_steps=s.lr_decay_iters or s.train_iters,
        lr_decay_style=s.lr_decay_style,
        start_wd=o.weight_decay,
        end_wd=o.weight_decay,
        wd_incr_steps=s.train_iters,
        wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=False,
        override_opt_param_scheduler=True,
    )


def apply_config_schedule(scheduler: OptimizerParamScheduler, cfg: TrainConfig) -> None:
    """After a checkpoint's optimizer and scheduler are loaded: the config's peak and floor LR on every parameter
    group, and the LR and weight decay recomputed at the loaded step. megatron's scheduler reads them per group
    (optimizer_param_scheduler.py get_lr: param_group max_lr / min_lr, which get_megatron_optimizer sets from
    OptimizerConfig.lr and min_lr, optimizer/__init__.py, megatron-core 0.16.1), and loading an optimizer restores
    the checkpoint's groups. Equal to the checkpoint's unless checkpoint.allow_schedule_change let them differ."""
    for group in scheduler.optimizer.param_groups:
        if "max_lr" in group:
            group["max_lr"] = cfg.optimizer.lr
        if "min_lr" in group:
            group["min_lr"] = cfg.optimizer.min_lr
    scheduler.step(increment=0)
