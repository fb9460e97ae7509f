"""Chat and instruction data for supervised fine-tuning: JSONL conversations through a chat template into tokens
and a loss mask that keeps only the assistant's tokens (`python -m trainer prepare --format chat`).

Input lines are OpenAI-style `{"messages": [{"role": ..., "content": ...}, ...]}` or `{"prompt": ...,
"completion": ...}` pairs (read as one user turn and one assistant turn). The template is the tokenizer's own
(a Hugging Face `chat_template`, rendered with jinja2 the way transformers renders it) or BUILTIN_TEMPLATE for a
tokenizer without one. Output, beside the usual PREFIX.bin/.idx/.tokenizer.json/.manifest.json (one document per
conversation): PREFIX-mask.bin/.idx, an indexed dataset of the same document lengths holding 1 for every token the
model is trained to predict (the assistant's) and 0 elsewhere, and PREFIX.chat.json, what was made and how.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError
from rich.console import Console
from tokenizers import Tokenizer

from trainer.data import DataError
from trainer.data.chat_template import CHAT_TEMPLATE as BUILTIN_TEMPLATE
from trainer.data.chat_template import ROLES
from trainer.data.indexed import IndexedDatasetWriter, token_dtype
from trainer.data.manifest import (
    DatasetFiles,
    InputFile,
    Manifest,
    Request,
    TokenizerRecord,
    read_manifest,
    sampled_sha256,
    write_manifest,
    written_files,
)
from trainer.data.tokenizer import bos_token, eod_id, file_sha256, read_tokenizer

TRAINED_ROLE = "assistant"


@dataclass(frozen=True)
class ChatTemplate:
    """A jinja2 chat template, the special tokens it is rendered with, and where it came from.

    `tokens` are what transformers 5.24.0 passes every template (tokenization_utils_base.py apply_chat_template:
    `{**self.special_tokens_map, **kwargs}`, the named tokens bos_token, eos_token, unk_token, pad_token, ... that
    the tokenizer has); `special` is every special token's text, to find where a turn ends."""

    source: str
    origin: str
    tokens: tuple[tuple[str, str], ...]
    special: frozenset[str] = frozenset()

    @property
    def eos_token(self) -> str:
        return dict(self.tokens).get("eos_token", "")

    @property
    def bos_token(self) -> str:
        return dict(self.tokens).get("bos_token", "")

    def render(self, messages: Sequence[dict], *, add_generation_prompt: bool = False) -> str:
        return _compiled(self.source).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, **dict(self.tokens)
        )

    def end_of_turn(self) -> str | None:
        """The special token that ends an assistant turn (the first one the template writes after the turn's
        text: `<|eot_id|>` for Llama 3 Instruct, the end-of-text token for the built-in template); None when the
        template writes none."""
        marker = "\x00assistant-text\x00"
        text = self.render([{"role": "user", "content": "?"}, {"role": "assistant", "content": marker}])
        tail = text[text.rindex(marker) + len(marker) :] if marker in text else ""
        found = [(tail.find(token), token) for token in self.special if token and token in tail]
        return min(found)[1] if found else None

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()


@functools.lru_cache(maxsize=8)
def _compiled(source: str):
    """The template compiled as transformers 5.24.0 compiles chat templates (utils/chat_template_utils.py
    _cached_compile_jinja_template): a sandboxed environment with trim_blocks, lstrip_blocks, loop controls, a
    `raise_exception` and a `strftime_now` global and a `tojson` filter that does not escape HTML."""
    from datetime import datetime

    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return environment.from_string(source)


# The named special tokens transformers passes a template (tokenization_utils_base.py SPECIAL_TOKENS_ATTRIBUTES).
TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
BUILTIN_ORIGIN = "the built-in template (docs/finetune.md)"


def template_tokens(tokenizer: Tokenizer, tokenizer_path: str | Path) -> dict[str, str]:
    """The named special tokens a template is rendered with: those of the tokenizer_config.json beside the
    tokenizer where there is one, else the tokenizer's own beginning- and end-of-text tokens (what an export's
    tokenizer_config.json names: trainer/interop/export.py)."""
    eos = tokenizer.id_to_token(eod_id(tokenizer, tokenizer_path))
    assert eos is not None  # eod_id found it in the vocabulary
    beside = Path(tokenizer_path).with_name("tokenizer_config.json")
    if beside.is_file():
        own = {name: _token_text(_json_object(beside).get(name)) for name in TOKEN_NAMES}
        return {"eos_token": eos} | {name: text for name, text in own.items() if text}
    tokens = {"eos_token": eos, "pad_token": eos}  # as an export's tokenizer_config.json names them
    if (bos := bos_token(tokenizer)) is not None:
        tokens["bos_token"] = bos
    return tokens


def load_chat_template(tokenizer: Tokenizer, tokenizer_path: str, chat_template: str | None) -> ChatTemplate:
    """The template to use: `chat_template` (a tokenizer_config.json with a `chat_template`, or a .jinja file),
    else the tokenizer_config.json beside the tokenizer when it has one, else BUILTIN_TEMPLATE; rendered with the
    tokenizer's special tokens (template_tokens; a given tokenizer_config.json's own override them)."""
    tokens = template_tokens(tokenizer, tokenizer_path)
    special = frozenset(
        added.content for added in tokenizer.get_added_tokens_decoder().values() if added.special
    )
    beside = Path(tokenizer_path).with_name("tokenizer_config.json")
    path = Path(chat_template) if chat_template else (beside if beside.is_file() else None)

    def template(source: str, origin: str, own: dict[str, str] | None = None) -> ChatTemplate:
        return ChatTemplate(source, origin, tuple(sorted((tokens | (own or {})).items())), special)

    if path is None:
        return template(BUILTIN_TEMPLATE, BUILTIN_ORIGIN)
    if not path.is_file():
        raise DataError(
            f"--chat-template {str(path)!r} does not exist: give a Hugging Face tokenizer_config.json with a "
            "'chat_template', or a .jinja file"
        )
    if path.suffix == ".jinja":
        return template(path.read_text(encoding="utf-8"), str(path))
    config = _json_object(path)
    source = config.get("chat_template")
    if isinstance(source, list):  # several named templates: transformers uses the one named "default"
        source = next((item.get("template") for item in source if item.get("name") == "default"), None)
    if not isinstance(source, str) or not source:
        if chat_template is None:  # a tokenizer_config.json without a template: the tokenizer has none
            return template(BUILTIN_TEMPLATE, BUILTIN_ORIGIN)
        raise DataError(
            f"chat template {str(path)!r} has no 'chat_template' string; give a tokenizer_config.json that has "
            "one, or a .jinja file"
        )
    own = {name: _token_text(config.get(name)) for name in TOKEN_NAMES}
    return template(source, str(path), {name: text for name, text in own.items() if text})


def _json_object(path: Path) -> dict:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"chat template {str(path)!r} is not valid JSON: {error}") from None
    return config if isinstance(config, dict) else {}


def _token_text(value: object) -> str:
    """tokenizer_config.json writes a special token as its text or as an AddedToken dict with `content`."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class Conversation:
    messages: tuple[dict[str, str], ...]
    where: str  # file:line, for errors


def read_conversations(paths: Sequence[Path]) -> list[Conversation]:
    """Every conversation of the JSONL files, each line checked: valid JSON, `messages` (a list of {role,
    content} with known roles and at least one assistant turn) or `prompt` and `completion` strings."""
    conversations = []
    for path in paths:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as error:
            raise DataError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
        for number, line in enumerate(lines, start=1):
            if line.strip():
                where = f"{path}:{number}"
                conversations.append(Conversation(_messages(line, where), where))
    if not conversations:
        raise DataError(f"no conversations in {', '.join(map(str, paths))}: every line was blank")
    return conversations


def _messages(line: str, where: str) -> tuple[dict[str, str], ...]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(record, dict):
        raise DataError(
            f"{where}: a line must be a JSON object with 'messages', or 'prompt' and 'completion'"
        )
    if "messages" in record:
        messages = record["messages"]
    elif "prompt" in record or "completion" in record:
        for key in ("prompt", "completion"):
            if not isinstance(record.get(key), str):
                raise DataError(
                    f"{where}: {key!r} must be a string (a prompt/completion pair has both), got "
                    f"{type(record.get(key)).__name__}"
                )
        messages = [
            {"role": "user", "content": record["prompt"]},
            {"role": "assistant", "content": record["completion"]},
        ]
    else:
        keys = ", ".join(repr(key) for key in record) or "none"
        raise DataError(
            f"{where}: no 'messages' and no 'prompt'/'completion' (keys present: {keys}); a chat line is "
            '{"messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}]}'
        )
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            got = sorted(message) if isinstance(message, dict) else type(message).__name__
            raise DataError(
                f"{where}: messages[{index}] must be an object with 'role' and 'content', got {got}"
            )
        if message["role"] not in ROLES:
            raise DataError(
                f"{where}: messages[{index}] has role {message['role']!r}, which the chat template does not "
                f"know; valid: {', '.join(ROLES)}"
            )
        if not isinstance(message["content"], str):
            raise DataError(
                f"{where}: messages[{index}].content must be a string, got {type(message['content']).__name__}"
            )
    if not any(message["role"] == TRAINED_ROLE for message in messages):
        raise DataError(f"{where}: no assistant message: nothing in this conversation would be trained on")
    return tuple(messages)


def assistant_spans(template: ChatTemplate, conversation: Conversation) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character ranges of the assistant turns in it: a turn is what rendering
    it adds after the conversation so far with the generation prompt (its text and end-of-turn token, not its
    header), so any template that renders a conversation as the concatenation of its turns works. A turn ends
    with the first special token after its text (the end-of-turn token): what the template writes after that
    (the built-in template's newline) is the next turn's start, which a model that stopped at the token never
    predicts, so it is not trained (Megatron-Bridge trains transformers' assistant mask, the template's
    `{% generation %}` block, which ends at the end-of-turn token: src/megatron/bridge/data/datasets/utils.py)."""
    messages = conversation.messages
    text = template.render(messages)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != TRAINED_ROLE:
            continue
        before = template.render(messages[:index], add_generation_prompt=True)
        through = template.render(messages[: index + 1])
        if not (through.startswith(before) and text.startswith(through)):
            raise DataError(
                f"{conversation.where}: the chat template ({template.origin}) does not render a conversation as "
                "its turns one after another, so the assistant's tokens cannot be told apart"
            )
        spans.append((len(before), len(before) + _turn_length(template, through[len(before) :], message)))
    return text, spans


def _turn_length(template: ChatTemplate, turn: str, message: dict[str, str]) -> int:
    """How much of a rendered assistant turn is trained: through its end-of-turn token, where it has one."""
    text_end = turn.rfind(message["content"]) + len(message["content"]) if message["content"] else 0
    tail = turn[text_end:]
    ends = [tail.find(token) + len(token) for token in template.special if token and token in tail]
    return text_end + min(ends) if ends else len(turn)


def encode_conversation(
    tokenizer: Tokenizer, template: ChatTemplate, conversation: Conversation
) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation (special-token text the template writes, such as <|eot_id|>, read
    as those tokens; nothing else added) and the loss mask: 1 for each token that starts inside an assistant
    turn."""
    text, spans = assistant_spans(template, conversation)
    encoding = tokenizer.encode(text, add_special_tokens=False)
    mask = [int(any(start <= begin < end for start, end in spans)) for begin, _ in encoding.offsets]
    return encoding.ids, mask


def mask_prefix(prefix: str) -> str:
    """The loss mask's indexed dataset beside the tokens' PREFIX."""
    return f"{prefix}-mask"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# 2: an assistant turn is trained through its end-of-turn token, not what follows it (assistant_spans); the same
# inputs prepared under 1 (which trained the newline after it) are prepared again, without --force.
MASK_RULE = 2


class ChatRequest(_Strict):
    inputs: list[InputFile]
    tokenizer_sha256: str
    template_sha256: str
    seq_length: int | None
    truncate: bool
    mask_rule: int = 1  # absent from data prepared before the rule had a number


class ChatManifest(_Strict):
    """PREFIX.chat.json: how chat data was made, and the loss mask's files (written last: it marks them complete)."""

    version: Literal[1] = 1
    format: Literal["chat"] = "chat"
    request: ChatRequest
    template_origin: str
    template: str | None = None  # the template's source (absent from older manifests): an export writes it
    template_tokens: dict[str, str] | None = None  # the special tokens it was rendered with
    conversations: int
    tokens: int
    trained_tokens: int  # mask ones: the tokens the loss counts
    longest: int  # the longest conversation's tokens: a packed sample of seq_length holds seq_length + 1
    truncated: int
    mask_bin_sha256: str
    mask_idx_sha256: str


def chat_manifest_path(prefix: str) -> Path:
    return Path(f"{prefix}.chat.json")


def read_chat_manifest(prefix: str) -> ChatManifest | None:
    path = chat_manifest_path(prefix)
    if not path.is_file():
        return None
    try:
        return ChatManifest.model_validate_json(path.read_bytes())
    except ValidationError as error:
        raise DataError(
            f"{path} is unreadable ({error.errors()[0]['msg']}); re-run `python -m trainer prepare --format chat "
            "... --force`"
        ) from None


def check_chat_dataset(prefix: str, seq_length: int) -> ChatManifest:
    """The chat manifest of a dataset the trainer is about to pack, or a DataError: not chat data, its mask files
    changed, or a conversation longer than a packed sample."""
    manifest = read_chat_manifest(prefix)
    if manifest is None:
        raise DataError(
            f"data.format chat: {prefix!r} has no {chat_manifest_path(prefix).name}; prepare it with "
            f"`python -m trainer prepare --format chat INPUT.jsonl --tokenizer TOKENIZER --output {prefix}`"
        )
    mask = DatasetFiles(mask_prefix(prefix))
    for path, recorded, digest in (
        (mask.bin, manifest.mask_bin_sha256, sampled_sha256),
        (mask.idx, manifest.mask_idx_sha256, file_sha256),
    ):
        if not path.is_file() or digest(path) != recorded:
            raise DataError(
                f"{path} is missing or not the loss mask {chat_manifest_path(prefix).name} records; re-run "
                f"`python -m trainer prepare --format chat ... --output {prefix} --force`"
            )
    if manifest.longest - 1 > seq_length:
        raise DataError(
            f"data.seq_length = {seq_length}: dataset {prefix!r} holds a conversation of {manifest.longest} "
            f"tokens, which needs data.seq_length >= {manifest.longest - 1}; raise it, or re-prepare with "
            f"--seq-length {seq_length} --truncate"
        )
    return manifest


def trained_template(prefixes: Sequence[str], tokenizer_path: str | Path) -> ChatTemplate | None:
    """The chat template a run's chat data was rendered with (their PREFIX.chat.json), rendered with the same
    special tokens; None when none of the prefixes is chat data. One template for all of them, or a DataError."""
    found: dict[str, ChatManifest] = {}
    for prefix in prefixes:
        manifest = read_chat_manifest(prefix)
        if manifest is not None:
            found.setdefault(manifest.request.template_sha256, manifest)
    if not found:
        return None
    if len(found) > 1:
        origins = ", ".join(sorted(m.template_origin for m in found.values()))
        raise DataError(f"the run's chat data was rendered with {len(found)} templates ({origins}): give one")
    (manifest,) = found.values()
    source = manifest.template
    if source is None:  # prepared before manifests held the template: the built-in one, or re-prepare
        if manifest.request.template_sha256 != hashlib.sha256(BUILTIN_TEMPLATE.encode()).hexdigest():
            raise DataError(
                f"{', '.join(prefixes)}: the chat manifest predates recording its template "
                f"({manifest.template_origin}); re-run `python -m trainer prepare --format chat ... --force`"
            )
        source = BUILTIN_TEMPLATE
    tokenizer = read_tokenizer(tokenizer_path)
    special = frozenset(
        added.content for added in tokenizer.get_added_tokens_decoder().values() if added.special
    )
    tokens = manifest.template_tokens or template_tokens(tokenizer, tokenizer_path)
    return ChatTemplate(source, manifest.template_origin, tuple(sorted(tokens.items())), special)


@dataclass(frozen=True)
class ChatResult:
    prefix: str
    manifest: ChatManifest
    cached: bool
    seconds: float

    def summary(self) -> str:
        m = self.manifest
        if self.cached:
            return f"{self.prefix}: cached ({m.conversations:,} conversations, {m.tokens:,} tokens); --force rebuilds it"
        return (
            f"{self.prefix}: {m.conversations:,} conversations, {m.tokens:,} tokens, {m.trained_tokens:,} of them "
            f"assistant tokens in the loss mask ({mask_prefix(self.prefix)}.bin/.idx), longest {m.longest}, "
            f"{m.truncated} truncated, in {self.seconds:.1f} s; template: {m.template_origin}"
        )


def prepare_chat(
    paths: Sequence[Path],
    output: str,
    *,
    tokenizer: str | None,
    chat_template: str | None = None,
    seq_length: int | None = None,
    truncate: bool = False,
    force: bool = False,
) -> ChatResult:
    """Everything `prepare --format chat` does. Every line is parsed and checked, every conversation rendered and
    tokenized and its length checked before anything is written; files are written under temporary names and
    renamed into place, PREFIX.chat.json last."""
    started = time.perf_counter()
    if tokenizer is None:
        raise DataError(
            "--format chat needs --tokenizer: the model's tokenizer, e.g. data/stdlib.tokenizer.json (the one "
            "`make train` trained with) or a converted checkpoint's tokenizer.json"
        )
    if truncate and seq_length is None:
        raise DataError("--truncate cuts conversations to --seq-length: give --seq-length too")
    if seq_length is not None and seq_length < 2:
        raise DataError(f"--seq-length {seq_length}: must be at least 2")
    if not paths:
        raise DataError("no inputs: give chat .jsonl files, or --stdlib-chat")
    for path in paths:
        if not path.is_file():
            raise DataError(
                f"input {str(path)!r} does not exist or is not a file (chat data is .jsonl files)"
            )
    given = read_tokenizer(tokenizer)
    template = load_chat_template(given, tokenizer, chat_template)
    request = ChatRequest(
        inputs=[InputFile.of(path) for path in paths],
        tokenizer_sha256=file_sha256(tokenizer),
        template_sha256=template.sha256,
        seq_length=seq_length,
        truncate=truncate,
        mask_rule=MASK_RULE,
    )
    files, mask = DatasetFiles(output), DatasetFiles(mask_prefix(output))
    existing = read_chat_manifest(output)
    # The same inputs prepared under an older loss-mask rule: prepared again, nothing else is replaced.
    stale = (
        existing is not None
        and existing.request.mask_rule != MASK_RULE
        and existing.request.model_copy(update={"mask_rule": MASK_RULE}) == request
    )
    if not force and existing is not None and not stale:
        if existing.request == request:
            token_manifest = read_manifest(files)
            if token_manifest is None:
                raise DataError(f"{files.manifest} is missing; re-run with --force")
            token_manifest.check_files(files)
            check_chat_dataset(output, existing.longest)
            return ChatResult(output, existing, True, time.perf_counter() - started)
        raise DataError(
            f"{output!r} holds chat data prepared from other inputs, tokenizer, template or --seq-length; pass "
            "--force to replace it, or choose another --output"
        )
    if not force and not stale and any(path.exists() for path in (*files.all(), mask.bin, mask.idx)):
        raise DataError(
            f"{output!r} already holds files that no {chat_manifest_path(output).name} describes; pass --force "
            "to replace them, or choose another --output"
        )

    conversations = read_conversations(paths)
    encoded, truncated = [], 0
    for conversation in conversations:
        ids, trained = encode_conversation(given, template, conversation)
        if seq_length is not None and len(ids) > seq_length + 1:
            if not truncate:
                raise DataError(
                    f"{conversation.where}: the conversation is {len(ids)} tokens, longer than --seq-length "
                    f"{seq_length} + 1 (a packed sample's inputs and its last label); pass --truncate to cut it, "
                    "or raise --seq-length"
                )
            ids, trained, truncated = ids[: seq_length + 1], trained[: seq_length + 1], truncated + 1
            if not any(trained[1:]):
                raise DataError(
                    f"{conversation.where}: cut to {seq_length + 1} tokens, no assistant token is left to train "
                    "on; raise --seq-length or shorten the conversation"
                )
        encoded.append((ids, trained))

    vocab_size = given.get_vocab_size(with_added_tokens=True)
    dtype = token_dtype(vocab_size)
    lengths = np.array([len(ids) for ids, _ in encoded], dtype=np.int64)
    tokens = np.array([token for ids, _ in encoded for token in ids], dtype=dtype)
    mask_values = np.array([bit for _, bits in encoded for bit in bits], dtype=np.uint8)
    files.bin.parent.mkdir(parents=True, exist_ok=True)
    final = (files.bin, files.idx, files.tokenizer, mask.bin, mask.idx)
    temporary = {path: path.with_name(f"{path.name}.tmp-{os.getpid()}") for path in final}
    try:
        for prefix_files, values in ((files, tokens), (mask, mask_values)):
            writer = IndexedDatasetWriter(temporary[prefix_files.bin], values.dtype.type)
            writer.add_documents(values, lengths)
            writer.finalize(temporary[prefix_files.idx])
        shutil.copyfile(tokenizer, temporary[files.tokenizer])
        token_manifest = Manifest(
            request=Request(
                inputs=request.inputs,
                text_key="messages",
                tokenizer_sha256=request.tokenizer_sha256,
                vocab_size=None,
            ),
            tokenizer=TokenizerRecord(
                file=files.tokenizer.name,
                sha256=request.tokenizer_sha256,
                vocab_size=vocab_size,
                eod_id=eod_id(given, tokenizer),
            ),
            dtype=dtype.__name__,
            documents=len(encoded),
            tokens=int(tokens.size),
            max_token_id=int(tokens.max(initial=0)),
            **written_files(temporary[files.bin], temporary[files.idx]),
        )
        manifest = ChatManifest(
            request=request,
            template_origin=template.origin,
            template=template.source,
            template_tokens=dict(template.tokens),
            conversations=len(encoded),
            tokens=int(tokens.size),
            trained_tokens=int(mask_values.sum()),
            longest=int(lengths.max()),
            truncated=truncated,
            mask_bin_sha256=sampled_sha256(temporary[mask.bin]),
            mask_idx_sha256=file_sha256(temporary[mask.idx]),
        )
        chat_manifest_path(output).unlink(missing_ok=True)
        files.manifest.unlink(missing_ok=True)
        for path in final:
            temporary[path].replace(path)
        write_manifest(files, token_manifest)
        written = chat_manifest_path(output).with_name(f"{chat_manifest_path(output).name}.tmp-{os.getpid()}")
        written.write_text(manifest.model_dump_json(indent=2) + "\n")
        written.replace(chat_manifest_path(output))
    finally:
        for path in temporary.values():
            path.unlink(missing_ok=True)
    return ChatResult(output, manifest, False, time.perf_counter() - started)


# --- `prepare --format chat`: the arguments trainer/data/prepare.py adds and the branch it takes ----------------


def chat_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("chat data (supervised fine-tuning, docs/finetune.md)")
    group.add_argument(
        "--format",
        choices=("auto", "text", "chat"),
        default="auto",
        help="chat: JSONL conversations ('messages', or 'prompt'/'completion') -> tokens and a loss mask; "
        "auto (default): chat when every input is .jsonl whose first line has 'messages' or 'prompt'",
    )
    group.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a tokenizer_config.json with a 'chat_template', or a .jinja file (default: the tokenizer_config.json "
        "beside --tokenizer, else the built-in template)",
    )
    group.add_argument(
        "--seq-length", type=int, help="refuse (or with --truncate cut) conversations longer than this + 1"
    )
    group.add_argument("--truncate", action="store_true", help="cut conversations to --seq-length + 1 tokens")
    group.add_argument(
        "--stdlib-chat",
        action="store_true",
        help="add the built-in chat set (questions on the standard library's functions, written to "
        "PREFIX.conversations.jsonl; one in 20 held out as a generation task, PREFIX.tasks.jsonl)",
    )


def chat_format(args: argparse.Namespace) -> bool:
    """Whether `prepare` reads its inputs as chat data: --format chat or --stdlib-chat, or --format auto with
    every input a .jsonl file whose first record holds 'messages' or 'prompt'."""
    if args.format == "chat" or args.stdlib_chat:
        return True
    if args.format == "text" or args.stdlib or not args.inputs:
        return False
    return all(_looks_like_chat(Path(given)) for given in args.inputs)


def _looks_like_chat(path: Path) -> bool:
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    with path.open(encoding="utf-8", errors="replace") as lines:
        first = next((line for line in lines if line.strip()), "")
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and ("messages" in record or "prompt" in record)


def chat_main(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape

    try:
        if args.stdlib or args.vocab_size is not None:
            raise DataError(
                "--format chat tokenizes conversations with a given --tokenizer; --stdlib and --vocab-size are "
                "for text corpora"
            )
        paths = [Path(given) for given in args.inputs]
        if args.stdlib_chat:
            from trainer.data.stdlib_chat import write_stdlib_chat

            paths.append(write_stdlib_chat(Path(f"{args.output}.conversations.jsonl")))
        result = prepare_chat(
            paths,
            args.output,
            tokenizer=args.tokenizer,
            chat_template=args.chat_template,
            seq_length=args.seq_length,
            truncate=args.truncate,
            force=args.force,
        )
        if args.stdlib_chat:  # its held-out conversations, as `evaluate`'s generation task
            from trainer.data.stdlib_chat import write_stdlib_tasks

            template = load_chat_template(read_tokenizer(args.tokenizer), args.tokenizer, args.chat_template)
            tasks = Path(f"{args.output}.tasks.jsonl")
            write_stdlib_tasks(tasks, lambda messages: template.render(messages, add_generation_prompt=True))
    except DataError as error:
        console.print(f"[bold red]prepare:[/] {escape(str(error))}", soft_wrap=True)
        return 2
    console.print(escape(result.summary()), soft_wrap=True)
    return 0
