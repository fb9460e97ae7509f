"""Training metrics: MFU, and where each logged step goes (console, metrics.jsonl, TensorBoard).

MFU counts model FLOPs (trainer/model/flops.py: Megatron's formula, causal attention halved, recompute not
counted) against the device's dense bf16 peak from the instance catalog. On CPU there is no meaningful peak, so
`mfu` is null.
"""

from __future__ import annotations

import json
import math
import resource
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from trainer.contract import metrics as registry
from trainer.contract.catalog import PEAK_BF16_TFLOPS_BY_GPU
from trainer.cost.ledger import Ledger
from trainer.engines.step import StepResult
from trainer.evaluation.during_training import scalars as evaluation_scalars
from trainer.monitoring import exporters

# metrics.jsonl's keys on every line (MetricsLogger.log writes them by name; val_loss and stragglers when measured).
JSONL_KEYS = (
    "step",
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "tflops_per_device",
    "mfu",
    "step_time_s",
    "skipped_steps",
)


def peak_tflops_per_device(configured: float | None) -> float | None:
    """The configured peak, else the catalog's for this GPU model; None on CPU (MFU is not meaningful there)."""
    if configured is not None:
        return configured
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    matches = [peak for model, peak in PEAK_BF16_TFLOPS_BY_GPU.items() if model in name]
    return matches[0] if matches else None


def peak_memory_gib() -> float:
    """This process's peak: allocated GPU memory, or resident set size on CPU."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


class MetricsLogger:
    """Writes each logged step to the console, `<run>/metrics.jsonl`, TensorBoard and this process's metrics
    exporters (trainer/monitoring: Prometheus, CloudWatch); used on one rank only."""

    def __init__(
        self,
        run_dir: Path,
        *,
        train_iters: int,
        start_step: int,
        flops_per_step: float,
        skipped_steps: int = 0,
        tokens_per_step: int,
        world_size: int,
        peak_tflops: float | None,
        tensorboard: bool,
        console: Console,
    ):
        self.flops_per_step = flops_per_step
        self.tokens_per_step = tokens_per_step
        self.world_size = world_size
        self.peak_tflops = peak_tflops
        self.console = console
        run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = (run_dir / "metrics.jsonl").open("a")
        self.tensorboard = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"))
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(bar_width=30),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}  {task.fields[tokens_per_s]} tok/s  ETA"),
            TimeRemainingColumn(),
            console=console,
        )
        self.task = self.progress.add_task(
            "train", total=train_iters, completed=start_step, loss="-", tokens_per_s="-"
        )
        self.progress.start()
        self.train_iters = train_iters
        # The total at the last logged step (the resumed total at first): the exporters' counter grows by the
        # difference, so a resumed run does not count its earlier skips again.
        self.skipped_steps = skipped_steps
        self.line_every = max(1, train_iters // 20)  # every metric in a line every 5 %; the bar has the rest

    def log(
        self,
        step: int,
        result: StepResult | None = None,
        *,
        step_time_s: float | None = None,
        skipped_steps: int | None = None,
        val_loss: float | None = None,
        peak_memory: float = 0.0,
        stragglers: list[dict] | None = None,
        cost: Ledger | None = None,
        evaluation: dict | None = None,
    ) -> None:
        """Record a step: `result` is the step's (None for step 0, before any training: only val_loss); `cost`
        the run's ledger (rank 0's: dollars, node-hours, goodput; trainer/cost/ledger.py); `evaluation` a finished
        evaluation of the suite (trainer/evaluation/during_training.py)."""
        tokens_per_s = tflops = mfu = None
        if step_time_s:
            tokens_per_s = self.tokens_per_step / step_time_s
            tflops = self.flops_per_step / step_time_s / self.world_size / 1e12
            mfu = tflops / self.peak_tflops if self.peak_tflops else None
        values = {
            "step": step,
            "loss": result.loss if result else None,
            "lr": result.lr if result else None,
            "grad_norm": result.grad_norm if result else None,
            "tokens_per_s": tokens_per_s,
            "tflops_per_device": tflops,
            "mfu": mfu,
            "step_time_s": step_time_s,
            "skipped_steps": skipped_steps,
        }
        # A skipped step's loss or norm may be inf or nan, which JSON has no words for: null.
        record: dict[str, float | list[dict] | dict | None] = {
            key: _json_number(value) for key, value in values.items()
        }
        if cost is not None:
            record.update(cost.metrics())
        if val_loss is not None:
            record["val_loss"] = val_loss
        if stragglers:  # at the end of a straggler window that found one (trainer/health/)
            record["stragglers"] = stragglers
        if evaluation is not None:
            record["evaluation"] = evaluation  # a nested object, as stragglers
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        if self.tensorboard is not None:
            scalars = {**record, "peak_memory_gib": peak_memory}
            if evaluation is not None:
                scalars |= evaluation_scalars(evaluation)
            for key, value in scalars.items():
                if (
                    key not in ("step", "stragglers")
                    and isinstance(value, int | float)
                    and math.isfinite(value)
                ):
                    self.tensorboard.add_scalar(key, value, step)
        self._export(step, record, skipped_steps, result.loss if result else None)
        if cost is not None:
            exporters.record(
                {
                    registry.COST: cost.dollars if cost.priced else None,
                    registry.COST_PER_MILLION_TOKENS: cost.dollars_per_million_tokens,
                    registry.PAID_NODE_TIME: sum(cost.node_hours.values()) * 3600,
                    registry.GOODPUT: cost.goodput,
                }
            )
        if result is not None:
            mfu_text = f"MFU {mfu:.1%}" if mfu is not None else "MFU n/a"
            status = (
                f"loss {result.loss:.4f}  lr {result.lr:.2e}  grad norm {result.grad_norm:.3f}  "
                f"{tokens_per_s:,.0f} tok/s  {tflops:.3g} TFLOP/s/device  {mfu_text}  {step_time_s:.2f} s/step  "
                f"peak mem {peak_memory:.2f} GiB"
            )
            self.progress.update(
                self.task, completed=step, loss=f"{result.loss:.3f}", tokens_per_s=f"{tokens_per_s:,.0f}"
            )
            if step % self.line_every == 0:
                self.console.print(f"step {step}/{self.train_iters}: {status}")
        if val_loss is not None:
            self.console.print(f"step {step}: validation loss {val_loss:.4f}")
        if evaluation is not None:
            self.console.print(
                f"step {step}: evaluation of {evaluation['checkpoint']}: {evaluation_scalars(evaluation)}"
            )

    def _export(self, step: int, record: dict, skipped_steps: int | None, loss: float | None) -> None:
        skipped = None
        if skipped_steps is not None:
            skipped, self.skipped_steps = skipped_steps - self.skipped_steps, skipped_steps
        tflops = record["tflops_per_device"]
        exporters.record(
            {
                registry.STEP: step,
                registry.TRAINING_LOSS: loss,  # a NaN or inf loss too: the numerical-trouble alert reads it
                registry.VALIDATION_LOSS: record.get("val_loss"),
                registry.TOKENS_PER_SECOND: record["tokens_per_s"],
                registry.MODEL_FLOPS: tflops * 1e12 if tflops is not None else None,
                registry.MFU: record["mfu"],
                registry.GRADIENT_NORM: record["grad_norm"],
                registry.SKIPPED_STEPS: skipped,
            }
        )

    def close(self) -> None:
        self.progress.stop()
        self.jsonl.close()
        if self.tensorboard is not None:
            self.tensorboard.close()


def _json_number(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None
