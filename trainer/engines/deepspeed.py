"""`engine: deepspeed`: the trainer's Llama trained data-parallel under DeepSpeed ZeRO (stage 1, 2 or 3).

The model is the GPTModel trainer/model/llama.py builds for megatron at TP = PP = 1: the same initialization and the
same parameter names, so a DeepSpeed checkpoint's full state dict is a megatron one without renaming. DeepSpeed
wraps it whole (ZeRO-3 partitions its weights once built and gathers each module's while it runs). Everything
else is the trainer's own: data and sampler, AdamW with megatron's parameter groups and LR schedule, the loop,
metrics, and the checkpoint directory's staging, `latest` pointer and pruning (trainer/checkpoint/).

Checkpoints are DeepSpeed's format (`iter_NNNNNNN/*model_states.pt` + one ZeRO shard file per rank, with the
trainer's model record: trainer/checkpoint/deepspeed.py), so DeepSpeed's own tools (zero_to_fp32) read them.
ZeRO shards resume only at the data-parallel size and stage they were saved at; at another, the fp32 weights,
step and LR schedule come back and Adam's moments start again from zero. From a trainer (megatron) checkpoint,
a converted or a weights-only one, or with checkpoint.finetune, the weights alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import deepspeed
import torch
from deepspeed.utils import safe_set_full_fp32_param
from megatron.core import parallel_state
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from torch.utils.data import Dataset

from trainer.checkpoint import deepspeed as deepspeed_checkpoint
from trainer.checkpoint import formats
from trainer.checkpoint.record import ModelRecord
from trainer.checkpoint.settings import KEY as SETTINGS
from trainer.checkpoint.settings import run_settings
from trainer.checkpoint.store import Progress
from trainer.checkpoint.writer import Write, Writer
from trainer.config import ParallelDims, TrainConfig
from trainer.data.loader import micro_batch_streams, train_and_valid
from trainer.device import device_type
from trainer.distributed.optimizer import apply_config_schedule, build_scheduler
from trainer.engines.deepspeed_config import derived_config, merged_config
from trainer.engines.step import StepResult
from trainer.model import llama, loss, weights

# DeepSpeed logs its whole config and every ZeRO bucket at INFO; the trainer's console says what matters.
logging.getLogger("DeepSpeed").setLevel(logging.WARNING)


@dataclass
class DeepSpeedEngine:
    """One process of a ZeRO run: the DeepSpeed engine around the model, the LR schedule and the data."""

    cfg: TrainConfig
    dims: ParallelDims
    engine: deepspeed.DeepSpeedEngine
    scheduler: OptimizerParamScheduler
    train_data: Dataset
    valid_data: Dataset
    padded_vocab_size: int
    model_record: ModelRecord  # what each checkpoint records about the model

    def train_batches(self, consumed_samples: int) -> list[Iterator[dict]]:
        return self._batches(self.train_data, consumed_samples)

    def _batches(self, dataset: Dataset, consumed_samples: int) -> list[Iterator[dict]]:
        return micro_batch_streams(dataset, consumed_samples, self.cfg, self.dims)

    @property
    def micro_batches_per_step(self) -> int:
        return self.engine.gradient_accumulation_steps()

    def train_step(self, batches: list[Iterator], step: int | None = None) -> StepResult:
        """One optimizer step over a global batch; the mean loss, the gradient norm before clipping, the LR used,
        and whether DeepSpeed skipped the update (its overflow check; TRAINSTACK_FAULT's step faults are the
        megatron engine's, so `step` goes unused)."""
        lr = self.engine.optimizer.param_groups[0]["lr"]
        micro_batches = [next(batches[0]) for _ in range(self.micro_batches_per_step)]
        # The loss is the mean per token over the global batch (trainer/model/loss.py), so each micro-batch's
        # summed loss is divided by the global batch's token count, counted before any backward. DeepSpeed
        # averages gradients over DP (zero/stage_1_and_2.py average_tensor divides by the DP size, deepspeed
        # 0.19.8); scale_wrt_gas=False stops its division by the micro-batches per step (runtime/engine.py).
        tokens = sum(batch["loss_mask"].float().sum() for batch in micro_batches).to(device_type())
        torch.distributed.all_reduce(tokens, group=parallel_state.get_data_parallel_group())
        scale = self.dims.dp / tokens.clamp(min=1)
        totals = torch.zeros(2)
        for batch in micro_batches:
            summed, counted = _loss_and_tokens(self.engine, batch)
            self.engine.backward(summed * scale, scale_wrt_gas=False)
            self.engine.step()  # reduces and steps at the global batch's last micro-batch only
            totals += torch.stack([summed.detach().float().cpu(), counted.cpu()])
        skipped = not self.engine.was_step_applied()
        if not skipped:
            self.scheduler.step(increment=1)
        return StepResult(loss.global_mean(totals), float(self.engine.get_global_grad_norm()), lr, skipped)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss per token over the validation samples, as the megatron engine computes it."""
        batches = self._batches(self.valid_data, 0)[0]
        losses = []
        for _ in range(self.cfg.schedule.eval_iters):
            totals = torch.zeros(2)
            for _ in range(self.micro_batches_per_step):
                summed, counted = _loss_and_tokens(self.engine, next(batches))
                totals += torch.stack([summed.float().cpu(), counted.cpu()])
            losses.append(loss.global_mean(totals))
        return sum(losses) / len(losses)

    @property
    def layout(self) -> dict:
        """What ZeRO's shards depend on: a checkpoint resumes whole only where this is the same."""
        return {"dp": self.dims.dp, "zero_stage": self.cfg.zero.stage}

    saves_in_background = False  # DeepSpeed's own save writes before it returns

    def save(self, progress: Progress, *, writer: Writer | None = None) -> Write:
        """DeepSpeed's checkpoint of this step, written into the trainer's staging directory before it returns."""
        client_state = {
            "model_record": self.model_record.to_dict(),
            SETTINGS: run_settings(self.cfg),
            "scheduler": self.scheduler.state_dict(),
            "progress": {"step": progress.step, "consumed_samples": progress.consumed_samples},
            "layout": self.layout,
        }
        return deepspeed_checkpoint.save(self.engine, self.cfg.checkpoint_dir, progress.step, client_state)

    def load(self, path: Path, *, weights_only: bool = False) -> Progress:
        """Everything `save` wrote, at the same data-parallel size and ZeRO stage; at another, the weights (fp32,
        exact), step and LR schedule, with Adam's moments starting again from zero. From a trainer (megatron),
        converted or weights-only checkpoint, or with weights_only, the weights alone: training starts at step 0."""
        saved = (
            deepspeed_checkpoint.saved_state(path) if formats.format_of(path) is deepspeed_checkpoint else {}
        )
        if "scheduler" not in saved or weights_only:
            set_full_weights(self.engine, formats.full_weights(path, self.model_record))
            return Progress()
        if saved["layout"] == self.layout:
            self.engine.load_checkpoint(str(path.parent), tag=path.name, load_lr_scheduler_states=False)
        else:
            set_full_weights(self.engine, deepspeed_checkpoint.full_weights(path))
            if torch.distributed.get_rank() == 0:
                print(
                    f"{path} holds ZeRO shards of {saved['layout']}, this run is {self.layout}: restored the "
                    "weights, step and LR schedule; Adam moments start again from zero",
                    flush=True,
                )
        self.scheduler.load_state_dict(saved["scheduler"])
        apply_config_schedule(self.scheduler, self.cfg)
        return Progress(**saved["progress"])


def build(cfg: TrainConfig, dims: ParallelDims) -> DeepSpeedEngine:
    """Data, model, AdamW, DeepSpeed engine and LR schedule for this rank, initialized from the seed."""
    train_data, valid_data = train_and_valid(cfg)
    built = llama.build(cfg)  # megatron-core's GPTModel at TP = PP = 1, as the megatron engine initializes it
    (chunk,) = built.chunks
    engine = _engine(cfg, chunk, dims.dp)
    scheduler = build_scheduler(cfg, engine.optimizer)
    record = ModelRecord(cfg.model, cfg.data.seq_length)
    return DeepSpeedEngine(
        cfg, dims, engine, scheduler, train_data, valid_data, built.padded_vocab_size, record
    )


def _engine(cfg: TrainConfig, chunk: torch.nn.Module, data_parallel_size: int) -> deepspeed.DeepSpeedEngine:
    """DeepSpeed around the whole model with the trainer's AdamW, configured from the trainer's config."""
    optimizer, torch_optimizer_offload = _adamw(cfg, chunk)
    engine, *_ = deepspeed.initialize(
        model=chunk,
        optimizer=optimizer,
        config=merged_config(
            derived_config(cfg, data_parallel_size, torch_optimizer_offload=torch_optimizer_offload),
            cfg.deepspeed,
        ),
        dist_init_required=False,
    )
    return engine


def save_weights(
    cfg: TrainConfig, full_weights: dict[str, torch.Tensor], record: ModelRecord, directory: Path
) -> Path:
    """A weights-only DeepSpeed checkpoint (`convert --to-deepspeed`): the model built from its record, set to
    the full weights, under ZeRO at cfg's stage in this one process, saved with its record alone."""
    (chunk,) = llama.build(cfg.model_copy(update={"model": record.config})).chunks
    weights.load_into([chunk], full_weights.__getitem__)  # before DeepSpeed takes its fp32 masters from it
    return deepspeed_checkpoint.save(
        _engine(cfg, chunk, 1), directory, 0, {"model_record": record.to_dict()}
    ).finish()


class _AdamHyperparameters(TypedDict):
    """The keyword arguments torch's AdamW and DeepSpeed's CPU Adam share."""

    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float


def _adamw(cfg: TrainConfig, chunk: torch.nn.Module) -> tuple[torch.optim.Optimizer, bool]:
    """AdamW over megatron's parameter groups (norms and biases without weight decay), and whether it is torch's
    stepping host-resident states. With optimizer offload on GPUs it is DeepSpeed's vectorized CPU Adam."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, param in chunk.named_parameters():
        (no_decay if param.ndim == 1 or name.endswith(".bias") else decay).append(param)
    # wd_mult: megatron's LR schedule sets each group's weight decay to the configured one times this.
    groups = [{"params": decay, "wd_mult": 1.0}, {"params": no_decay, "wd_mult": 0.0}]
    o = cfg.optimizer
    hyper: _AdamHyperparameters = {
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
    device = device_type()
    per_token_loss = engine(
        batch["tokens"].to(device), batch["position_ids"].to(device), None, labels=batch["labels"].to(device)
    )
    return loss.masked_sum(per_token_loss, batch["loss_mask"].to(device))


def set_full_weights(engine: deepspeed.DeepSpeedEngine, full_weights: dict[str, torch.Tensor]) -> None:
    """Set every weight from unsharded fp32 tensors: the model's (bf16 or fp32) copy and ZeRO's fp32 masters."""
    params = engine.module.parameters()
    # ZeRO-3 holds shards: gather them whole, write them, and DeepSpeed re-shards rank 0's values on exit.
    with deepspeed.zero.GatheredParameters(list(params), modifier_rank=0):
        weights.load_into([engine.module], full_weights.__getitem__)
    tied = engine.module.share_embeddings_and_output_weights
    for name, param in engine.module.named_parameters():
        full = full_weights[llama.full_weight_name(engine.module, name, tied)]
        safe_set_full_fp32_param(param, full.to(device_type()))
