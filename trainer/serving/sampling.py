"""One decoding step's choice of token, as vLLM's sampler makes it (vllm/v1/sample/sampler.py `Sampler.forward`):
the raw log-probabilities are kept for `logprobs`; then the allowed tokens, the minimum length (stop tokens
masked), `logit_bias`; then the penalties (vllm/model_executor/layers/utils.py `apply_penalties`: repetition over
prompt and output, OpenAI's additive frequency and presence penalties over the output only); then greedy argmax
below a temperature of 1e-5 (vllm/sampling_params.py `_SAMPLING_EPS`), else temperature, min_p, top-k, top-p
and a draw from the request's own generator (seeded by `seed`, choice i of n by seed + i:
vllm/v1/engine/parallel_sampling.py `_get_child_sampling_params`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

SAMPLING_EPS = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    allowed_token_ids: tuple[int, ...] | None = None
    seed: int | None = None
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None  # how many alternatives to report besides the chosen token; None: no logprobs
    skip_special_tokens: bool = True

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS


def generator_for(seed: int | None) -> torch.Generator:
    """The request's own generator: its seed's stream, or a fresh random one (so one request's draws never move
    another's)."""
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed % 2**64)
    return generator


@dataclass
class Choice:
    token: int
    logprob: float  # the chosen token's raw log-probability (vLLM's default logprobs mode, raw_logprobs)
    top: list[tuple[int, float]]  # the likeliest tokens and their raw log-probabilities


def choose(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt: list[int],
    output: list[int],
    stop_ids: frozenset[int],
    generator: torch.Generator,
) -> Choice:
    """The next token after `prompt` + `output`, from the model's last-position logits (1-D, the vocabulary)."""
    logits = logits.float()
    raw = torch.log_softmax(logits, dim=-1)
    logits = logits.clone()
    if params.allowed_token_ids is not None:
        allowed = torch.full_like(logits, float("-inf"))
        allowed[list(params.allowed_token_ids)] = 0.0
        logits += allowed
    if len(output) < params.min_tokens and stop_ids:
        logits[list(stop_ids)] = float("-inf")
    for token, bias in params.logit_bias.items():
        logits[token] += bias
    logits = penalized(logits, params, prompt, output)
    if params.greedy:
        token = int(torch.argmax(logits))
    else:
        token = int(torch.multinomial(sampling_distribution(logits, params), 1, generator=generator))
    top: list[tuple[int, float]] = []
    if params.logprobs:
        values, ids = torch.topk(raw, min(params.logprobs, raw.numel()))
        top = [(int(i), float(v)) for i, v in zip(ids, values, strict=True)]
    return Choice(token, float(raw[token]), top)


def penalized(
    logits: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int]
) -> torch.Tensor:
    if params.repetition_penalty != 1.0 and (prompt or output):
        seen = torch.tensor(sorted(set(prompt) | set(output)))
        values = logits[seen]
        logits[seen] = torch.where(
            values > 0, values / params.repetition_penalty, values * params.repetition_penalty
        )
    if output and (params.frequency_penalty or params.presence_penalty):
        counts = torch.bincount(torch.tensor(output), minlength=logits.numel())[: logits.numel()].float()
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float()
    return logits


def sampling_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The probabilities a sampled token is drawn from: temperature, then min_p, top-k and top-p, each keeping
    at least the likeliest token."""
    logits = logits / params.temperature
    probs = torch.softmax(logits, dim=-1)
    if params.min_p > 0:
        probs = torch.where(probs < params.min_p * probs.max(), 0.0, probs)
    if params.top_k is not None and 0 < params.top_k < probs.numel():
        kth = torch.topk(probs, params.top_k).values[-1]
        probs = torch.where(probs < kth, 0.0, probs)
    if params.top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        mass_before = torch.cumsum(ordered, dim=-1) - ordered
        ordered = torch.where(mass_before >= params.top_p * ordered.sum(), 0.0, ordered)
        probs = torch.zeros_like(probs).scatter(0, order, ordered)
    return probs / probs.sum()
