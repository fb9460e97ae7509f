"""The served model: an export read by transformers (AutoModelForCausalLM, AutoTokenizer, generation_config.json),
its prompts made as vLLM makes them, and one choice decoded token by token with the model's KV cache, each token
chosen by trainer/serving/sampling.py.

Prompts: a completion's text gets the tokenizer's post-processor's tokens (trainer/data/tokenizer.py
`encode_prompt`, the one rule `trainer generate` follows too), unless `add_special_tokens` is false; token ids are
taken as given. A chat is rendered with the export's chat template (or the request's), then tokenized with
nothing added, since the template writes its own BOS (vLLM ChatCompletionRequest.add_special_tokens defaults to
False).

Ending (vLLM vllm/v1/core/sched/utils.py `check_stop`, then the detokenizer's stop strings): after min_tokens, a
stop token (generation_config.json's eos ids unless ignore_eos, and stop_token_ids) ends with "stop", its text
left out; a stop string ends with "stop", the text cut before it (vLLM include_stop_str_in_output keeps it); else
max_tokens ends with "length". A stop found in the last allowed token is still "stop".
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.data.tokenizer import encode_prompt
from trainer.serving.sampling import SamplingParams, choose, generator_for

# Keys of generation_config.json that vLLM takes as a request's defaults (vllm/config ModelConfig
# get_diff_sampling_param, with --generation-config auto, its default).
DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass
class Step:
    """One generated token, the text it adds to the answer, and the reason generation ended after it, if it did."""

    token: int
    logprob: float
    top: list[tuple[int, float]]
    text: str
    finish_reason: str | None = None


@dataclass
class Decoding:
    """One choice's state: its tokens, the text already handed out, and the text held back (a stop string may
    be starting: vLLM holds back the longest stop's length less one; a cut multi-byte character is held too)."""

    params: SamplingParams
    tokens: list[int] = field(default_factory=list)
    sent: str = ""


def context_of(export: Path) -> int:
    """The positions the model was trained at: generation_config.json's max_length (trainer/interop/convert.py
    writes the sequence length there), else config.json's max_position_embeddings."""
    generation = export / "generation_config.json"
    if generation.is_file() and (length := json.loads(generation.read_text()).get("max_length")):
        return int(length)
    return int(json.loads((export / "config.json").read_text())["max_position_embeddings"])


class Engine:
    def __init__(self, export: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.name = export.name
        self.tokenizer = AutoTokenizer.from_pretrained(export)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model: Any = AutoModelForCausalLM.from_pretrained(export, dtype="auto")
        self.model = model.to(device).eval().requires_grad_(False)
        self.device = device
        self.context = context_of(export)
        generation = json.loads((export / "generation_config.json").read_text())
        eos = generation.get("eos_token_id")
        self.eos_ids = frozenset(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.defaults = {key: generation[key] for key in DEFAULT_KEYS if key in generation}
        self.vocab_size = int(self.model.config.vocab_size)
        self._last: tuple[tuple[int, ...], Any, Any] | None = None  # the last prompt, its logits and cache

    def completion_prompt(self, prompt: str | list[int], add_special_tokens: bool) -> list[int]:
        if isinstance(prompt, list):
            return list(prompt)
        backend = self.tokenizer.backend_tokenizer
        if add_special_tokens:
            return encode_prompt(backend, prompt)
        return list(backend.encode(prompt, add_special_tokens=False).ids)

    def render_chat(self, messages: list[dict], **template: Any) -> str:
        return str(self.tokenizer.apply_chat_template(messages, tokenize=False, **template))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def token_text(self, token: int) -> str:
        return self.decode([token], skip_special_tokens=False)

    def generate(self, prompt: list[int], params: SamplingParams) -> Iterator[Step]:
        """The choice's tokens one at a time; the last Step carries the finish reason."""
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_ids)
        generator = generator_for(params.seed)
        state = Decoding(params)
        held = max((len(text) for text in params.stop), default=1) - 1
        logits, cache = self._prefill(prompt)
        while True:
            chosen = choose(logits, params, prompt, state.tokens, stop_ids, generator)
            state.tokens.append(chosen.token)
            stopped = chosen.token in stop_ids and len(state.tokens) > params.min_tokens
            shown = state.tokens[:-1] if stopped and not params.include_stop_str_in_output else state.tokens
            text = self.decode(shown, params.skip_special_tokens)
            reason = "stop" if stopped else None
            if (
                len(state.tokens) > params.min_tokens
                and (cut := _stop_cut(text, state.sent, params)) is not None
            ):
                text, reason = cut, "stop"
            if reason is None and len(state.tokens) >= params.max_tokens:
                reason = "length"
            if reason is None:
                ready = text[: len(text) - held] if held else text
                ready = ready.rstrip("\ufffd")  # a multi-byte character still cut in two
            else:
                ready = text
            delta, state.sent = ready[len(state.sent) :], max(state.sent, ready, key=len)
            yield Step(chosen.token, chosen.logprob, chosen.top, delta, reason)
            if reason is not None:
                return
            logits, cache = self._forward([chosen.token], cache)

    def _prefill(self, prompt: list[int]) -> Any:
        """The prompt's forward pass, computed once for all n choices of a request (vLLM shares the prompt's KV
        cache between them by prefix caching): a later choice gets a copy, since decoding grows the cache."""
        key = tuple(prompt)
        if self._last is None or self._last[0] != key:
            self._last = (key, *self._forward(prompt, None))
        return self._last[1], copy.deepcopy(self._last[2])

    def _forward(self, ids: list[int], cache: Any) -> tuple[Any, Any]:
        """The model's last-position logits (on the CPU) and its grown cache for `ids` after what `cache` holds (the generator may resume on another thread, and
        inference mode is per thread, so each forward enters it)."""
        import torch

        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([ids], device=self.device), cache=cache, use_cache=True)
        return out.logits[0, -1].cpu(), out.cache


def _stop_cut(text: str, sent: str, params: SamplingParams) -> str | None:
    """The answer's text when a stop string appears in it (before the stop, or through it), else None; only the
    part not yet checked is searched, as vLLM's detokenizer does."""
    start = max(0, len(sent) - max((len(stop) for stop in params.stop), default=0))
    found = [(index, stop) for stop in params.stop if (index := text.find(stop, start)) >= 0]
    if not found:
        return None
    index, stop = min(found)
    return text[: index + len(stop)] if params.include_stop_str_in_output else text[:index]
