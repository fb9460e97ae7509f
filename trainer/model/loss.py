"""The language-model loss every path reports: the mean over loss-masked tokens of the whole global batch.

Each micro-batch gives its masked sum and its token count; they are added up over micro-batches and over the
data-parallel and pipeline ranks (only the last pipeline stage computes a loss) before one division, so that
every token weighs the same however the batch is split (per token, not per micro-batch). Both engines' steps
and evaluations and `score` use these two functions.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state

from trainer.device import device_type


def masked_sum(per_token_loss: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The summed loss over the tokens loss_mask keeps (fp32), and how many it keeps (fp32)."""
    mask = loss_mask.reshape(-1).float()
    return torch.sum(per_token_loss.float().reshape(-1) * mask), mask.sum()


def summed_over_ranks(totals: torch.Tensor) -> torch.Tensor:
    """[loss sum, tokens] of this rank's micro-batches, summed over the data-parallel (and context-parallel: they
    hold parts of the same sequences) group, then the pipeline group (a group of one where there is no such
    split), in fp64: the same on every rank."""
    totals = totals.to(device=device_type(), dtype=torch.float64)
    torch.distributed.all_reduce(
        totals, group=parallel_state.get_data_parallel_group(with_context_parallel=True)
    )
    torch.distributed.all_reduce(totals, group=parallel_state.get_pipeline_model_parallel_group())
    return totals


def global_mean(totals: torch.Tensor) -> float:
    """[loss sum, tokens] of this rank's micro-batches -> the mean loss per token over every rank, on every rank.
    One all-reduce over all ranks rather than summed_over_ranks' two: the last pipeline stage's tensor-parallel
    ranks hold the same sums (the vocabulary-parallel loss is reduced over TP) and the other stages zeros, so the
    sum over all ranks is TP times the data-parallel sum in both entries alike, and their ratio is the mean."""
    totals = totals.to(device=device_type(), dtype=torch.float64)
    torch.distributed.all_reduce(totals)
    total, tokens = totals
    return (total / tokens).item()
