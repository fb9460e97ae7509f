"""The request bodies of /v1/completions and /v1/chat/completions, field for field as vLLM's OpenAI server takes
them (vllm-project/vllm vllm/entrypoints/openai/protocol.py `CompletionRequest` and `ChatCompletionRequest` at
commit 0052bed, the version read for this module; the stack's LMI 18 runs vLLM 0.12.0), each field decided:

- honoured, with vLLM's meaning (trainer/serving/sampling.py, trainer/serving/engine.py);
- refused with a 400 when set to anything but its default (`REFUSED`: what the field needs that this CPU server
  does not have, such as a guided-decoding backend, beam search or prompt embeddings);
- accepted with no effect where it cannot change an answer here (`user`, `cache_salt`: no prefix cache).

Unknown fields are refused too (vLLM logs and ignores them; a silent no-op is what issue 47 found wrong). Types are
strict (a string is not a number, a boolean not an integer) and ranges are vLLM's SamplingParams checks
(vllm/sampling_params.py `_verify_args`), all before generation.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

INT64 = 2**63 - 1
# vLLM's --max-logprobs default (vllm/config: ModelConfig.max_logprobs = 20), OpenAI's top_logprobs limit too.
MAX_LOGPROBS = 20
# Choices one request may ask for: this server's own cap (each choice is a decode of its own; vLLM sets none).
MAX_N = 128


class TextPart(BaseModel):
    """A content part of type text (OpenAI's ChatCompletionContentPartTextParam); vLLM joins a message's text
    parts with newlines (vllm/entrypoints/chat_utils.py `_parse_chat_message_content_parts`, "\\n".join)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["text", "json_object", "json_schema", "structural_tag"]


class Common(BaseModel):
    """The fields both endpoints share, in vLLM's order."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    frequency_penalty: float | None = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(0.0, ge=-2.0, le=2.0)
    # OpenAI's API reference: token ids (JSON keys are strings) to a bias from -100 to 100.
    logit_bias: dict[str, float] | None = None
    n: int | None = Field(1, ge=1, le=MAX_N)
    seed: int | None = Field(None, ge=-INT64 - 1, le=INT64)
    stop: str | list[str] | None = Field(default_factory=list)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    user: str | None = None
    response_format: ResponseFormat | None = None
    best_of: int | None = None
    use_beam_search: bool = False
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    length_penalty: float = 1.0
    stop_token_ids: list[int] | None = Field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = Field(None, ge=1)
    allowed_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    priority: int = 0
    request_id: str | None = None
    logits_processors: list[Any] | None = None
    return_tokens_as_token_ids: bool | None = None
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @model_validator(mode="after")
    def _shared_rules(self) -> Common:
        if self.stream_options is not None and not self.stream:
            # vLLM's ChatCompletionRequest/CompletionRequest validate_stream_options.
            raise ValueError("stream_options: only with stream=true")
        if any(not text for text in self.stops()):
            raise ValueError("stop: give non-empty strings")
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            # vllm/v1/engine/processor.py _validate_sampling_params: "allowed_token_ids is not None and empty!"
            raise ValueError("allowed_token_ids: give at least one token id, or leave it out")
        if self.top_k == 0:
            self.top_k = None  # vLLM: 0 (and -1) disable top-k
        for key, bias in (self.logit_bias or {}).items():
            if not key.lstrip("-").isdigit():
                raise ValueError(f"logit_bias: keys are token ids, got {key!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias: token {key}'s bias must be from -100 to 100, got {bias}")
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise ValueError(f"best_of: only equal to n ({self.n or 1}) here (no ranking of extra samples)")
        return self


class CompletionRequest(Common):
    prompt: str | list[int] | list[str] | list[list[int]] | None = None
    prompt_embeds: Any = None
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    max_tokens: int | None = Field(16, ge=1)  # vLLM's CompletionRequest default
    suffix: str | None = None
    add_special_tokens: bool = True  # vLLM: the post-processor's tokens (BOS) added to a completion's prompt

    @model_validator(mode="after")
    def _prompt(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and self.prompt and not isinstance(self.prompt[0], int):
            raise ValueError(
                "prompt: one prompt per request here (a string or a list of token ids), not a batch"
            )
        if self.prompt is None or self.prompt in ("", []):
            raise ValueError("prompt: required, a non-empty string or a list of token ids")
        if self.echo and self.logprobs is not None:
            raise ValueError(
                "echo with logprobs: the prompt's logprobs are not computed here; ask for one of them"
            )
        return self


class ChatCompletionRequest(Common):
    messages: list[Message] = Field(min_length=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(0, ge=0, le=MAX_LOGPROBS)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Any] | None = None
    tool_choice: Any = "none"
    parallel_tool_calls: bool | None = False
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    include_reasoning: bool = True
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # vLLM: the chat template writes the special tokens itself
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    structural_tag: str | None = None
    bad_words: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _chat(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs=true")  # vLLM check_logprobs
        if self.continue_final_message and self.add_generation_prompt:
            # vLLM check_generation_prompt
            raise ValueError("continue_final_message: not with add_generation_prompt (set it to false)")
        return self

    def new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# Fields this server refuses when set to anything but their default, and why.
REFUSED: dict[str, str] = {
    "prompt_embeds": "prompt embeddings need vLLM's --enable-prompt-embeds engine",
    "suffix": "vLLM refuses suffix too (serving_completion.py: 'suffix is not currently supported')",
    "use_beam_search": "beam search is not offered here",
    "length_penalty": "only beam search reads it",
    "prompt_logprobs": "the prompt's logprobs are not computed here",
    "guided_json": "guided decoding needs a grammar backend (xgrammar, outlines)",
    "guided_regex": "guided decoding needs a grammar backend",
    "guided_choice": "guided decoding needs a grammar backend",
    "guided_grammar": "guided decoding needs a grammar backend",
    "guided_decoding_backend": "guided decoding needs a grammar backend",
    "guided_whitespace_pattern": "guided decoding needs a grammar backend",
    "structural_tag": "guided decoding needs a grammar backend",
    "logits_processors": "vLLM refuses them too unless started with --logits-processor-pattern",
    "kv_transfer_params": "no disaggregated serving here",
    "vllm_xargs": "no custom extensions here",
    "priority": "one request at a time: no priority scheduling (vLLM refuses it without --scheduling-policy)",
    "spaces_between_special_tokens": "the fast tokenizer's decode has no such switch",
    "tools": "no tool-call parser here",
    "reasoning_effort": "no reasoning parser here",
    "mm_processor_kwargs": "a text-only model",
    "bad_words": "not implemented here",
}


def refused_fields(request: Common) -> list[tuple[str, str]]:
    """The fields set to something this server does not do, with the reason (the first one refuses it)."""
    found = []
    for name, why in REFUSED.items():
        value = getattr(request, name, None)
        field = type(request).model_fields.get(name)
        if field is None or value in (None, [], {}) or value == field.get_default(call_default_factory=True):
            continue
        found.append((name, why))
    if isinstance(request.response_format, ResponseFormat) and request.response_format.type != "text":
        found.append(("response_format", f"type {request.response_format.type!r} needs a grammar backend"))
    if isinstance(request, ChatCompletionRequest) and request.tool_choice not in ("none", None):
        found.append(("tool_choice", "no tool-call parser here"))
    if request.stream_options is not None and request.stream_options.continuous_usage_stats:
        found.append(("stream_options.continuous_usage_stats", "usage is reported in the last chunk only"))
    return found
