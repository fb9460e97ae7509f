"""The request checks in front of transformers serve, without a server: each bad request refused with its 4xx and
a message naming the field, a request without max_tokens given the rest of the context (vLLM's rule), counted with
the same tokenizer and chat template the handler uses."""

from __future__ import annotations

import json

import pytest
from transformers import PreTrainedTokenizerFast

from trainer.data.chat_template import CHAT_TEMPLATE
from trainer.data.tokenizer import EOD_TOKEN, train_bpe
from trainer.serving.checks import CHAT, COMPLETIONS, Refusal, RequestChecks

CONTEXT = 32


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> RequestChecks:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    train_bpe(["the user asks and the assistant answers. " * 20], vocab_size=300).save(str(path))
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token=EOD_TOKEN)
    tokenizer.chat_template = CHAT_TEMPLATE
    return RequestChecks("tiny-s20-abcdef12", tokenizer, CONTEXT)


def body(**fields) -> bytes:
    return json.dumps({"model": "tiny-s20-abcdef12", **fields}).encode()


def test_a_request_without_max_tokens_gets_the_rest_of_the_context(checks):
    checked = checks.check(COMPLETIONS, body(prompt="the user asks"))
    assert checked.prompt_tokens == len(checks.tokenizer("the user asks")["input_ids"])
    assert json.loads(checked.body)["max_tokens"] == CONTEXT - checked.prompt_tokens
    chat = checks.check(
        CHAT, body(messages=[{"role": "user", "content": "the user asks"}], max_completion_tokens=3)
    )
    rendered = checks.tokenizer.apply_chat_template(
        [{"role": "user", "content": "the user asks"}], add_generation_prompt=True, tokenize=False
    )
    assert rendered == "<|user|>\nthe user asks\n<|assistant|>\n"
    assert chat.prompt_tokens == len(checks.tokenizer(rendered)["input_ids"])
    assert json.loads(chat.body)["max_completion_tokens"] == 3 and "max_tokens" not in json.loads(chat.body)


@pytest.mark.parametrize(
    ("path", "raw", "status", "message"),
    [
        (COMPLETIONS, b"{", 400, "the request body is not JSON"),
        (COMPLETIONS, b"[]", 400, "must be a JSON object, got list"),
        (COMPLETIONS, json.dumps({"prompt": "x"}).encode(), 400, "'model' is required"),
        (
            COMPLETIONS,
            json.dumps({"model": "gpt-4", "prompt": "x"}).encode(),
            404,
            "The model `gpt-4` does not exist",
        ),
        (COMPLETIONS, body(prompt=""), 400, "'prompt' must be a non-empty string"),
        (COMPLETIONS, body(prompt=["a", "b"]), 400, "'prompt' must be a non-empty string"),
        (COMPLETIONS, body(prompt="x", max_tokens=0), 400, "'max_tokens' must be a positive integer, got 0"),
        (COMPLETIONS, body(prompt="x", max_tokens="5"), 400, "'max_tokens' must be a positive integer"),
        (COMPLETIONS, body(prompt="the " * 40), 400, "maximum context length is 32 tokens"),
        (COMPLETIONS, body(prompt="the user", max_tokens=40), 400, "40 in the completion"),
        (CHAT, body(), 400, "'messages' must be a non-empty list"),
        (
            CHAT,
            body(messages=[{"role": "tool", "content": "x"}]),
            400,
            "messages[0] must be an object with a 'role'",
        ),
        (CHAT, body(messages=[{"role": "user", "content": 5}]), 400, "messages[0]"),
    ],
)
def test_bad_requests_are_refused_with_their_status_and_the_field(checks, path, raw, status, message):
    with pytest.raises(Refusal) as refused:
        checks.check(path, raw)
    assert refused.value.status == status and message in refused.value.message
    error = json.loads(refused.value.body())["error"]
    assert error["message"] == refused.value.message and set(error) == {"message", "type", "param", "code"}
