"""The one held-out set every finished trial is valued on, and what its score says.

The trainer's own validation loss is no fit for ranking trials: its samples are drawn in the run's seed order and
their number is `eval_iters x global_batch_size`, so two trials of another batch size or seed are measured on
other text (issue 48: one configuration's loss moved 3.3 % with the seed, on 2 batches). Here the windows are
fixed once per study: the first `sequences` windows of `data.seq_length + 1` tokens of the validation split's
documents of the recipe's first dataset, written to <study>/heldout.json, and each finished trial's last
checkpoint is scored on them by `python -m trainer score --tokens` (trainer/evaluation/score.py), which reports
each sequence's loss. The standard error of the mean comes from those per-sequence losses (the windows, not the
tokens, are the independent units), and two trials on the same windows are compared pairwise."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.config import TrainConfig
from trainer.data.datasets import open_indexed_dataset

HELDOUT = "heldout.json"
SCORE_LOG = "score.log"


@dataclass(frozen=True)
class HeldOut:
    """A trial's score on the held-out windows."""

    loss: float  # mean loss per token, in nats
    sequence_losses: tuple[float, ...]  # each window's mean loss, in the held-out file's order

    @property
    def standard_error(self) -> float:
        return standard_error(self.sequence_losses)


Evaluate = Callable[[Path], HeldOut]  # a trial's run directory -> its score on the held-out set


def standard_error(values: Sequence[float]) -> float:
    """The standard error of the mean of `values` (sample standard deviation over sqrt(n))."""
    if len(values) < 2:
        return math.inf
    return float(np.std(values, ddof=1) / math.sqrt(len(values)))


def paired_difference(a: HeldOut, b: HeldOut) -> tuple[float, float]:
    """a's loss minus b's over the same windows, and the standard error of that difference: each window's
    difference, so what both find hard or easy cancels."""
    differences = np.asarray(a.sequence_losses) - np.asarray(b.sequence_losses)
    return float(a.loss - b.loss), standard_error(differences.tolist())


def validation_documents(document_count: int, split: str) -> range:
    """The documents of the validation split, as megatron-core cuts a dataset by `data.split`
    (blended_megatron_dataset_builder.py `_build_megatron_dataset_splits`: round(fraction x documents), 0.16.1)."""
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )

    valid = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))[1]
    if valid is None:
        raise ValueError(f"data.split = {split!r} gives the validation split no weight: nothing is held out")
    return range(round(valid[0] * float(document_count)), round(valid[1] * float(document_count)))


def write_heldout(cfg: TrainConfig, directory: Path, sequences: int) -> Path:
    """<directory>/heldout.json, once: the first `sequences` windows of seq_length + 1 tokens of the validation
    split's documents (the recipe's first dataset), back to back. Too few tokens there for that many: an error
    naming how many fit."""
    path = directory / HELDOUT
    if path.is_file():
        return path
    prefix, length = cfg.data.prefixes[0], cfg.data.seq_length + 1
    dataset = open_indexed_dataset(prefix)
    documents = validation_documents(len(dataset), cfg.data.split)
    stream: list[int] = []
    for index in documents:
        stream.extend(int(token) for token in dataset[index])
        if len(stream) >= sequences * length:
            break
    if len(stream) < sequences * length:
        raise ValueError(
            f"evaluation.sequences = {sequences}: the validation split ({cfg.data.split!r}) of {prefix} holds "
            f"{len(stream) // length} windows of {length} tokens; give at most that many"
        )
    windows = [stream[i * length : (i + 1) * length] for i in range(sequences)]
    directory.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(windows))
    os.replace(temporary, path)
    return path


def score_command(run_dir: Path, heldout: Path) -> list[str]:
    """The trial's newest checkpoint scored on the held-out windows (trainer/evaluation/score.py)."""
    checkpoints = run_dir / "checkpoints"
    return [
        sys.executable, "-m", "trainer", "score", "--checkpoint", str(checkpoints), "--tokens", str(heldout),
        "--json", "--sequence-losses",
    ]  # fmt: skip


class ScoreFailed(Exception):
    """Scoring a finished trial's checkpoint failed: the trial is failed with the score's log."""


def score_trial(run_dir: Path, heldout: Path) -> HeldOut:
    """Score the trial's checkpoint (one process; its output in the trial's score.log)."""
    log = run_dir / SCORE_LOG
    found = subprocess.run(
        score_command(run_dir, heldout),
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    log.write_text(found.stdout + found.stderr)
    lines = [line for line in found.stdout.splitlines() if line.startswith("{")]
    if found.returncode != 0 or not lines:
        raise ScoreFailed(
            f"scoring its checkpoint on the held-out set exited with {found.returncode}; see {log}"
        )
    result = json.loads(lines[-1])
    return HeldOut(float(result["loss"]), tuple(float(v) for v in result["sequence_losses"]))
