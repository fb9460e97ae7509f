"""The OpenAI-compatible API over one export, answering as vLLM's server does (vllm/entrypoints/openai/
serving_completion.py and serving_chat.py: the response and stream chunk shapes, usage summed over choices,
usage in a stream's last chunk only with stream_options.include_usage): /v1/completions, /v1/chat/completions
(both streaming with "stream": true), /v1/models and /health. Each request is checked whole before the model sees
it (trainer/serving/checks.py); the model answers one request at a time (a CPU server has no continuous batching).
Around it, as an ASGI wrapper, the metrics (trainer/serving/metrics.py, at /metrics).

transformers serve (which this replaced) never samples: it sets a temperature but leaves generation_config's
do_sample off, and ignores n, logprobs, penalties and seeds (transformers 5.24.0 cli/serving/utils.py
`_build_generation_config`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from trainer.contract import metrics as registry
from trainer.serving.checks import CHAT, COMPLETIONS, GENERATION, Job, Refusal, check
from trainer.serving.engine import Engine, Step
from trainer.serving.metrics import ServingMetrics
from trainer.serving.sampling import SamplingParams

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
ENDPOINTS = (*GENERATION, "/v1/models", "/health")


def api(engine: Engine, metrics: ServingMetrics) -> Any:
    """The Starlette application (FastAPI's own base) answering the OpenAI API for `engine`'s model."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    turn = asyncio.Lock()

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def models(request: Request) -> Response:
        card = {"id": engine.name, "object": "model", "created": int(time.time()), "owned_by": "trainstack"}
        return JSONResponse({"object": "list", "data": [{**card, "max_model_len": engine.context}]})

    async def generate(request: Request) -> Response:
        path = request.url.path
        try:
            job = check(path, await request.body(), engine)
        except Refusal as refusal:
            return Response(refusal.body(), status_code=refusal.status, media_type="application/json")
        metrics.child(registry.SERVING_PROMPT_TOKENS, path).inc(len(job.prompt) * len(job.choices()))
        answer = Answer(job, engine, metrics)
        if job.request.stream:
            return StreamingResponse(answer.stream(turn), media_type="text/event-stream")
        async with turn:
            body = await asyncio.to_thread(answer.whole)
        return JSONResponse(body)

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route(COMPLETIONS, generate, methods=["POST"]),
            Route(CHAT, generate, methods=["POST"]),
        ]
    )


class Answer:
    """One request's answer, whole or as server-sent events."""

    def __init__(self, job: Job, engine: Engine, metrics: ServingMetrics) -> None:
        self.job, self.engine, self.metrics = job, engine, metrics
        self.chat = job.path == CHAT
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{job.request.request_id or uuid.uuid4().hex}"
        self.created = int(time.time())
        self.generated = 0

    def whole(self) -> dict:
        choices = []
        for index, params in enumerate(self.job.choices()):
            steps = list(self._steps(params))
            text = self.job.echo + "".join(step.text for step in steps)
            logprobs = self._logprobs(steps, params) if params.logprobs is not None else None
            choice: dict[str, Any] = {
                "index": index,
                "logprobs": logprobs,
                "finish_reason": steps[-1].finish_reason,
            }
            if self.chat:
                choice["message"] = {"role": self.job.role, "content": text}
            else:
                choice["text"] = text
            choices.append(choice)
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.engine.name,
            "choices": choices,
            "usage": self._usage(),
        }

    async def stream(self, turn: asyncio.Lock) -> AsyncIterator[bytes]:
        async with turn:
            for index, params in enumerate(self.job.choices()):
                if self.chat:
                    yield self._event(
                        [{"index": index, "delta": {"role": self.job.role, "content": self.job.echo}}]
                    )
                elif self.job.echo:
                    yield self._event([{"index": index, "text": self.job.echo}])
                steps = self._steps(params)
                while (step := await asyncio.to_thread(next, steps, None)) is not None:
                    logprobs = self._logprobs([step], params) if params.logprobs is not None else None
                    choice: dict[str, Any] = {
                        "index": index,
                        "logprobs": logprobs,
                        "finish_reason": step.finish_reason,
                    }
                    choice.update({"delta": {"content": step.text}} if self.chat else {"text": step.text})
                    yield self._event([choice])
            options = self.job.request.stream_options
            if options is not None and options.include_usage:
                yield self._event([], usage=self._usage())
            yield b"data: [DONE]\n\n"

    def _steps(self, params: SamplingParams) -> Any:
        for step in self.engine.generate(self.job.prompt, params):
            self.generated += 1
            self.metrics.child(registry.SERVING_COMPLETION_TOKENS, self.job.path).inc()
            yield step

    def _event(self, choices: list[dict], usage: dict | None = None) -> bytes:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.engine.name,
            "choices": choices,
        }
        if usage is not None:
            chunk["usage"] = usage
        return f"data: {json.dumps(chunk)}\n\n".encode()

    def _usage(self) -> dict:
        prompt = len(self.job.prompt)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.generated,
            "total_tokens": prompt + self.generated,
        }

    def _token(self, token: int) -> str:
        if self.job.request.return_tokens_as_token_ids:
            return f"token_id:{token}"
        return self.engine.token_text(token)

    def _logprobs(self, steps: list[Step], params: SamplingParams) -> dict:
        """OpenAI's logprobs object: a chat's `content` list, or a completion's parallel lists (each top dict holds
        the chosen token besides the `logprobs` likeliest, as vLLM's does)."""
        if self.chat:
            return {
                "content": [
                    {
                        "token": (text := self._token(step.token)),
                        "logprob": step.logprob,
                        "bytes": list(text.encode()),
                        "top_logprobs": [
                            {"token": (alt := self._token(t)), "logprob": lp, "bytes": list(alt.encode())}
                            for t, lp in step.top
                        ],
                    }
                    for step in steps
                ]
            }
        offsets, at = [], len(self.job.echo)
        for step in steps:
            offsets.append(at)
            at += len(step.text)
        return {
            "tokens": [self._token(step.token) for step in steps],
            "token_logprobs": [step.logprob for step in steps],
            "top_logprobs": [
                {self._token(t): lp for t, lp in [*step.top, (step.token, step.logprob)]} for step in steps
            ],
            "text_offset": offsets,
        }


class Served:
    """The ASGI application the server runs: /metrics, then every request measured."""

    def __init__(self, inner: ASGIApp, metrics: ServingMetrics) -> None:
        self.inner, self.metrics = inner, metrics

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
        seen: dict[str, Any] = {"status": 500, "first": None}
        in_flight = self.metrics.child(registry.SERVING_IN_FLIGHT, endpoint)
        in_flight.inc()

        async def measured(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
            elif message["type"] == "http.response.body" and message.get("body") and seen["first"] is None:
                seen["first"] = time.perf_counter()
            await send(message)

        try:
            await self.inner(scope, receive, measured)
        finally:
            in_flight.dec()
            ended = time.perf_counter()
            self.metrics.child(registry.SERVING_REQUESTS, endpoint, status=str(seen["status"])).inc()
            self.metrics.child(registry.SERVING_REQUEST_TIME, endpoint).inc(ended - started)
            if seen["first"] is not None:
                self.metrics.child(registry.SERVING_FIRST_BYTE_TIME, endpoint).inc(seen["first"] - started)


def build(export: Path, labels: dict[str, str]) -> Served:
    """The served application for the export directory `export`."""
    engine = Engine(export)
    metrics = ServingMetrics(labels | {"model": engine.name})
    return Served(api(engine, metrics), metrics)
