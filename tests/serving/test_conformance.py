"""The OpenAI conformance suite: every request field of vLLM's CompletionRequest and ChatCompletionRequest
(vllm/entrypoints/openai/protocol.py at commit 0052bed; trainer/serving/protocol.py lists them) has a row saying
what it does, driven with the official openai client against `trainer serve --export` over a Llama-3-style export
(tests/support/llama3_export.py: <|begin_of_text|> from the post-processor, <|eot_id|> apart from
<|end_of_text|>, Llama 3's template), one server for the module.

With BASE_URL=http://host:port (and MODEL=, END_OF_TURN_ID= where the endpoint's model is another) the same rows
judge that endpoint (a vLLM one): each honoured row's effect is checked the same way (model-independent checks:
equal texts, supports, counts, a chi-square); a row this server refuses only has to be answered there with a 200 or
a 400 in OpenAI's error shape, never a 5xx. docs/serving.md, "The conformance suite".
"""

from __future__ import annotations

import inspect
import json
import math
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import openai
import pytest

pytestmark = pytest.mark.slow  # a server per module: the export's build and the model's load, about a minute

COMPLETION, CHAT = "completion", "chat"
PROMPT = "the tiger plays"
MESSAGES = [{"role": "user", "content": "the tiger plays"}]
# The chi-square quantile for 4 degrees of freedom at 0.001 (any statistics table; scipy.stats.chi2.ppf(0.999, 4)).
CHI2_4_999 = 18.467


def create(endpoint, kind: str, **fields: Any) -> Any:
    """One request with the openai client: its own parameters as arguments, vLLM's others in extra_body."""
    client = endpoint.client()
    method = client.completions.create if kind == COMPLETION else client.chat.completions.create
    known = inspect.signature(method).parameters
    base = {"prompt": PROMPT} if kind == COMPLETION else {"messages": MESSAGES}
    given = {**base, **fields}
    arguments = {key: value for key, value in given.items() if key in known}
    extra = {key: value for key, value in given.items() if key not in known}
    return method(model=endpoint.model, **arguments, extra_body=extra or None)


def text(answer: Any, index: int = 0) -> str:
    choice = answer.choices[index]
    return choice.text if hasattr(choice, "text") else choice.message.content


def token_ids(answer: Any, index: int = 0) -> list[int]:
    """The chosen tokens' ids (a request with logprobs and return_tokens_as_token_ids)."""
    logprobs = answer.choices[index].logprobs
    tokens = logprobs.tokens if hasattr(logprobs, "tokens") else [item.token for item in logprobs.content]
    return [int(token.removeprefix("token_id:")) for token in tokens]


def first_token_draws(endpoint, kind: str, draws: int, **fields: Any) -> tuple[list[int], dict[int, float]]:
    """`draws` one-token samples (n per request, seeds 0, 1, ...) and the first position's 20 likeliest tokens'
    raw log-probabilities."""
    logprobs = {"logprobs": 20} if kind == COMPLETION else {"logprobs": True, "top_logprobs": 20}
    drawn: list[int] = []
    top: dict[int, float] = {}
    while len(drawn) < draws:
        n = min(100, draws - len(drawn))
        answer = create(
            endpoint,
            kind,
            max_tokens=1,
            n=n,
            seed=len(drawn),
            return_tokens_as_token_ids=True,
            **logprobs,
            **fields,
        )
        for index in range(n):
            drawn += token_ids(answer, index)
        first = answer.choices[0].logprobs
        items = (
            first.top_logprobs[0].items()
            if hasattr(first, "top_logprobs")
            else ((alt.token, alt.logprob) for alt in first.content[0].top_logprobs)
        )
        top = {int(token.removeprefix("token_id:")): logprob for token, logprob in items}
    return drawn, top


def greedy(endpoint, kind: str, tokens: int = 12, **fields: Any) -> Any:
    logprobs = {"logprobs": 0} if kind == COMPLETION else {"logprobs": True}
    return create(
        endpoint,
        kind,
        temperature=0,
        max_tokens=tokens,
        ignore_eos=True,
        return_tokens_as_token_ids=True,
        **logprobs,
        **fields,
    )


def end_of_turn(endpoint) -> int:
    if endpoint.export is not None:
        return int(endpoint.tokenizer().convert_tokens_to_ids("<|eot_id|>"))
    if "END_OF_TURN_ID" not in os.environ:
        pytest.skip("END_OF_TURN_ID= (the endpoint model's end-of-turn id) is not given")
    return int(os.environ["END_OF_TURN_ID"])


# ---- the effect of each honoured field: fn(endpoint, kind) ----


def model_is_checked(endpoint, kind):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        endpoint.client().completions.create(model="gpt-4", prompt=PROMPT, max_tokens=2)


def prompt_as_token_ids(endpoint, kind):
    answer = create(endpoint, kind, prompt=[5, 6, 7, 8], max_tokens=2)
    assert answer.usage.prompt_tokens == 4
    if endpoint.ours:
        refused(endpoint, kind, "prompt", prompt=["one", "two"])


def messages_as_text_parts(endpoint, kind):
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "the tiger"}, {"type": "text", "text": "plays"}],
        }
    ]
    joined = [{"role": "user", "content": "the tiger\nplays"}]
    one, other = greedy(endpoint, kind, messages=parts), greedy(endpoint, kind, messages=joined)
    assert text(one) == text(other) and one.usage.prompt_tokens == other.usage.prompt_tokens


def distinct(answer: Any) -> int:
    return len(set(token_ids(answer)))


def penalty(name: str, high: float, low: float) -> Callable:
    def check(endpoint, kind):
        assert distinct(greedy(endpoint, kind, 24, **{name: high})) > distinct(
            greedy(endpoint, kind, 24, **{name: low})
        )

    return check


def logit_bias(endpoint, kind):
    favoured = token_ids(greedy(endpoint, kind, 3))[1]
    answer = greedy(endpoint, kind, 4, logit_bias={favoured: 100})  # integer keys, as OpenAI documents them
    assert token_ids(answer) == [favoured] * 4


def logprobs(endpoint, kind):
    fields = {"logprobs": 3} if kind == COMPLETION else {"logprobs": True, "top_logprobs": 3}
    # Token ids as the tokens: several byte tokens decode to the same "\ufffd" and would share a key.
    answer = create(
        endpoint, kind, max_tokens=4, ignore_eos=True, seed=1, return_tokens_as_token_ids=True, **fields
    )
    got = answer.choices[0].logprobs
    if kind == COMPLETION:
        assert len(got.tokens) == 4 and all(lp <= 0 for lp in got.token_logprobs)
        assert all(len(top) in (3, 4) for top in got.top_logprobs)
        assert all(
            top.get(t, lp) == pytest.approx(lp)
            for t, lp, top in zip(got.tokens, got.token_logprobs, got.top_logprobs, strict=True)
        )
    else:
        assert len(got.content) == 4 and all(
            len(item.top_logprobs) == 3 and item.logprob <= 0 for item in got.content
        )
        refused(endpoint, kind, "top_logprobs", logprobs=False, top_logprobs=2, always=True)


def new_tokens(name: str) -> Callable:
    def check(endpoint, kind):
        answer = create(endpoint, kind, ignore_eos=True, seed=0, **{name: 5})
        assert answer.usage.completion_tokens == 5 and answer.choices[0].finish_reason == "length"

    return check


def n_choices(endpoint, kind):
    answer = create(endpoint, kind, n=3, max_tokens=3, ignore_eos=True, seed=2)
    assert [choice.index for choice in answer.choices] == [0, 1, 2] and answer.usage.completion_tokens == 9


def seed(endpoint, kind):
    """Same seed, same answer; other seeds, other answers; choice i of n is seed + i's (vLLM's parallel sampling)."""
    fields = {"temperature": 1.0, "max_tokens": 8, "ignore_eos": True}
    assert text(create(endpoint, kind, seed=7, **fields)) == text(create(endpoint, kind, seed=7, **fields))
    assert len({text(create(endpoint, kind, seed=s, **fields)) for s in range(8)}) >= 4
    together = create(endpoint, kind, seed=7, n=3, **fields)
    assert [text(together, i) for i in range(3)] == [
        text(create(endpoint, kind, seed=7 + i, **fields)) for i in range(3)
    ]


def temperature(endpoint, kind):
    """Greedy at 0; at 0.7 the first token's draws follow softmax(logits / 0.7) over the top 5 (top_k=5): a
    chi-square test of 400 seeded draws against the probabilities the endpoint reports."""
    assert text(greedy(endpoint, kind)) == text(greedy(endpoint, kind))
    drawn, top = first_token_draws(endpoint, kind, 400, temperature=0.7, top_k=5)
    likeliest = sorted(top, key=top.get, reverse=True)[:5]
    weights = {token: math.exp(top[token] / 0.7) for token in likeliest}
    total = sum(weights.values())
    counts = Counter(drawn)
    assert set(counts) <= set(likeliest)
    chi2 = sum((counts[t] - 400 * w / total) ** 2 / (400 * w / total) for t, w in weights.items())
    assert chi2 < CHI2_4_999, (counts, weights)


def top_p(endpoint, kind):
    drawn, top = first_token_draws(endpoint, kind, 100, temperature=1.0, top_p=0.6)
    ordered = sorted(top, key=top.get, reverse=True)
    mass = [sum(math.exp(top[t]) for t in ordered[:i]) for i in range(len(ordered))]
    nucleus = {t for t, before in zip(ordered, mass, strict=True) if before < 0.6}
    assert set(drawn) <= nucleus and len(set(drawn)) > 1


def top_k(endpoint, kind):
    drawn, top = first_token_draws(endpoint, kind, 100, temperature=1.0, top_k=2)
    assert set(drawn) == set(sorted(top, key=top.get, reverse=True)[:2])


def min_p(endpoint, kind):
    drawn, top = first_token_draws(endpoint, kind, 100, temperature=1.0, min_p=0.3)
    peak = max(top.values())
    assert {t for t in drawn} <= {t for t, lp in top.items() if lp >= peak + math.log(0.3)}


def stop(endpoint, kind):
    whole = text(greedy(endpoint, kind, 16))
    word = whole[len(whole) // 2 : len(whole) // 2 + 2]
    answer = greedy(endpoint, kind, 16, stop=[word])
    assert text(answer) == whole[: whole.index(word)] and answer.choices[0].finish_reason == "stop"
    kept = greedy(endpoint, kind, 16, stop=word, include_stop_str_in_output=True)
    assert text(kept) == whole[: whole.index(word) + len(word)]


def stop_token_ids(endpoint, kind):
    ids = token_ids(greedy(endpoint, kind, 12))
    answer = greedy(endpoint, kind, 12, stop_token_ids=[ids[3]])
    assert (
        answer.usage.completion_tokens == ids.index(ids[3]) + 1 and answer.choices[0].finish_reason == "stop"
    )


def ignore_eos(endpoint, kind):
    eot = end_of_turn(endpoint)
    answer = create(endpoint, kind, logit_bias={eot: 100}, ignore_eos=True, max_tokens=3)
    assert answer.usage.completion_tokens == 3 and answer.choices[0].finish_reason == "length"


def min_tokens(endpoint, kind):
    eot = end_of_turn(endpoint)
    answer = create(endpoint, kind, logit_bias={eot: 100}, min_tokens=2, max_tokens=6, temperature=0)
    assert answer.usage.completion_tokens == 3 and answer.choices[0].finish_reason == "stop"


def skip_special_tokens(endpoint, kind):
    eot = end_of_turn(endpoint)
    fields = {"logit_bias": {eot: 100}, "ignore_eos": True, "max_tokens": 2}
    assert text(create(endpoint, kind, **fields)) == ""
    shown = text(create(endpoint, kind, skip_special_tokens=False, **fields))
    assert shown.count("<|eot_id|>" if endpoint.ours else "<") == 2


def truncate_prompt_tokens(endpoint, kind):
    assert create(endpoint, kind, truncate_prompt_tokens=2, max_tokens=1).usage.prompt_tokens == 2


def allowed_token_ids(endpoint, kind):
    allowed = token_ids(greedy(endpoint, kind, 4))[:2]
    answer = create(endpoint, kind, allowed_token_ids=allowed, n=8, max_tokens=3, seed=0, **ids_fields(kind))
    assert all(set(token_ids(answer, i)) <= set(allowed) for i in range(8))


def ids_fields(kind: str) -> dict:
    logprobs = {"logprobs": 0} if kind == COMPLETION else {"logprobs": True}
    return {"return_tokens_as_token_ids": True, **logprobs}


def best_of(endpoint, kind):
    assert len(create(endpoint, kind, n=2, best_of=2, max_tokens=2).choices) == 2
    if endpoint.ours:
        refused(endpoint, kind, "best_of", n=1, best_of=3)


def echo(endpoint, kind):
    if kind == COMPLETION:
        assert text(create(endpoint, kind, echo=True, max_tokens=3)).startswith(PROMPT)
        return
    messages = [*MESSAGES, {"role": "assistant", "content": "the cat"}]
    answer = create(
        endpoint,
        kind,
        messages=messages,
        echo=True,
        add_generation_prompt=False,
        continue_final_message=True,
        max_tokens=3,
    )
    assert text(answer).startswith("the cat")


def stream(endpoint, kind):
    whole = text(greedy(endpoint, kind, 10))
    chunks = list(greedy(endpoint, kind, 10, stream=True, stream_options={"include_usage": True}))
    pieces = [
        c.choices[0].text if kind == COMPLETION else c.choices[0].delta.content or ""
        for c in chunks
        if c.choices
    ]
    assert "".join(pieces) == whole and chunks[-1].usage.completion_tokens == 10
    refused(
        endpoint, kind, "stream_options", stream=False, stream_options={"include_usage": True}, always=True
    )


def stream_options(endpoint, kind):
    plain = list(create(endpoint, kind, stream=True, max_tokens=2))
    assert all(chunk.usage is None for chunk in plain)
    if endpoint.ours:
        refused(
            endpoint,
            kind,
            "stream_options.continuous_usage_stats",
            stream=True,
            stream_options={"continuous_usage_stats": True},
        )


def accepted(endpoint, kind, **fields) -> Any:
    answer = create(endpoint, kind, max_tokens=2, **fields)
    assert answer.choices
    return answer


def request_id(endpoint, kind):
    assert accepted(endpoint, kind, request_id="conformance-1").id.endswith("conformance-1")


def response_format(endpoint, kind):
    accepted(endpoint, kind, response_format={"type": "text"})
    if endpoint.ours:
        refused(endpoint, kind, "response_format", response_format={"type": "json_object"})


def add_special_tokens(endpoint, kind):
    """The one BOS rule: a completion gets the post-processor's BOS, a rendered chat not a second one."""
    if kind == COMPLETION:
        with_bos = create(endpoint, kind, max_tokens=1).usage.prompt_tokens
        assert (
            create(endpoint, kind, max_tokens=1, add_special_tokens=False).usage.prompt_tokens == with_bos - 1
        )
        if endpoint.ours:
            rendered = endpoint.tokenizer().apply_chat_template(
                MESSAGES, tokenize=False, add_generation_prompt=True
            )
            as_chat = create(endpoint, CHAT, max_tokens=1).usage.prompt_tokens
            assert create(endpoint, kind, prompt=rendered, max_tokens=1).usage.prompt_tokens == as_chat
    else:
        plain = create(endpoint, kind, max_tokens=1).usage.prompt_tokens
        assert create(endpoint, kind, max_tokens=1, add_special_tokens=True).usage.prompt_tokens == plain


def return_tokens_as_token_ids(endpoint, kind):
    assert all(isinstance(i, int) for i in token_ids(greedy(endpoint, kind, 3)))


def add_generation_prompt(endpoint, kind):
    open_turn = create(endpoint, kind, max_tokens=1).usage.prompt_tokens
    assert create(endpoint, kind, max_tokens=1, add_generation_prompt=False).usage.prompt_tokens < open_turn


def continue_final_message(endpoint, kind):
    messages = [*MESSAGES, {"role": "assistant", "content": "the cat"}]
    closed = create(endpoint, kind, messages=messages, add_generation_prompt=False, max_tokens=1)
    continued = create(
        endpoint,
        kind,
        messages=messages,
        add_generation_prompt=False,
        continue_final_message=True,
        max_tokens=1,
    )
    assert continued.usage.prompt_tokens < closed.usage.prompt_tokens
    refused(endpoint, kind, "continue_final_message", continue_final_message=True, always=True)


def chat_template_and_kwargs(endpoint, kind):
    template = "{{ greeting }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    plain = create(
        endpoint, kind, chat_template=template, chat_template_kwargs={"greeting": ""}, max_tokens=1
    )
    greeted = create(
        endpoint, kind, chat_template=template, chat_template_kwargs={"greeting": "hello "}, max_tokens=1
    )
    assert greeted.usage.prompt_tokens > plain.usage.prompt_tokens


def tool_choice(endpoint, kind):
    accepted(endpoint, kind, tool_choice="none")


# A row per field: its check, or REFUSED (a 400 naming the field here; anything but a 5xx elsewhere).
REFUSED = "refused here"
IGNORED = "accepted, no effect here"
SHARED: dict[str, Any] = {
    "model": model_is_checked,
    "frequency_penalty": penalty("frequency_penalty", 2.0, -2.0),
    "presence_penalty": penalty("presence_penalty", 2.0, -2.0),
    "repetition_penalty": penalty("repetition_penalty", 2.0, 0.5),
    "logit_bias": logit_bias,
    "logprobs": logprobs,
    "max_tokens": new_tokens("max_tokens"),
    "n": n_choices,
    "seed": seed,
    "stop": stop,
    "stream": stream,
    "stream_options": stream_options,
    "temperature": temperature,
    "top_p": top_p,
    "top_k": top_k,
    "min_p": min_p,
    "user": IGNORED,
    "response_format": response_format,
    "best_of": best_of,
    "use_beam_search": REFUSED,
    "length_penalty": REFUSED,
    "stop_token_ids": stop_token_ids,
    "include_stop_str_in_output": stop,
    "ignore_eos": ignore_eos,
    "min_tokens": min_tokens,
    "skip_special_tokens": skip_special_tokens,
    "spaces_between_special_tokens": REFUSED,
    "truncate_prompt_tokens": truncate_prompt_tokens,
    "allowed_token_ids": allowed_token_ids,
    "prompt_logprobs": REFUSED,
    "guided_json": REFUSED,
    "guided_regex": REFUSED,
    "guided_choice": REFUSED,
    "guided_grammar": REFUSED,
    "guided_decoding_backend": REFUSED,
    "guided_whitespace_pattern": REFUSED,
    "priority": REFUSED,
    "request_id": request_id,
    "logits_processors": REFUSED,
    "return_tokens_as_token_ids": return_tokens_as_token_ids,
    "cache_salt": IGNORED,
    "kv_transfer_params": REFUSED,
    "vllm_xargs": REFUSED,
    "echo": echo,
    "add_special_tokens": add_special_tokens,
}
ROWS: dict[str, dict[str, Any]] = {
    COMPLETION: {**SHARED, "prompt": prompt_as_token_ids, "prompt_embeds": REFUSED, "suffix": REFUSED},
    CHAT: {
        **SHARED,
        "messages": messages_as_text_parts,
        "top_logprobs": logprobs,
        "max_completion_tokens": new_tokens("max_completion_tokens"),
        "tools": REFUSED,
        "tool_choice": tool_choice,
        "parallel_tool_calls": IGNORED,
        "reasoning_effort": REFUSED,
        "include_reasoning": IGNORED,
        "add_generation_prompt": add_generation_prompt,
        "continue_final_message": continue_final_message,
        "documents": IGNORED,
        "chat_template": chat_template_and_kwargs,
        "chat_template_kwargs": chat_template_and_kwargs,
        "mm_processor_kwargs": REFUSED,
        "structural_tag": REFUSED,
        "bad_words": REFUSED,
    },
}
# A value for each refused or ignored field that is not its default.
VALUES: dict[str, Any] = {
    "use_beam_search": True,
    "length_penalty": 0.5,
    "spaces_between_special_tokens": False,
    "prompt_logprobs": 1,
    "guided_json": {"type": "object"},
    "guided_regex": "[a-z]+",
    "guided_choice": ["yes", "no"],
    "guided_grammar": 'root ::= "yes"',
    "guided_decoding_backend": "xgrammar",
    "guided_whitespace_pattern": " ",
    "priority": 1,
    "logits_processors": ["my_module.Processor"],
    "kv_transfer_params": {"do_remote_decode": True},
    "vllm_xargs": {"x": 1},
    "prompt_embeds": "AAAA",
    "suffix": " the end",
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "reasoning_effort": "low",
    "mm_processor_kwargs": {"x": 1},
    "structural_tag": "{}",
    "bad_words": ["tiger"],
    "user": "someone",
    "cache_salt": "a-salt-of-43-characters-base64-encoded-000000",
    "parallel_tool_calls": True,
    "include_reasoning": False,
    "documents": [{"title": "t", "text": "the moon"}],
}


def refused(endpoint, kind: str, field: str, always: bool = False, **fields: Any) -> None:
    """A 400 in OpenAI's error shape naming the field (here, or anywhere when `always`); elsewhere a 200 does too."""
    try:
        create(endpoint, kind, **{"max_tokens": 2, **fields})
    except openai.BadRequestError as error:
        body = error.body if isinstance(error.body, dict) else {}
        assert set(body) >= {"message", "type", "param", "code"}, error.body
        if endpoint.ours:
            assert body["param"] == field and field.split(".")[0] in body["message"], body
        return
    assert not (endpoint.ours or always), f"{field}: answered with a 200, expected a 400"


@pytest.mark.parametrize(("kind", "field"), [(kind, field) for kind, rows in ROWS.items() for field in rows])
def test_each_request_field_is_honoured_or_refused(endpoint, kind, field):
    row = ROWS[kind][field]
    if row == REFUSED:
        refused(endpoint, kind, field, **{field: VALUES[field]})
    elif row == IGNORED:
        accepted(endpoint, kind, **{field: VALUES[field]})
    else:
        row(endpoint, kind)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -1),
        ("temperature", "hot"),
        ("top_p", 2),
        ("stop", 5),
        ("n", 0),
        ("presence_penalty", 3),
        ("max_tokens", 0),
        ("seed", "7"),
        ("logprobs", 21),
        ("an_unknown_field", 1),
    ],
)
def test_mistyped_and_out_of_range_fields_get_a_400_in_openais_shape(endpoint, field, value):
    refused(endpoint, COMPLETION, field, always=True, **{field: value})


def test_valid_values_the_old_server_answered_with_500_are_answered(endpoint):
    answer = create(
        endpoint, COMPLETION, frequency_penalty=-2, logit_bias={1: -100}, max_tokens=2, ignore_eos=True
    )
    assert answer.usage.completion_tokens == 2
    chat = create(endpoint, CHAT, chat_template_kwargs={"anything": 1}, max_tokens=2)
    assert chat.choices[0].message.role == "assistant"


def test_end_of_turn_as_the_last_allowed_token_finishes_with_stop(endpoint):
    eot = end_of_turn(endpoint)
    for kind in (COMPLETION, CHAT):
        answer = create(endpoint, kind, logit_bias={eot: 100}, max_tokens=1)
        assert answer.choices[0].finish_reason == "stop" and text(answer) == ""
        assert answer.usage.completion_tokens == 1


def test_a_refusal_is_openais_error_object(endpoint):
    import urllib.request

    body = json.dumps({"model": endpoint.model, "prompt": PROMPT, "temperature": "hot"}).encode()
    request = urllib.request.Request(
        f"{endpoint.url}/v1/completions", body, {"Content-Type": "application/json"}, method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused_:
        urllib.request.urlopen(request, timeout=30)
    assert refused_.value.code == 400
    error = json.loads(refused_.value.read())["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == "temperature"
