"""Evaluation during training (`evaluation.suite`): `evaluate` on the run's newest checkpoint, in a process of its
own, so the training ranks (at any TP x PP) keep stepping while it runs.

Every `evaluation.interval` steps (default: every checkpoint save) and after the last step, once that step's
checkpoint is published, rank 0 starts `python -m trainer evaluate --checkpoint <it> --suite S --format json`
without torchrun's variables and without GPUs (`CUDA_VISIBLE_DEVICES=""`: the evaluation never takes memory from a
training rank). When it has finished, the loop's next log line carries its figures (`evaluation` in
metrics.jsonl, `evaluation/<task>/...` in TensorBoard, the EVALUATION_* metrics of trainer/contract/metrics.py with
a `task` label in Prometheus and a Task dimension in CloudWatch). One evaluation runs at a time: the next waits for
the one before. After the last step the run waits for its evaluation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from trainer.config import TrainConfig
from trainer.contract import metrics as registry
from trainer.monitoring import exporters

# What torchrun sets for its workers: the evaluation process is a world of its own.
_TORCHRUN_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)


class IntervalEvaluation:
    """The loop's side: `after_step` on every rank after the checkpoint save, `take` for the log line."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        e = cfg.evaluation
        self.interval = e.interval or cfg.checkpoint.save_interval
        self.enabled = e.suite is not None
        self.process: subprocess.Popen | None = None
        self.checkpoint: Path | None = None
        self.finished: list[dict] = []  # results not yet logged, oldest first
        self.log = cfg.run_dir / "evaluation.log"

    def due(self, step: int, last: bool) -> bool:
        return self.enabled and (last or bool(self.interval and step % self.interval == 0))

    def after_step(self, step: int, checkpointer, *, last: bool) -> None:
        """On every rank (publishing an in-flight save is collective); rank 0 starts the evaluation."""
        if self.enabled and torch.distributed.get_rank() == 0:
            self._collect(wait=False)
        if not self.due(step, last):
            return
        newest = checkpointer.newest()
        if torch.distributed.get_rank() != 0 or newest is None:
            return
        self._collect(wait=True)
        command = [sys.executable, "-m", "trainer", "evaluate", "--checkpoint", str(newest)]
        assert self.cfg.evaluation.suite is not None  # due() only when enabled
        command += ["--suite", self.cfg.evaluation.suite, "--tokenizer", self.cfg.data.tokenizer_path]
        environment = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_VARIABLES}
        environment.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("a") as log:
            self.process = subprocess.Popen(
                [*command, "--format", "json"], stdout=subprocess.PIPE, stderr=log, env=environment, text=True
            )
        self.checkpoint = newest

    def _collect(self, *, wait: bool) -> None:
        process = self.process
        if process is None or (not wait and process.poll() is None):
            return
        output, _ = process.communicate()
        self.process = None
        if process.returncode != 0:
            print(
                f"evaluation of {self.checkpoint} failed ({process.returncode}); see {self.log}",
                file=sys.stderr,
            )
            return
        try:
            results = json.loads(output.strip().splitlines()[-1])
        except (ValueError, IndexError):  # a half-written line: reported, never fatal to training
            print(f"evaluation of {self.checkpoint} printed no result; see {self.log}", file=sys.stderr)
            return
        self.finished.append({"checkpoint": results.pop("checkpoint"), **results})

    def take(self) -> dict | None:
        """Rank 0: the oldest finished evaluation not yet logged, once; it also goes to the exporters."""
        results = self.finished.pop(0) if self.finished else None
        if results is not None:
            for task, figures in results["perplexity"].items():
                exporters.record_task(registry.EVALUATION_PERPLEXITY, task, figures["perplexity"])
            for task, figures in results["generation"].items():
                exporters.record_task(registry.EVALUATION_EXACT_MATCH, task, figures["exact_match"])
        return results

    def finish(self) -> dict | None:
        """After the last step, rank 0: wait for the evaluation in flight; call until None for every evaluation
        not yet logged."""
        if self.enabled and torch.distributed.get_rank() == 0:
            self._collect(wait=True)
        return self.take()


def scalars(results: dict) -> dict[str, float]:
    """TensorBoard's scalars of one evaluation."""
    values = {f"evaluation/{task}/perplexity": r["perplexity"] for task, r in results["perplexity"].items()}
    values |= {f"evaluation/{task}/loss": r["loss"] for task, r in results["perplexity"].items()}
    values |= {
        f"evaluation/{task}/exact_match": r["exact_match"] for task, r in results["generation"].items()
    }
    return values
