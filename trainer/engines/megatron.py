"""`engine: megatron`: the trainer's Llama under megatron-core tensor, pipeline and data parallelism.

One step: every micro-batch of the global batch through the pipeline schedule (1F1B, or interleaved with virtual
stages), gradients reduced over DP by megatron's DDP, then clip and AdamW through megatron's optimizer (the
distributed optimizer shards its fp32 state over DP). A step whose loss or gradient norm is not finite applies
nothing, the LR schedule included.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from megatron.core.distributed import DistributedDataParallel
from megatron.core.optimizer import MegatronOptimizer
from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.pipeline_parallel import get_forward_backward_func
from torch.utils.data import Dataset

from trainer import faults
from trainer.checkpoint import formats
from trainer.checkpoint import megatron as megatron_checkpoint
from trainer.checkpoint.record import ModelRecord
from trainer.checkpoint.settings import run_settings
from trainer.checkpoint.store import Progress
from trainer.checkpoint.writer import Write, Writer
from trainer.config import ParallelDims, TrainConfig
from trainer.contract import metrics as registry
from trainer.data import packing
from trainer.data.loader import micro_batch_streams, train_and_valid
from trainer.device import device_type
from trainer.distributed import fast_path, parallel
from trainer.distributed.optimizer import apply_config_schedule, build_optimizer, build_scheduler
from trainer.engines.step import StepResult
from trainer.model import llama, loss
from trainer.monitoring import exporters


@dataclass
class MegatronEngine:
    """What one training process holds: its model chunks, optimizer, LR schedule and data."""

    cfg: TrainConfig
    dims: ParallelDims
    chunks: list[DistributedDataParallel]  # one per virtual pipeline stage, each under megatron's DDP
    optimizer: MegatronOptimizer
    scheduler: OptimizerParamScheduler
    train_data: Dataset
    valid_data: Dataset
    padded_vocab_size: int
    model_record: ModelRecord
    # the save plans the run's saves reuse
    plans: megatron_checkpoint.Plans = field(default_factory=megatron_checkpoint.Plans)
    saves_in_background = True  # with a Writer (trainer/checkpoint/writer.py)

    def train_batches(self, consumed_samples: int) -> list[Iterator[dict]]:
        return self._batches(self.train_data, consumed_samples)

    def train_step(self, batches: list[Iterator], step: int | None = None) -> StepResult:
        """One optimizer step over a global batch: micro-batches through the pipeline, then clip and AdamW."""
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        with exporters.timed(registry.FORWARD_BACKWARD_TIME):
            mean_loss = self.forward_backward(batches)
        if step is not None:
            faults.inject_in_step(step, self.chunks)
        lr = self.optimizer.param_groups[0]["lr"]
        # megatron's own optimizer step split in two (ChainedOptimizer.step, megatron-core 0.16.1
        # optimizer/optimizer.py): gradients prepared and their norm computed once, for the non-finite check and
        # the clipping alike. Every rank gets the same loss and norm (both reduced over the ranks): all decide alike.
        self.optimizer.prepare_grads()  # gradients were reduced over DP in finalize_model_grads
        grad_norm = float(self.optimizer.get_grad_norm())
        if not faults.SkipCounter.finite(mean_loss, grad_norm):
            return StepResult(
                mean_loss, grad_norm, lr, skipped=True
            )  # megatron's bf16 path has no grad scaler
        self.apply_gradients(grad_norm)
        self.scheduler.step(increment=1)
        return StepResult(mean_loss, grad_norm, lr, skipped=False)

    def apply_gradients(self, grad_norm: float) -> None:
        """Clip the prepared gradients by their global norm (computed once, in train_step), then AdamW."""
        # get_megatron_optimizer returns a ChainedOptimizer, or one optimizer (megatron-core 0.16.1 optimizer/__init__.py)
        for optimizer in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            params = optimizer.get_parameters()
            if params and optimizer.config.clip_grad > 0.0:
                clip_grad_by_total_norm_fp32(
                    params, max_norm=optimizer.config.clip_grad, total_norm=grad_norm
                )
        self.optimizer.step_with_ready_grads()

    def evaluate(self) -> float:
        with fast_path.weights_gathered(self.chunks, self.cfg.parallel.overlap_param_gather):
            return self._evaluate()

    @torch.no_grad()  # forward only: nothing saved for a backward (megatron's schedules do not disable grad)
    def _evaluate(self) -> float:
        batches = self._batches(self.valid_data, 0)
        losses = [
            self.forward_backward(batches, forward_only=True) for _ in range(self.cfg.schedule.eval_iters)
        ]
        return sum(losses) / len(losses)

    def forward_backward(self, batches: list[Iterator], *, forward_only: bool = False) -> float:
        """One global batch's micro-batches through the pipeline schedule; the mean loss per token."""
        s, chunks = self.cfg.schedule, self.chunks
        outputs = get_forward_backward_func()(
            forward_step_func=_forward_step,
            data_iterator=batches if len(chunks) > 1 else batches[0],
            model=chunks if len(chunks) > 1 else chunks[0],
            num_microbatches=s.global_batch_size // (s.micro_batch_size * self.dims.dp),
            seq_length=self.cfg.data.seq_length,
            micro_batch_size=s.micro_batch_size,
            forward_only=forward_only,
        )
        totals = torch.zeros(2, device=device_type())
        for output in outputs:  # only the last pipeline stage has any
            totals += output["lm loss"].to(totals.device)
        return loss.global_mean(totals)

    def save(self, progress: Progress, *, writer: Writer | None = None) -> Write:
        with fast_path.weights_gathered(self.chunks, self.cfg.parallel.overlap_param_gather):
            return megatron_checkpoint.save(
                self.cfg.checkpoint_dir,
                self.chunks,
                self.optimizer,
                self.scheduler,
                progress,
                self.dims,
                self.model_record,
                settings=run_settings(self.cfg),
                optimizer_format=self.optimizer_format(background=writer is not None),
                writer=writer,
                plans=self.plans,
            )

    def optimizer_format(self, background: bool) -> str:
        """checkpoint.optimizer_format for a save, in the background or not (config.py says what auto picks)."""
        chosen = self.cfg.checkpoint.optimizer_format
        if not self.cfg.parallel.use_distributed_optimizer:
            return "fully_reshardable"  # the others' state is per parameter: any layout, nothing to choose
        if chosen == "auto":
            return "dp_reshardable" if background else "fully_reshardable"
        return chosen

    def load(self, path: Path, *, weights_only: bool = False) -> Progress:
        """Everything `save` wrote; with weights_only, or from a weights-only or another engine's checkpoint, the
        weights alone: training starts at step 0."""
        if weights_only or formats.format_of(path) is not megatron_checkpoint or not _resumable(path):
            formats.load_weights(path, self.chunks)
            self.optimizer.reload_model_params()  # its fp32 master weights were copied from the initialization
            return Progress()
        progress = megatron_checkpoint.load(path, self.chunks, self.optimizer, self.scheduler, self.dims)
        apply_config_schedule(self.scheduler, self.cfg)
        return progress

    def _batches(self, dataset: Dataset, consumed_samples: int) -> list[Iterator[dict]]:
        return micro_batch_streams(dataset, consumed_samples, self.cfg, self.dims)


def _resumable(path: Path) -> bool:
    """Whether a megatron checkpoint holds an optimizer and LR schedule (not a weights-only one)."""
    return "scheduler" in formats.saved_state(path)


def build(cfg: TrainConfig, dims: ParallelDims) -> MegatronEngine:
    """Data, model, optimizer and LR schedule for this rank, initialized from the seed."""
    train_data, valid_data = train_and_valid(cfg)
    built, chunks, optimizer, scheduler = build_model_and_optimizer(cfg)
    record = ModelRecord(cfg.model, cfg.data.seq_length)
    engine = MegatronEngine(
        cfg, dims, chunks, optimizer, scheduler, train_data, valid_data, built.padded_vocab_size, record
    )
    if dims.pp > 1:
        parallel.on_pipeline_wait(exporters.pipeline_idle)
    return engine


def build_model_and_optimizer(
    cfg: TrainConfig,
) -> tuple[llama.Built, list[DistributedDataParallel], MegatronOptimizer, OptimizerParamScheduler]:
    """Llama on megatron-core, split over TP and PP, each chunk under megatron's DDP; its optimizer and LR
    schedule, and the pipeline schedule told how to reduce gradients (cfg's model resolved)."""
    built = llama.build(cfg)
    chunks = parallel.wrap_data_parallel(built.chunks, cfg, built.config)
    optimizer = build_optimizer(cfg, chunks)
    parallel.connect_schedule(built.config, chunks, optimizer, cfg)
    return built, chunks, optimizer, build_scheduler(cfg, optimizer)


def _forward_step(batches, chunk):
    with exporters.timed(registry.DATA_WAIT_TIME):
        batch = next(batches)
    # Packed chat samples: each conversation attends to itself alone (trainer/data/packing.py).
    packed = packing.packed_seq_params(batch["cu_seqlens"]) if "cu_seqlens" in batch else None
    per_token_loss = chunk(
        batch["tokens"], batch["position_ids"], None, labels=batch["labels"], packed_seq_params=packed
    )
    return per_token_loss, functools.partial(_loss_sum, batch["loss_mask"])


def _loss_sum(loss_mask: torch.Tensor, per_token_loss: torch.Tensor):
    """Summed loss and token count. With calculate_per_token_loss (trainer/model/llama.py) the schedule leaves the
    sum as it is and finalize_model_grads divides the gradients by the global batch's token count (megatron-core
    0.16.1 pipeline_parallel/schedules.py forward_step_calc_loss, distributed/finalize_model_grads.py): the
    gradient of the per-token mean over the whole global batch, however its tokens fall into micro-batches."""
    total, tokens = loss.masked_sum(per_token_loss, loss_mask)
    return total, tokens.to(torch.int), {"lm loss": torch.stack([total.detach(), tokens])}
