"""`python -m trainer generate`: text from a checkpoint, one prompt at a time, streamed to the terminal.

    generate --checkpoint CKPT --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]
             [--stop TEXT ...] [--seed S] [--tokenizer tokenizer.json] [--format text|json]
    generate --checkpoint CKPT --prompts FILE.jsonl ...      one {"prompt": TEXT} object per line
    generate --config FILE --prompt TEXT ...                 a training config's run: its newest checkpoint and
                                                             its data.tokenizer_path (`make train`'s sample)

The model is megatron-core's GPTModel rebuilt from the checkpoint's own record at TP=1, PP=1 in this process
(a checkpoint saved at any layout loads at any other), decoding with megatron-core's static KV cache
(`StaticInferenceContext`): the prompt in one forward pass, then one token per pass. Sampling follows
transformers' warpers in their order (temperature, top-k, top-p); `--temperature 0` is greedy (argmax).
Generation ends at `--max-new-tokens`, at the tokenizer's end-of-document token or the end-of-turn token of the
chat template the run was fine-tuned with (the ids an export's generation_config.json lists), or when the text
holds a `--stop` sequence (the text is cut before it). Prompts are tokenized with their special-token text read as
those tokens. The tokenizer is the one given, else the one the checkpoint's model version record names (the run's
data.tokenizer_path), else a tokenizer.json beside the checkpoint. Everything is checked before the model is built: the
checkpoint, the tokenizer, the settings, and that each prompt plus `--max-new-tokens` fits the model's context
(the sequence length it was trained at).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from megatron.core.inference.contexts import StaticInferenceContext

from trainer.arguments import positive_int
from trainer.checkpoint import formats
from trainer.checkpoint.record import ModelRecord
from trainer.checkpoint.version import RECORD, ModelVersion, read_record
from trainer.config import ConfigError, TrainConfig, load_config
from trainer.data import DataError
from trainer.data.chat import ChatTemplate, trained_template
from trainer.data.tokenizer import HuggingFaceTokenizer, load_tokenizer
from trainer.device import device_type
from trainer.distributed import local, parallel
from trainer.evaluation.jsonl import string_records
from trainer.model import llama
from trainer.model.weights import model_only_config

TOKENIZER = "tokenizer.json"
DEFAULT_MAX_NEW_TOKENS = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--checkpoint", type=Path, help="a checkpoint, or a directory of them")
    model.add_argument(
        "--config", type=Path, help="a training config: its run's newest checkpoint and its tokenizer"
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="the text to continue")
    source.add_argument("--prompts", type=Path, metavar="FILE.jsonl", help='one {"prompt": TEXT} per line')
    add_sampling_arguments(parser)
    parser.add_argument(
        "--tokenizer",
        type=Path,
        help=f"a tokenizer.json (default: the one the checkpoint's record names, else {TOKENIZER} in the "
        "checkpoint's directory or one above it)",
    )
    parser.add_argument(
        "--format",
        choices=["text", "json"],
        default="text",
        help="text: stream each continuation; json: one object per prompt (prompt_tokens, tokens, text)",
    )


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """The decoding settings, shared with `evaluate`'s generation tasks."""
    parser.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=DEFAULT_MAX_NEW_TOKENS,
        help=f"at most this many tokens per prompt (default {DEFAULT_MAX_NEW_TOKENS})",
    )
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="0 (default): greedy; above 0: sample at it"
    )
    parser.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest tokens (0: all)")
    parser.add_argument(
        "--top-p", type=float, default=1.0, help="sample from the likeliest tokens holding this mass (1: all)"
    )
    parser.add_argument(
        "--stop", action="append", default=[], metavar="TEXT", help="end when the text holds it; repeatable"
    )
    parser.add_argument("--seed", type=int, default=0, help="the sampling generator's seed")


class GenerateError(ValueError):
    """Generation that cannot start: the checkpoint, the tokenizer, a prompt or a setting."""


@dataclass(frozen=True)
class Sampling:
    """How each next token is chosen; checked on construction."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise GenerateError(f"--max-new-tokens {self.max_new_tokens}: give 1 or more")
        if not self.temperature >= 0:  # also refuses NaN
            raise GenerateError(f"--temperature {self.temperature}: give 0 (greedy) or a positive number")
        if self.top_k < 0:
            raise GenerateError(f"--top-k {self.top_k}: give 0 (off) or a positive count")
        if not 0 < self.top_p <= 1:
            raise GenerateError(f"--top-p {self.top_p}: give a probability mass in (0, 1] (1: off)")
        if any(not text for text in self.stop):
            raise GenerateError("--stop '': give a non-empty stop sequence")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Sampling:
        return cls(args.max_new_tokens, args.temperature, args.top_k, args.top_p, tuple(args.stop), args.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Generation:
    prompt_tokens: list[int]
    tokens: list[int] = field(default_factory=list)  # the generated ids (a stop sequence's tokens included)
    text: str = ""  # the generated text, cut before a stop sequence
    stopped_by: str = "max_new_tokens"  # or "eod", or "stop"

    def as_json(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "tokens": self.tokens, "text": self.text}


def main(args: argparse.Namespace) -> int:
    try:
        sampling = Sampling.from_args(args)
        if args.config is not None:
            cfg = load_config(args.config)
            args.checkpoint, args.tokenizer = (
                cfg.checkpoint_dir,
                args.tokenizer or Path(cfg.data.tokenizer_path),
            )
        found, record = checkpoint_and_record(args.checkpoint)
        tokenizer = load_tokenizer(tokenizer_path(args.tokenizer, args.checkpoint, found))
        check_vocabulary(tokenizer, record)
        stops = stop_ids(found, tokenizer)
        prompts = [args.prompt] if args.prompt is not None else read_prompts(args.prompts)
        prompt_ids = [tokenizer.tokenize_prompt(prompt) for prompt in prompts]
        check_context(prompt_ids, sampling.max_new_tokens, record.seq_length)
        if local.under_torchrun() and int(os.environ["WORLD_SIZE"]) > 1:
            raise GenerateError("generate runs in one process (TP=1, PP=1); start it without torchrun")
    # Every check above raises a ValueError (ours subclass it), a ConfigError or a DataError.
    except (ValueError, ConfigError, DataError) as error:
        print(f"generate: {error}", file=sys.stderr)
        return 2
    with Generator.loaded(found, record, tokenizer, stops) as generator:
        for prompt, ids in zip(prompts, prompt_ids, strict=True):
            if args.format == "json":
                print(json.dumps(generator.generate(ids, sampling).as_json()), flush=True)
            else:
                print(prompt, end="", flush=True)
                generator.generate(ids, sampling, on_text=lambda text: print(text, end="", flush=True))
                print(flush=True)
    return 0


def sample_after_training(cfg: TrainConfig, prompt: str, max_new_tokens: int) -> None:
    """`train --sample-tokens N` (make train's last lines): a greedy continuation of prompt by the run's newest
    checkpoint, streamed to stdout; a sample that cannot run says why and leaves the run's exit status alone."""
    try:
        found, record = checkpoint_and_record(cfg.checkpoint_dir)
        tokenizer = load_tokenizer(cfg.data.tokenizer_path)
        ids = tokenizer.tokenize_prompt(prompt)
        check_context([ids], 1, record.seq_length)
        stops = stop_ids(found, tokenizer)
    except (ValueError, ConfigError, DataError) as error:
        print(f"sample: not generated: {error}", file=sys.stderr)
        return
    started = time.perf_counter()
    sampling = Sampling(max_new_tokens=min(max_new_tokens, record.seq_length - len(ids)))
    print(f"--- a sample from {found} (greedy, {sampling.max_new_tokens} tokens):", flush=True)
    with Generator.loaded(found, record, tokenizer, stops) as generator:
        print(prompt, end="", flush=True)
        generator.generate(ids, sampling, on_text=lambda text: print(text, end="", flush=True))
    print(f"\n--- ({time.perf_counter() - started:.1f} s to load and generate)", flush=True)


def checkpoint_and_record(path: Path) -> tuple[Path, ModelRecord]:
    found = formats.resolve(path)
    record = formats.read_record(found)
    if record is None:
        raise GenerateError(f"{found} records no model config (saved before checkpoints carried one)")
    return found, record


def tokenizer_path(given: Path | None, checkpoint: Path, found: Path) -> Path:
    """The tokenizer given, else the one the checkpoint's model version record names (the run's
    data.tokenizer_path), else tokenizer.json beside the checkpoint (convert --from-hf puts it there)."""
    if given is not None:
        return given
    version = _version(found)
    if version is not None and Path(version.tokenizer_path).is_file():
        return Path(version.tokenizer_path)
    for directory in (found, *found.parents[:2], checkpoint):
        if (directory / TOKENIZER).is_file():
            return directory / TOKENIZER
    named = f"its record's {version.tokenizer_path} is not here, and " if version is not None else ""
    raise GenerateError(
        f"{named}no {TOKENIZER} in {found} or the two directories above it; give --tokenizer (the run's "
        "data.tokenizer_path, e.g. data/stdlib.tokenizer.json for make train)"
    )


def _version(found: Path) -> ModelVersion | None:
    return read_record(found) if (found / RECORD).is_file() else None


def chat_template_of(found: Path, tokenizer_path: str | Path) -> ChatTemplate | None:
    """The chat template the checkpoint's run was fine-tuned with (its chat data's manifests), if it was."""
    version = _version(found)
    return trained_template(version.config["data"]["prefixes"], tokenizer_path) if version else None


def stop_ids(found: Path, tokenizer: HuggingFaceTokenizer) -> frozenset[int]:
    """The ids that end generation: the end-of-document token, and the end-of-turn token of the chat template the
    checkpoint's run was fine-tuned with, where it is another (transformers stops at every id of
    generation_config.json's eos_token_id; trainer/interop/export.py writes the same two)."""
    template = chat_template_of(found, tokenizer.path)
    turn = template.end_of_turn() if template is not None else None
    turn_id = tokenizer.token_id(turn) if turn is not None else None
    return frozenset({tokenizer.eod, *([turn_id] if turn_id is not None else [])})


def check_vocabulary(tokenizer: HuggingFaceTokenizer, record: ModelRecord) -> None:
    assert record.config.vocab_size is not None  # a record holds the resolved vocabulary
    if tokenizer.vocab_size > record.config.vocab_size:
        raise GenerateError(
            f"tokenizer {tokenizer.path} has {tokenizer.vocab_size} tokens, the model {record.config.vocab_size}: "
            "give the tokenizer the model was trained with (--tokenizer)"
        )


def read_prompts(path: Path) -> list[str]:
    if not path.is_file():
        raise GenerateError(f"--prompts {path}: no such file")
    shape = 'give an object with a string "prompt"'
    prompts = [
        entry["prompt"]
        for entry in string_records(path, ("prompt",), f"--prompts {path}", shape, GenerateError)
    ]
    if not prompts:
        raise GenerateError(f'--prompts {path}: no prompts; give one {{"prompt": TEXT}} per line')
    return prompts


def check_context(prompt_ids: list[list[int]], max_new_tokens: int, context: int) -> None:
    """Each prompt and its new tokens must fit the positions the model was trained at."""
    for index, ids in enumerate(prompt_ids):
        if not ids:
            raise GenerateError(f"prompt {index} is empty: give at least one token of text")
        if len(ids) + max_new_tokens > context:
            fits = context - len(ids)
            remedy = (
                f"--max-new-tokens {fits} or less" if fits >= 1 else f"at most {context - 1} prompt tokens"
            )
            raise GenerateError(
                f"prompt {index} has {len(ids)} tokens; with --max-new-tokens {max_new_tokens} it needs "
                f"{len(ids) + max_new_tokens} positions, more than the model's context of {context} (the sequence "
                f"length it was trained at): shorten the prompt or give {remedy}"
            )


def next_token_distribution(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """[vocab] logits -> filtered logits, as transformers 5.24.0's generation/logits_process.py warpers apply
    them in turn: TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper (min_tokens_to_keep 1)."""
    logits = logits / sampling.temperature
    if 0 < sampling.top_k < logits.numel():
        kth = torch.topk(logits, sampling.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, -float("inf"))
    if sampling.top_p < 1:
        ascending, order = torch.sort(logits)
        remove = ascending.softmax(-1).cumsum(-1) <= 1 - sampling.top_p
        remove[-1] = False  # the likeliest token always stays
        logits = logits.masked_fill(remove.scatter(0, order, remove), -float("inf"))
    return logits


def next_token(logits: torch.Tensor, sampling: Sampling, rng: torch.Generator) -> int:
    if sampling.greedy:
        return int(torch.argmax(logits))
    probabilities = next_token_distribution(logits.float(), sampling).softmax(-1)
    return int(torch.multinomial(probabilities, 1, generator=rng))


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many characters at the end of text could begin a stop sequence: streaming waits to see them."""
    return max((k for stop in stops for k in range(1, len(stop)) if text.endswith(stop[:k])), default=0)


class Generator:
    """A checkpoint's model at TP=1, PP=1 in this process, decoding with megatron-core's KV cache."""

    def __init__(
        self,
        chunk: torch.nn.Module,
        vocab_size: int,
        tokenizer: HuggingFaceTokenizer,
        stops: frozenset[int] | None = None,
    ) -> None:
        self.chunk, self.vocab_size, self.tokenizer = chunk, vocab_size, tokenizer
        self.stops = stops if stops is not None else frozenset({tokenizer.eod})  # see stop_ids

    @classmethod
    @contextlib.contextmanager
    def loaded(
        cls,
        found: Path,
        record: ModelRecord,
        tokenizer: HuggingFaceTokenizer,
        stops: frozenset[int] | None = None,
    ) -> Iterator[Generator]:
        assert record.config.vocab_size is not None  # a record holds the resolved vocabulary
        cfg = model_only_config(record.config, seq_length=record.seq_length)
        with local.single_process():
            parallel.initialize(cfg)
            try:
                (chunk,) = llama.build(cfg).chunks
                formats.load_weights(found, [chunk])
                chunk.eval()
                yield cls(chunk, record.config.vocab_size, tokenizer, stops)
            finally:
                parallel.shutdown()

    def logits(self, ids: list[int], position: int, context: StaticInferenceContext) -> torch.Tensor:
        """The next token's logits over the real vocabulary after feeding ids at positions from `position`."""
        device = device_type()
        tokens = torch.tensor([ids], device=device)
        positions = torch.arange(position, position + len(ids), device=device)[None]
        # megatron-core 0.16.1 GPTModel._postprocess: inference must gather the TP logits; [b, 1, padded vocab]
        logits = self.chunk(tokens, positions, None, inference_context=context, runtime_gather_output=True)
        context.increment_sequence_len_offset(len(ids))
        return logits[0, -1, : self.vocab_size].float()

    @torch.no_grad()
    def generate(
        self, prompt: list[int], sampling: Sampling, on_text: Callable[[str], None] | None = None
    ) -> Generation:
        """Continue `prompt`; on_text gets each new piece of text as soon as it decodes to whole characters."""
        result = Generation(prompt_tokens=list(prompt))
        rng = torch.Generator().manual_seed(sampling.seed)
        context = StaticInferenceContext(1, len(prompt) + sampling.max_new_tokens)
        logits = self.logits(prompt, 0, context)  # the prompt at once (prefill) ...
        context.enable_decode_mode()  # ... then one token per pass from the cache
        shown = ""
        while True:
            token = next_token(logits, sampling, rng)
            result.tokens.append(token)
            text = self.tokenizer.detokenize(t for t in result.tokens if t not in self.stops)
            cut = min((i for i in (text.find(s) for s in sampling.stop) if i >= 0), default=-1)
            if cut >= 0:
                text, result.stopped_by = text[:cut], "stop"
            elif token in self.stops:
                result.stopped_by = "eod"
            # A piece ending inside a multi-byte character decodes to U+FFFD until its last byte arrives.
            done = result.stopped_by != "max_new_tokens" or len(result.tokens) == sampling.max_new_tokens
            ready = text if done else text[: len(text) - _held_back(text, sampling.stop)]
            if on_text is not None and (done or not ready.endswith("\ufffd")) and ready.startswith(shown):
                on_text(ready[len(shown) :])
                shown = ready
            if done:
                result.text = text
                return result
            logits = self.logits([token], len(prompt) + len(result.tokens) - 1, context)
