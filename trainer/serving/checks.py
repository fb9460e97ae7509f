"""What a generation request must be before it reaches the model, each refusal a 4xx in OpenAI's error shape
(`{"error": {"message", "type", "param", "code"}}`, as the openai client reads it) that names what is wrong:

- the served model's name (404, as vLLM answers a model it does not serve: vllm/entrypoints/openai/serving_engine.py
  `_check_model`, "The model `X` does not exist.");
- a JSON object with the endpoint's required fields of the right types (400): `transformers serve` checks only
  for unknown fields (422) and answers a missing `messages` with a 500 (transformers 5.24.0
  cli/serving/chat_completion.py reads body["messages"] unchecked);
- a prompt that fits the context with its new tokens (400): `transformers serve` has no such check and, with no
  `max_tokens`, asks for 1024 new tokens (cli/serving/utils.py `_build_generation_config`), past the positions the
  model was trained at. vLLM's rule: no `max_tokens` means the rest of the context, and a prompt plus its
  `max_tokens` over the context is refused ("This model's maximum context length is N tokens. However, you
  requested ..."; vllm/entrypoints/openai/api_server.py `_check_length`, before the v1 engine).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
GENERATION = (COMPLETIONS, CHAT)
ROLES = ("system", "user", "assistant")


class Refusal(Exception):
    """A request answered with a 4xx before it reaches the model."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> bytes:
        kind = "NotFoundError" if self.status == 404 else "invalid_request_error"
        error = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return json.dumps({"error": error}).encode()


@dataclass(frozen=True)
class Checked:
    body: bytes  # what the model's handler receives: max_tokens set where the request left it out
    prompt_tokens: int


class RequestChecks:
    """The served model's name, its tokenizer (an AutoTokenizer of the export, rendering chats as the handler
    does) and its context (generation_config.json's max_length: the sequence length it was trained at)."""

    def __init__(self, model: str, tokenizer: Any, context: int) -> None:
        self.model, self.tokenizer, self.context = model, tokenizer, context

    def check(self, path: str, raw: bytes) -> Checked:
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise Refusal(400, f"the request body is not JSON: {error}") from None
        if not isinstance(body, dict):
            raise Refusal(400, f"the request body must be a JSON object, got {type(body).__name__}")
        model = body.get("model")
        if not isinstance(model, str):
            raise Refusal(400, f"'model' is required: a string, the served model {self.model!r}", "model")
        if model != self.model:
            raise Refusal(
                404,
                f"The model `{model}` does not exist. This server serves `{self.model}`.",
                "model",
                "model_not_found",
            )
        prompt = self._prompt_tokens(path, body)
        key = "max_completion_tokens" if path == CHAT and "max_completion_tokens" in body else "max_tokens"
        requested = body.get(key)
        if requested is not None and (
            isinstance(requested, bool) or not isinstance(requested, int) or requested < 1
        ):
            raise Refusal(400, f"'{key}' must be a positive integer, got {requested!r}", key)
        new = requested if requested is not None else self.context - prompt
        if prompt + new > self.context or new < 1:
            raise Refusal(
                400,
                f"This model's maximum context length is {self.context} tokens. However, you requested "
                f"{prompt + max(new, 1)} tokens ({prompt} in the messages, {max(new, 1)} in the completion). Please "
                "reduce the length of the messages or completion.",
                "messages" if path == CHAT else "prompt",
                "context_length_exceeded",
            )
        if requested is None:
            body[key] = new
        return Checked(json.dumps(body).encode(), prompt)

    def _prompt_tokens(self, path: str, body: dict) -> int:
        """The prompt's tokens as the handler makes them: the prompt through the tokenizer (completions), the
        messages through the chat template with the generation prompt (chat)."""
        if path == COMPLETIONS:
            prompt = body.get("prompt")
            if not isinstance(prompt, str) or not prompt:
                raise Refusal(400, f"'prompt' must be a non-empty string, got {prompt!r}", "prompt")
            return len(self.tokenizer(prompt)["input_ids"])
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Refusal(400, "'messages' must be a non-empty list of {role, content} objects", "messages")
        for index, message in enumerate(messages):
            if not (
                isinstance(message, dict)
                and message.get("role") in ROLES
                and isinstance(message.get("content"), str)
            ):
                raise Refusal(
                    400,
                    f"messages[{index}] must be an object with a 'role' ({', '.join(ROLES)}) and a string "
                    f"'content', got {json.dumps(message)[:200]}",
                    f"messages[{index}]",
                )
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return len(ids["input_ids"])
