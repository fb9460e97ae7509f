"""`python -m trainer score`: a checkpoint's mean loss per token and perplexity, forward only, at any layout.

    score --checkpoint CKPT --data PREFIX [--samples N] [--seq-length L] [--tp N --pp M] [--json]
    score --checkpoint CKPT --tokens FILE.json [--tp N --pp M] [--json [--sequence-losses]]

The model is rebuilt from the checkpoint's own record of its config (no run config needed) and loads only the
weights. `--data` scores the first N windows of L+1 tokens of a prepared dataset's token stream, in file order
(L: the checkpoint's training sequence length unless given); `--tokens` a JSON array of token-id lists, each its
own sequence. Each sequence predicts its tokens after the first. The loss is cross entropy over the real
vocabulary (the output layer's padding rows are masked), so it equals another implementation's on the same
tokens. Outside torchrun it starts TP x PP processes; more processes (a cluster launch) add data parallelism.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.pipeline_parallel import get_forward_backward_func

from trainer.arguments import positive_int
from trainer.checkpoint import formats
from trainer.config import ConfigError, ModelConfig, TrainConfig, layout_problems
from trainer.data import DataError
from trainer.data.datasets import open_indexed_dataset
from trainer.device import device_type
from trainer.distributed import local, parallel
from trainer.model import llama, loss
from trainer.model.weights import model_only_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint, or a directory of them")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", metavar="PREFIX", help="a prepared dataset (PREFIX.bin/.idx)")
    source.add_argument("--tokens", type=Path, metavar="FILE.json", help="a JSON array of token-id lists")
    parser.add_argument(
        "--samples", type=positive_int, help="--data: windows to score (default: every whole one)"
    )
    parser.add_argument(
        "--seq-length", type=positive_int, help="--data: tokens predicted per window (default: trained)"
    )
    parser.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size")
    parser.add_argument("--pp", type=positive_int, default=1, help="pipeline-parallel size")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a sentence")
    parser.add_argument(
        "--sequence-losses",
        action="store_true",
        help="--json: each sequence's mean loss too (one process; a sweep's standard error, trainer/sweep/heldout.py)",
    )


class ScoreError(ValueError):
    """Scoring that cannot start: the checkpoint, the tokens or the layout."""


@dataclass(frozen=True)
class Score:
    loss: float  # mean cross entropy per predicted token, in nats
    tokens: int  # predicted tokens
    sequences: int
    # Each sequence's mean loss, of the sequences this process's last pipeline stage scored (all of them in one
    # process): evaluate's confidence interval.
    sequence_losses: tuple[float, ...] = ()

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)


def main(args: argparse.Namespace) -> int:
    try:
        found = formats.resolve(args.checkpoint)
        record = formats.read_record(found)
        if record is None:
            raise ScoreError(f"{found} records no model config (saved before checkpoints carried one)")
        assert record.config.vocab_size is not None  # a record holds the resolved vocabulary
        sequences = _sequences(args, record.seq_length, record.config.vocab_size)
        world_size = int(os.environ["WORLD_SIZE"]) if local.under_torchrun() else args.tp * args.pp
        cfg = _config(record.config, args.tp, args.pp, sequences, world_size)
        problems = layout_problems(cfg, world_size, device_type())
        if problems:
            raise ScoreError(f"--tp {args.tp} --pp {args.pp}: " + "; ".join(problems))
    # Every check above raises a ValueError (ours subclass it, as pydantic's does) or a ConfigError.
    except (ValueError, ConfigError) as error:
        print(f"score: {error}", file=sys.stderr)
        return 2
    if not local.under_torchrun():
        local.exec_torchrun(world_size, _verb_args(args))
    result = score(found, cfg, sequences)
    if int(os.environ["RANK"]) == 0:
        if args.json:
            report: dict[str, Any] = {
                "loss": result.loss,
                "perplexity": result.perplexity,
                "tokens": result.tokens,
            }
            if args.sequence_losses:  # rank 0 scored them all only in a world of one
                report["sequence_losses"] = list(result.sequence_losses) if world_size == 1 else None
            print(json.dumps({**report, "sequences": result.sequences, "checkpoint": str(found)}))
        else:
            print(
                f"{found}: loss {result.loss:.6f} per token, perplexity {result.perplexity:.4f} "
                f"({result.tokens:,} tokens in {result.sequences:,} sequences)"
            )
    return 0


def _verb_args(args: argparse.Namespace) -> list[str]:
    """This command line again, for each process torchrun starts."""
    verb = ["score", "--checkpoint", str(args.checkpoint), "--tp", str(args.tp), "--pp", str(args.pp)]
    if args.tokens:
        verb += ["--tokens", str(args.tokens)]
    else:
        verb += ["--data", args.data]
        verb += ["--samples", str(args.samples)] if args.samples else []
        verb += ["--seq-length", str(args.seq_length)] if args.seq_length else []
    return [
        *verb,
        *(["--json"] if args.json else []),
        *(["--sequence-losses"] if args.sequence_losses else []),
    ]


def _sequences(args: argparse.Namespace, trained_seq_length: int, vocab_size: int) -> list[list[int]]:
    """The token sequences to score, checked: each has a token to predict, every id is in the vocabulary."""
    sequences = _read_tokens(args.tokens) if args.tokens else _windows(args, trained_seq_length)
    source = str(args.tokens or args.data)
    for i, sequence in enumerate(sequences):
        if len(sequence) < 2:
            raise ScoreError(f"{source}: sequence {i} has {len(sequence)} tokens; each needs at least 2")
        outside = [token for token in sequence if not 0 <= token < vocab_size]
        if outside:
            raise ScoreError(
                f"{source}: sequence {i} holds token id {outside[0]}, outside the model's vocabulary "
                f"(0..{vocab_size - 1}): tokenized with another tokenizer?"
            )
    return sequences


def _read_tokens(path: Path) -> list[list[int]]:
    if not path.is_file():
        raise ScoreError(f"--tokens {path}: no such file")
    try:
        sequences = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ScoreError(f"--tokens {path}: not JSON ({error})") from None
    if (
        not isinstance(sequences, list)
        or not sequences
        or not all(isinstance(s, list) and all(type(t) is int for t in s) for s in sequences)
    ):
        raise ScoreError(
            f"--tokens {path}: give a non-empty JSON array of token-id lists, e.g. [[1, 5, 9], [1, 7]]"
        )
    return sequences


def _windows(args: argparse.Namespace, trained_seq_length: int) -> list[list[int]]:
    """The first `samples` windows of seq_length + 1 tokens of the dataset's token stream (overlapping by one)."""
    prefix, seq_length = args.data, args.seq_length or trained_seq_length
    if not (Path(prefix + ".bin").is_file() and Path(prefix + ".idx").is_file()):
        raise ScoreError(
            f"--data {prefix}: no {prefix}.bin / {prefix}.idx (prepare it with `python -m trainer prepare`)"
        )
    try:
        dtype = open_indexed_dataset(prefix).index.dtype
    except DataError as error:
        raise ScoreError(f"--data {prefix}: {error}") from None
    stream = np.memmap(prefix + ".bin", dtype=dtype, mode="r")
    available = (stream.size - 1) // seq_length
    samples = available if args.samples is None else args.samples
    if not 1 <= samples <= available:
        raise ScoreError(
            f"--samples {samples}: {prefix} holds {available} whole windows of {seq_length} + 1 tokens "
            f"({stream.size:,} tokens); give 1..{available}, or a shorter --seq-length"
        )
    return [stream[i * seq_length : (i + 1) * seq_length + 1].tolist() for i in range(samples)]


def _config(
    model_config: ModelConfig, tp: int, pp: int, sequences: list[list[int]], world_size: int
) -> TrainConfig:
    """One sequence per micro-batch, each data-parallel rank an equal share of them (the last padded)."""
    dp = max(1, world_size // (tp * pp))
    return model_only_config(
        model_config,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        seq_length=max(len(s) for s in sequences) - 1,
        global_batch_size=-(-len(sequences) // dp) * dp,
    )


def score(checkpoint_path: Path, cfg: TrainConfig, sequences: list[list[int]]) -> Score:
    """Under torchrun: build the model at cfg's layout, load the checkpoint's weights, run every sequence."""
    dims = parallel.initialize(cfg)
    try:
        chunks = llama.build(cfg).chunks
        formats.load_weights(checkpoint_path, chunks)
        for chunk in chunks:
            chunk.eval()
        mine = sequences[parallel_state.get_data_parallel_rank() :: dims.dp]
        assert cfg.model.vocab_size is not None  # main builds cfg from the checkpoint's record
        micro_batches = cfg.schedule.global_batch_size // dims.dp
        with torch.no_grad():
            outputs = get_forward_backward_func()(
                forward_step_func=functools.partial(_forward_step, cfg.model.vocab_size),
                data_iterator=_micro_batches(mine, micro_batches, cfg.data.seq_length),
                model=chunks[0],
                num_microbatches=micro_batches,
                seq_length=cfg.data.seq_length,
                micro_batch_size=1,
                forward_only=True,
            )
        totals = torch.zeros(2, dtype=torch.float64)
        for output in outputs:  # only the last pipeline stage has any
            totals += output["score"].to(totals)
        total, tokens = loss.summed_over_ranks(totals)
        each = [(o["score"][0] / o["score"][1]).item() for o in outputs if o["score"][1] > 0]
        return Score(
            loss=(total / tokens).item(),
            tokens=int(tokens.item()),
            sequences=len(sequences),
            sequence_losses=tuple(each),
        )
    finally:
        parallel.shutdown()


def _micro_batches(sequences: list[list[int]], count: int, seq_length: int) -> Iterator[dict]:
    """One sequence per micro-batch, padded to seq_length (padding masked out); empty ones fill up to count."""
    for i in range(count):
        sequence = sequences[i] if i < len(sequences) else [0]
        predicted = len(sequence) - 1
        tokens, labels, loss_mask = (torch.zeros(1, seq_length, dtype=torch.long) for _ in range(3))
        tokens[0, :predicted] = torch.tensor(sequence[:-1])
        labels[0, :predicted] = torch.tensor(sequence[1:])
        loss_mask[0, :predicted] = 1
        batch = {
            "tokens": tokens,
            "labels": labels,
            "loss_mask": loss_mask,
            "position_ids": torch.arange(seq_length)[None],
        }
        yield {field: tensor.to(device_type()) for field, tensor in batch.items()}


def _forward_step(vocab_size: int, batches, chunk):
    batch = next(batches)
    logits = chunk(batch["tokens"], batch["position_ids"], None)  # the last stage's [b, s, vocab / TP]
    return logits, functools.partial(_summed_loss, batch, vocab_size)


def _summed_loss(batch: dict, vocab_size: int, logits: torch.Tensor):
    """Cross entropy over the real vocabulary: this TP rank's padding columns never win probability mass."""
    logits = logits.float()
    first = parallel_state.get_tensor_model_parallel_rank() * logits.shape[-1]
    padding = torch.arange(first, first + logits.shape[-1], device=logits.device) >= vocab_size
    per_token = tensor_parallel.vocab_parallel_cross_entropy(
        logits.masked_fill(padding, -math.inf), batch["labels"]
    )
    total, tokens = loss.masked_sum(per_token, batch["loss_mask"])
    return total, tokens.to(torch.int), {"score": torch.stack([total.double(), tokens.double()])}
