"""The OpenAI-compatible API over one export: `transformers serve`'s own application (transformers 5.24.0
cli/serving/server.py `build_server`: /v1/completions, /v1/chat/completions, streaming, /v1/models, /health),
built with its handlers as its `Serve` command builds them (cli/serve.py), pinned to the one model (`force_model`,
loaded before the server listens). Around it, as an ASGI wrapper: the request checks (trainer/serving/checks.py)
and the metrics (trainer/serving/metrics.py, at /metrics). Nothing here generates: the model, its chat template
and generation_config.json's stop ids are transformers' own reading of the export.

The model's name on the API is the version's, which is the export directory's name: transformers keeps a local
path as the model's id (cli/serving/model_manager.py `process_model_name`), so the server runs in the directory
that holds the export (trainer/serving/command.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from trainer.contract import metrics as registry
from trainer.serving.checks import GENERATION, Refusal, RequestChecks
from trainer.serving.metrics import ServingMetrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
ENDPOINTS = (*GENERATION, "/v1/models", "/health")
# The usage an answer reports (a JSON body, or a stream's last chunk): its generated tokens.
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')


def transformers_app(model: str) -> ASGIApp:
    """transformers serve's FastAPI application for the model directory `model` (relative to the working
    directory), on the CPU or the first GPU, in the export's dtype, one request at a time (no continuous
    batching: its paged attention wants CUDA)."""
    from transformers.cli.serving.chat_completion import ChatCompletionHandler
    from transformers.cli.serving.completion import CompletionHandler
    from transformers.cli.serving.model_manager import ModelManager
    from transformers.cli.serving.response import ResponseHandler
    from transformers.cli.serving.server import build_server
    from transformers.cli.serving.systemone import SystemOneHandler
    from transformers.cli.serving.transcription import TranscriptionHandler
    from transformers.cli.serving.utils import GenerationState

    manager = ModelManager(device="auto", dtype="auto", force_model=model)
    state = GenerationState(continuous_batching=False, compile=False, cb_config=None)
    return build_server(
        manager,
        ChatCompletionHandler(model_manager=manager, generation_state=state),
        completion_handler=CompletionHandler(model_manager=manager, generation_state=state),
        response_handler=ResponseHandler(model_manager=manager, generation_state=state),
        transcription_handler=TranscriptionHandler(manager, state),
        systemone_handler=SystemOneHandler(model_manager=manager, generation_state=state),
        generation_state=state,
    )


def context_of(export: Path) -> int:
    """The positions the model was trained at: generation_config.json's max_length (trainer/interop/convert.py
    writes the sequence length there), else config.json's max_position_embeddings."""
    import json

    generation = export / "generation_config.json"
    if generation.is_file() and (length := json.loads(generation.read_text()).get("max_length")):
        return int(length)
    return int(json.loads((export / "config.json").read_text())["max_position_embeddings"])


class Served:
    """The ASGI application the server runs: /metrics, then every request measured, generation requests checked
    before the model's handler sees them."""

    def __init__(self, inner: ASGIApp, checks: RequestChecks, metrics: ServingMetrics) -> None:
        self.inner, self.checks, self.metrics = inner, checks, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        path = scope["path"]
        if path == "/metrics":
            await self.metrics.app(scope, receive, send)
            return
        endpoint = path if path in ENDPOINTS else "other"
        started = time.perf_counter()
        seen: dict[str, Any] = {"status": 500, "first": None, "generated": None}
        in_flight = self.metrics.child(registry.SERVING_IN_FLIGHT, endpoint)
        in_flight.inc()

        async def measured(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
            elif message["type"] == "http.response.body" and message.get("body"):
                if seen["first"] is None:
                    seen["first"] = time.perf_counter()
                if found := _COMPLETION_TOKENS.findall(message["body"]):
                    seen["generated"] = int(found[-1])
            await send(message)

        try:
            if scope["method"] == "POST" and path in GENERATION:
                try:
                    checked = self.checks.check(path, await _body(receive))
                except Refusal as refusal:
                    await _refuse(refusal, measured)
                    return
                self.metrics.child(registry.SERVING_PROMPT_TOKENS, endpoint).inc(checked.prompt_tokens)
                scope = _with_length(scope, len(checked.body))
                receive = _replay(checked.body, receive)
            await self.inner(scope, receive, measured)
        finally:
            in_flight.dec()
            ended = time.perf_counter()
            self.metrics.child(registry.SERVING_REQUESTS, endpoint, status=str(seen["status"])).inc()
            self.metrics.child(registry.SERVING_REQUEST_TIME, endpoint).inc(ended - started)
            if seen["first"] is not None:
                self.metrics.child(registry.SERVING_FIRST_BYTE_TIME, endpoint).inc(seen["first"] - started)
            if seen["generated"] is not None:
                self.metrics.child(registry.SERVING_COMPLETION_TOKENS, endpoint).inc(seen["generated"])


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, then: Receive) -> Receive:
    """The checked body once, then the client's own messages (a stream listens on them for its disconnect)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return await then()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _with_length(scope: Scope, length: int) -> Scope:
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
    return {**scope, "headers": [*headers, (b"content-length", str(length).encode())]}


async def _refuse(refusal: Refusal, send: Send) -> None:
    body = refusal.body()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def build(export: Path, labels: dict[str, str]) -> Served:
    """The served application for the export directory `export` (the working directory must be its parent)."""
    from transformers import AutoTokenizer

    checks = RequestChecks(export.name, AutoTokenizer.from_pretrained(export), context_of(export))
    return Served(transformers_app(export.name), checks, ServingMetrics(labels | {"model": export.name}))
