"""`engine: deepspeed`: the trainer's Llama trained data-parallel under DeepSpeed ZeRO (stage 1, 2 or 3).

The model is the GPTModel trainer/model.py builds for megatron at TP = PP = 1: the same initialization and the
same parameter names, so a DeepSpeed checkpoint's full state dict is a megatron one without renaming. DeepSpeed
wraps it whole (ZeRO-3 partitions its weights once built and gathers each module's while it runs). Everything
else is the trainer's own: data and sampler, AdamW with megatron's parameter groups and LR schedule, the loop,
metrics, and the checkpoint directory's staging, `latest` pointer and pruning (trainer/checkpoint.py).

Checkpoints are DeepSpeed's format (`iter_NNNNNNN/*model_states.pt` + one ZeRO shard file per rank), so DeepSpeed's
own tools (zero_to_fp32) read them. ZeRO shards resume only at the data-parallel size and stage they were saved
at; at another (or from a converted checkpoint) the fp32 weights, step and LR schedule come back and Adam's
moments start again from zero.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import deepspeed
import torch
from deepspeed.utils import safe_set_full_fp32_param
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from torch.utils.data import Dataset

from trainer import checkpoint, model, parallel
from trainer.config import TrainConfig
from trainer.deepspeed_config import derived_config, merged_config
from trainer.optimizer import build_scheduler
from trainer.parallel import ParallelDims
from trainer.train import datasets, micro_batch_iterators

# DeepSpeed logs its whole config and every ZeRO bucket at INFO; the trainer's console says what matters.
logging.getLogger("DeepSpeed").setLevel(logging.WARNING)


@dataclass
class Run:
    """One process of a ZeRO run: the DeepSpeed engine around the model, the LR schedule and the data."""

    cfg: TrainConfig
    dims: ParallelDims
    engine: deepspeed.DeepSpeedEngine
    scheduler: OptimizerParamScheduler
    train_data: Dataset
    valid_data: Dataset
    padded_vocab_size: int

    @property
    def micro_batches_per_step(self) -> int:
        return self.engine.gradient_accumulation_steps()

    def train_step(self, batches: list[Iterator]) -> tuple[float, float, float]:
        """One optimizer step over a global batch; the mean loss, the gradient norm before clipping, the LR used."""
        lr = self.engine.optimizer.param_groups[0]["lr"]
        totals = torch.zeros(2)
        for _ in range(self.micro_batches_per_step):
            loss, tokens = _loss_and_tokens(self.engine, next(batches[0]))
            self.engine.backward(loss / tokens)  # DeepSpeed divides by the micro-batches per step
            self.engine.step()  # reduces and steps at the global batch's last micro-batch only
            totals += torch.stack([loss.detach().float().cpu(), tokens.cpu()])
        self.scheduler.step(increment=1)
        return _mean_over_ranks(totals), float(self.engine.get_global_grad_norm()), lr

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss per token over the validation samples, as the megatron engine computes it."""
        batches = micro_batch_iterators(self.valid_data, 0, self)[0]
        losses = []
        for _ in range(self.cfg.schedule.eval_iters):
            totals = torch.zeros(2)
            for _ in range(self.micro_batches_per_step):
                loss, tokens = _loss_and_tokens(self.engine, next(batches))
                totals += torch.stack([loss.float().cpu(), tokens.cpu()])
            losses.append(_mean_over_ranks(totals))
        return sum(losses) / len(losses)

    @property
    def layout(self) -> dict:
        """What ZeRO's shards depend on: a checkpoint resumes whole only where this is the same."""
        return {"dp": self.dims.dp, "zero_stage": self.cfg.zero.stage}

    def save(self, progress: checkpoint.Progress) -> Path:
        """DeepSpeed's checkpoint of this step, written into the trainer's staging directory and then published."""
        staging = checkpoint.stage(self.cfg.checkpoint_dir, progress.step)
        client_state = {
            "scheduler": self.scheduler.state_dict(),
            "progress": {"step": progress.step, "consumed_samples": progress.consumed_samples},
            "layout": self.layout,
        }
        self.engine.save_checkpoint(
            str(staging.parent), tag=staging.name, client_state=client_state, save_latest=False
        )
        return checkpoint.publish(staging, self.cfg.checkpoint.keep_last)

    def load(self, path: Path) -> checkpoint.Progress:
        """Everything `save` wrote, at the same data-parallel size and ZeRO stage; at another, the weights (fp32,
        exact), step and LR schedule, with Adam's moments starting again from zero."""
        saved = trainer_state(path)
        if saved["layout"] == self.layout:
            self.engine.load_checkpoint(str(path.parent), tag=path.name, load_lr_scheduler_states=False)
        else:
            set_full_weights(self.engine, full_state_dict(path))
            if torch.distributed.get_rank() == 0:
                print(
                    f"{path} holds ZeRO shards of {saved['layout']}, this run is {self.layout}: restored the "
                    "weights, step and LR schedule; Adam moments start again from zero",
                    flush=True,
                )
        self.scheduler.load_state_dict(saved["scheduler"])
        return checkpoint.Progress(**saved["progress"])


def build(cfg: TrainConfig, dims: ParallelDims) -> Run:
    """Data, model, AdamW, DeepSpeed engine and LR schedule for this rank, initialized from the seed."""
    train_data, valid_data, padded_vocab_size = datasets(cfg)
    config = model.transformer_config(cfg, parallel.device_type())
    (chunk,) = model.build_model(cfg, config, padded_vocab_size)
    optimizer, torch_optimizer_offload = _adamw(cfg, chunk)
    engine, *_ = deepspeed.initialize(
        model=chunk,
        optimizer=optimizer,
        config=merged_config(
            derived_config(cfg, dims.dp, torch_optimizer_offload=torch_optimizer_offload), cfg.deepspeed
        ),
        dist_init_required=False,
    )
    scheduler = build_scheduler(cfg, engine.optimizer)
    return Run(cfg, dims, engine, scheduler, train_data, valid_data, padded_vocab_size)


def _adamw(cfg: TrainConfig, chunk: torch.nn.Module) -> tuple[torch.optim.Optimizer, bool]:
    """AdamW over megatron's parameter groups (norms and biases without weight decay), and whether it is torch's
    stepping host-resident states. With optimizer offload on GPUs it is DeepSpeed's vectorized CPU Adam."""
    decay, no_decay = [], []
    for name, param in chunk.named_parameters():
        (no_decay if param.ndim == 1 or name.endswith(".bias") else decay).append(param)
    # wd_mult: megatron's LR schedule sets each group's weight decay to the configured one times this.
    groups = [{"params": decay, "wd_mult": 1.0}, {"params": no_decay, "wd_mult": 0.0}]
    o = cfg.optimizer
    hyper = {
        "lr": o.lr,
        "betas": (o.adam_beta1, o.adam_beta2),
        "eps": o.adam_eps,
        "weight_decay": o.weight_decay,
    }
    offload = cfg.zero.offload_optimizer != "none"
    if offload and torch.cuda.is_available():
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(groups, adamw_mode=True, **hyper), False
    # On CPU-only machines everything is host memory already; torch's AdamW avoids compiling DeepSpeed's.
    return torch.optim.AdamW(groups, **hyper), offload


def _loss_and_tokens(engine: deepspeed.DeepSpeedEngine, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The micro-batch's summed loss over its loss-masked tokens, and their count."""
    device = parallel.device_type()
    per_token_loss = engine(
        batch["tokens"].to(device), batch["position_ids"].to(device), None, labels=batch["labels"].to(device)
    )
    mask = batch["loss_mask"].to(device).reshape(-1).float()
    return torch.sum(per_token_loss.float().reshape(-1) * mask), mask.sum()


def _mean_over_ranks(totals: torch.Tensor) -> float:
    totals = totals.to(parallel.device_type())
    torch.distributed.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def full_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A DeepSpeed checkpoint's fp32 weights, unsharded, by megatron's global parameter names; no process group
    needed (DeepSpeed's zero_to_fp32, any stage, any data-parallel size)."""
    state = get_fp32_state_dict_from_zero_checkpoint(str(path.parent), tag=path.name)
    return {name: tensor.contiguous() for name, tensor in state.items()}


def trainer_state(path: Path) -> dict:
    """The trainer's own entries of a DeepSpeed checkpoint: progress, LR schedule, layout."""
    files = sorted(path.glob("*model_states.pt"))  # ZeRO-3 writes one per rank, each with the client state
    if not files:
        raise FileNotFoundError(f"{path} is not a DeepSpeed checkpoint: no *model_states.pt in it")
    state = torch.load(files[0], map_location="cpu", weights_only=False)
    return {key: state[key] for key in ("progress", "scheduler", "layout")}


def set_full_weights(engine: deepspeed.DeepSpeedEngine, weights: dict[str, torch.Tensor]) -> None:
    """Set every weight from unsharded fp32 tensors: the model's (bf16 or fp32) copy and ZeRO's fp32 masters."""
    params = dict(engine.module.named_parameters())
    # ZeRO-3 holds shards: gather them whole, write them, and DeepSpeed re-shards rank 0's values on exit.
    with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=0):
        copy_full_weights(params, weights)
    for name, param in params.items():
        safe_set_full_fp32_param(param, weights[name].to(parallel.device_type()))


@torch.no_grad()
def copy_full_weights(params: dict[str, torch.nn.Parameter], weights: dict[str, torch.Tensor]) -> None:
    """Copy full weights into a whole (TP = PP = 1) model's parameters of the same names."""
    if weights.keys() != params.keys():
        raise ValueError(
            f"the weights do not fit the model: missing {sorted(params.keys() - weights.keys())}, "
            f"unexpected {sorted(weights.keys() - params.keys())}"
        )
    for name, param in params.items():
        param.copy_(weights[name])
