"""What a generation request must be before it reaches the model, each refusal a 4xx in OpenAI's error shape
(`{"error": {"message", "type", "param", "code"}}`, as the openai client reads it) that names what is wrong:

- the served model's name (404, as vLLM answers a model it does not serve: vllm/entrypoints/openai/serving_engine.py
  `_check_model`, "The model `X` does not exist.");
- a JSON object whose every field is one of vLLM's, of the right type and range (trainer/serving/protocol.py), and
  none that this server refuses (400 naming the field, FastAPI's 422 never reached);
- token ids inside the vocabulary (prompt ids, logit_bias, allowed_token_ids, stop_token_ids), as vLLM's v1
  processor checks them;
- a prompt that fits the context with its new tokens (400 `context_length_exceeded`, vLLM's message,
  vllm/entrypoints/openai/serving_engine.py `_validate_input`). Without `max_tokens` a chat gets the rest of the
  context and a completion 16 tokens (vLLM's ChatCompletionRequest and CompletionRequest defaults).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

from pydantic import ValidationError

from trainer.serving.protocol import ChatCompletionRequest, Common, CompletionRequest, refused_fields
from trainer.serving.sampling import SamplingParams

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
GENERATION = (COMPLETIONS, CHAT)


class Refusal(Exception):
    """A request answered with a 4xx before it reaches the model."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> bytes:
        kind = "NotFoundError" if self.status == 404 else "invalid_request_error"
        error = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return json.dumps({"error": error}).encode()


class Model(Protocol):
    """What the checks need of the served model (trainer/serving/engine.py Engine)."""

    name: str
    context: int
    vocab_size: int
    defaults: dict[str, Any]

    def completion_prompt(self, prompt: str | list[int], add_special_tokens: bool) -> list[int]: ...

    def render_chat(self, messages: list[dict], **template: Any) -> str: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


@dataclass(frozen=True)
class Job:
    """A checked request: its prompt's ids, each choice's sampling, and what the answer echoes."""

    path: str
    request: CompletionRequest | ChatCompletionRequest
    prompt: list[int]
    params: SamplingParams
    echo: str = ""
    role: str = "assistant"  # a chat answer's role

    def choices(self) -> list[SamplingParams]:
        """Choice i of n draws with seed + i (vllm/v1/engine/parallel_sampling.py `_get_child_sampling_params`)."""
        count = self.request.n or 1
        seed = self.params.seed
        return [replace(self.params, seed=None if seed is None else seed + i) for i in range(count)]


def check(path: str, raw: bytes, model: Model) -> Job:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise Refusal(400, f"the request body is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise Refusal(400, f"the request body must be a JSON object, got {type(body).__name__}")
    name = body.get("model")
    if not isinstance(name, str):
        raise Refusal(400, f"'model' is required: a string, the served model {model.name!r}", "model")
    if name != model.name:
        raise Refusal(
            404,
            f"The model `{name}` does not exist. This server serves `{model.name}`.",
            "model",
            "model_not_found",
        )
    request = _parsed(path, body)
    if refused := refused_fields(request):
        field, why = refused[0]
        raise Refusal(
            400, f"'{field}' is not supported by this server: {why}", field, "unsupported_parameter"
        )
    _check_token_ids(request, model.vocab_size)
    role = "assistant"
    if isinstance(request, CompletionRequest):
        # One string or one list of ids (CompletionRequest._prompt refuses a batch).
        given = cast("str | list[int]", request.prompt)
        prompt = model.completion_prompt(given, request.add_special_tokens)
        _check_ids(prompt, model.vocab_size, "prompt")
        echo = request.prompt if request.echo and isinstance(request.prompt, str) else ""
        requested = request.max_tokens
    else:
        rendered = _rendered(request, model)
        prompt = model.completion_prompt(rendered, request.add_special_tokens)
        last = request.messages[-1]
        # vllm serving_chat.py get_chat_request_role: without a generation prompt the answer continues the last
        # message in its role; echo prepends the last message when it is in the answer's role.
        role = "assistant" if request.add_generation_prompt else last.role
        echo = last.text() if request.echo and last.role == role else ""
        requested = request.new_tokens()
    if request.truncate_prompt_tokens is not None:
        prompt = prompt[-request.truncate_prompt_tokens :]
    if isinstance(request, CompletionRequest) and request.echo and isinstance(request.prompt, list):
        # vllm/entrypoints/openai/serving_engine.py _normalize_prompt_tokens_to_input: token ids echo as
        # tokenizer.decode(ids), after truncation.
        echo = model.decode(prompt, skip_special_tokens=False)
    new = requested if requested is not None else model.context - len(prompt)
    if len(prompt) + new > model.context or new < 1:
        raise Refusal(
            400,
            f"This model's maximum context length is {model.context} tokens. However, you requested "
            f"{len(prompt) + max(new, 1)} tokens ({len(prompt)} in the messages, {max(new, 1)} in the completion). "
            "Please reduce the length of the messages or completion.",
            "messages" if path == CHAT else "prompt",
            "context_length_exceeded",
        )
    if (
        request.min_tokens > new
    ):  # vllm/sampling_params.py SamplingParams._verify_args, against the max it serves
        raise Refusal(
            400,
            f"'min_tokens': must be less than or equal to max_tokens={new}, got {request.min_tokens}",
            "min_tokens",
            "invalid_value",
        )
    return Job(path, request, prompt, sampling(request, new, model.defaults), echo, role)


def _parsed(path: str, body: dict) -> CompletionRequest | ChatCompletionRequest:
    kind = CompletionRequest if path == COMPLETIONS else ChatCompletionRequest
    try:
        return kind.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"] if part not in ("str", "list[int]"))
        if first["type"] == "extra_forbidden":
            known = ", ".join(sorted(kind.model_fields))
            message = f"'{where}' is not a field of {path} (its fields: {known})"
            raise Refusal(400, message, where, "unknown_parameter") from None
        reason = first["msg"].removeprefix("Value error, ")
        if not where:  # a rule over several fields (protocol.py's validators): "field: why"
            where, _, reason = reason.partition(": ")
            raise Refusal(400, f"'{where}': {reason}", where, "invalid_value") from None
        got = json.dumps(first.get("input"))[:100]
        raise Refusal(400, f"'{where}': {reason}, got {got}", where, "invalid_value") from None


def _rendered(request: ChatCompletionRequest, model: Model) -> str:
    # vllm/entrypoints/openai/serving_engine.py _preprocess_chat: the request's template fields, then
    # chat_template_kwargs over them.
    template: dict[str, Any] = {
        "add_generation_prompt": request.add_generation_prompt,
        "continue_final_message": request.continue_final_message,
    }
    if request.chat_template is not None:
        template["chat_template"] = request.chat_template
    if request.documents is not None:
        template["documents"] = request.documents
    template.update(request.chat_template_kwargs or {})
    # vllm/entrypoints/chat_utils.py _parse_chat_message_content keeps a message's name for the template.
    messages = [
        {"role": m.role, "content": m.text(), **({"name": m.name} if m.name is not None else {})}
        for m in request.messages
    ]
    try:
        return model.render_chat(messages, **template)
    except Exception as error:  # a template's own error (jinja's, or raise_exception): the request's fault
        raise Refusal(400, f"the chat template cannot render these messages: {error}", "messages") from None


def _check_ids(ids: list[int], vocab_size: int, field: str) -> None:
    if bad := [i for i in ids if not 0 <= i < vocab_size]:
        raise Refusal(
            400, f"'{field}': token id {bad[0]} is out of vocabulary (0 to {vocab_size - 1})", field
        )


def _check_token_ids(request: Common, vocab_size: int) -> None:
    _check_ids([int(key) for key in request.logit_bias or {}], vocab_size, "logit_bias")
    _check_ids(list(request.allowed_token_ids or []), vocab_size, "allowed_token_ids")
    _check_ids(list(request.stop_token_ids or []), vocab_size, "stop_token_ids")


def sampling(
    request: CompletionRequest | ChatCompletionRequest, max_tokens: int, defaults: dict
) -> SamplingParams:
    """vLLM's to_sampling_params: the request's value, else generation_config.json's, else vLLM's default."""

    def given(name: str, fallback: Any) -> Any:
        value = getattr(request, name)
        return value if value is not None else defaults.get(name, fallback)

    if isinstance(request, CompletionRequest):
        logprobs = request.logprobs
    else:
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=float(given("temperature", 1.0)),
        top_p=float(given("top_p", 1.0)),
        top_k=given("top_k", None) or None,
        min_p=float(given("min_p", 0.0)),
        presence_penalty=float(request.presence_penalty or 0.0),
        frequency_penalty=float(request.frequency_penalty or 0.0),
        repetition_penalty=float(given("repetition_penalty", 1.0)),
        logit_bias={int(k): float(v) for k, v in (request.logit_bias or {}).items()},
        allowed_token_ids=tuple(request.allowed_token_ids) if request.allowed_token_ids is not None else None,
        seed=request.seed,
        min_tokens=request.min_tokens,
        stop=request.stops(),
        stop_token_ids=tuple(request.stop_token_ids or ()),
        include_stop_str_in_output=request.include_stop_str_in_output,
        ignore_eos=request.ignore_eos,
        logprobs=logprobs,
        skip_special_tokens=request.skip_special_tokens,
    )
