"""The request checks and the sampler without a server: each bad request refused with its 4xx and the field, the
defaults vLLM gives, the one BOS rule, and the sampler's penalties and filters against their definitions."""

from __future__ import annotations

import json

import pytest
import torch

from tests.serving.test_conformance import ROWS
from trainer.data.tokenizer import encode_prompt
from trainer.serving.checks import CHAT, COMPLETIONS, Refusal, check
from trainer.serving.engine import Engine
from trainer.serving.protocol import ChatCompletionRequest, CompletionRequest
from trainer.serving.sampling import SamplingParams, penalized, sampling_distribution


@pytest.fixture(scope="module")
def engine(llama3_export) -> Engine:
    return Engine(llama3_export)


def body(**fields) -> bytes:
    return json.dumps({"model": "llama3-tiny", **fields}).encode()


def test_every_field_of_vllms_requests_has_a_conformance_row():
    assert set(ROWS["completion"]) == set(CompletionRequest.model_fields)
    assert set(ROWS["chat"]) == set(ChatCompletionRequest.model_fields)


def test_defaults_are_vllms_a_completion_16_tokens_a_chat_the_rest_of_the_context(engine):
    completion = check(COMPLETIONS, body(prompt="the tiger"), engine)
    assert completion.params.max_tokens == 16 and completion.params.temperature == 1.0
    chat = check(CHAT, body(messages=[{"role": "user", "content": "the tiger"}]), engine)
    assert chat.params.max_tokens == engine.context - len(chat.prompt)
    assert (
        check(
            CHAT, body(messages=[{"role": "user", "content": "x"}], max_completion_tokens=3), engine
        ).params.max_tokens
        == 3
    )


def test_one_bos_rule_the_post_processors_bos_once(engine):
    backend = engine.tokenizer.backend_tokenizer
    bos = engine.tokenizer.convert_tokens_to_ids("<|begin_of_text|>")
    plain = check(COMPLETIONS, body(prompt="the tiger"), engine).prompt
    assert plain == [bos, *backend.encode("the tiger", add_special_tokens=False).ids]
    assert plain == engine.tokenizer("the tiger")["input_ids"]  # transformers' tokenizer(text) agrees
    messages = [{"role": "user", "content": "the tiger"}]
    chat = check(CHAT, body(messages=messages), engine).prompt
    rendered = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert (
        chat
        == engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)[
            "input_ids"
        ]
    )
    assert chat.count(bos) == 1
    # A rendered chat sent as a completion: the template's BOS, not a second one; the same ids as the chat.
    assert check(COMPLETIONS, body(prompt=rendered), engine).prompt == chat
    assert encode_prompt(backend, rendered) == chat


@pytest.mark.parametrize(
    ("path", "raw", "status", "param", "message"),
    [
        (COMPLETIONS, b"{", 400, None, "the request body is not JSON"),
        (COMPLETIONS, b"[]", 400, None, "must be a JSON object, got list"),
        (COMPLETIONS, json.dumps({"prompt": "x"}).encode(), 400, "model", "'model' is required"),
        (
            COMPLETIONS,
            json.dumps({"model": "gpt-4", "prompt": "x"}).encode(),
            404,
            "model",
            "`gpt-4` does not exist",
        ),
        (COMPLETIONS, body(prompt=""), 400, "prompt", "required, a non-empty string"),
        (COMPLETIONS, body(prompt=["a", "b"]), 400, "prompt", "not a batch"),
        (COMPLETIONS, body(prompt=[5, 100000]), 400, "prompt", "token id 100000 is out of vocabulary"),
        (COMPLETIONS, body(prompt="x", max_tokens=0), 400, "max_tokens", "greater than or equal to 1"),
        (COMPLETIONS, body(prompt="x", max_tokens="5"), 400, "max_tokens", "valid integer"),
        (COMPLETIONS, body(prompt="the " * 80), 400, "prompt", "maximum context length is 64 tokens"),
        (COMPLETIONS, body(prompt="the tiger", max_tokens=70), 400, "prompt", "70 in the completion"),
        (COMPLETIONS, body(prompt="x", temperature=-1), 400, "temperature", "greater than or equal to 0"),
        (COMPLETIONS, body(prompt="x", temperature="hot"), 400, "temperature", 'valid number, got "hot"'),
        (COMPLETIONS, body(prompt="x", top_p=2), 400, "top_p", "less than or equal to 1"),
        (COMPLETIONS, body(prompt="x", stop=5), 400, "stop", "valid string"),
        (COMPLETIONS, body(prompt="x", logit_bias={"the": 1}), 400, "logit_bias", "keys are token ids"),
        (COMPLETIONS, body(prompt="x", logit_bias={"5": 101}), 400, "logit_bias", "from -100 to 100"),
        (
            COMPLETIONS,
            body(prompt="x", wibble=1),
            400,
            "wibble",
            "'wibble' is not a field of /v1/completions",
        ),
        (COMPLETIONS, body(prompt="x", suffix="y"), 400, "suffix", "suffix is not currently supported"),
        (
            COMPLETIONS,
            body(prompt="x", echo=True, logprobs=1),
            400,
            "echo with logprobs",
            "prompt's logprobs",
        ),
        (CHAT, body(), 400, "messages", "Field required"),
        (CHAT, body(messages=[{"role": "tool", "content": "x"}]), 400, "messages.0.role", "'system'"),
        (CHAT, body(messages=[{"role": "user", "content": 5}]), 400, "messages.0.content", "valid string"),
        (
            CHAT,
            body(messages=[{"role": "user", "content": "x"}], tools=[{}]),
            400,
            "tools",
            "no tool-call parser",
        ),
        (
            CHAT,
            body(messages=[{"role": "user", "content": "x"}], chat_template="{{ raise_exception('no') }}"),
            400,
            "messages",
            "the chat template cannot render these messages",
        ),
    ],
)
def test_bad_requests_are_refused_with_their_status_and_the_field(engine, path, raw, status, param, message):
    with pytest.raises(Refusal) as refused:
        check(path, raw, engine)
    assert (
        refused.value.status == status and refused.value.param == param and message in refused.value.message
    )
    error = json.loads(refused.value.body())["error"]
    assert error["message"] == refused.value.message and set(error) == {"message", "type", "param", "code"}


def test_frequency_and_presence_penalties_are_openais_additive_ones():
    """OpenAI's definition (API reference, "Parameter details"): mu[j] - c[j] * alpha_frequency - (c[j] > 0) *
    alpha_presence, over the tokens generated so far; repetition (vLLM's, CTRL's) divides positive logits and
    multiplies negative ones of every token seen, prompt included."""
    logits = torch.tensor([1.0, -1.0, 2.0, 0.5])
    params = SamplingParams(max_tokens=1, frequency_penalty=0.5, presence_penalty=0.25)
    got = penalized(logits.clone(), params, prompt=[3], output=[0, 0, 2])
    assert got.tolist() == [1.0 - 2 * 0.5 - 0.25, -1.0, 2.0 - 0.5 - 0.25, 0.5]
    repeated = penalized(logits.clone(), SamplingParams(max_tokens=1, repetition_penalty=2.0), [3], [1])
    assert repeated.tolist() == [1.0, -2.0, 2.0, 0.25]


def test_top_k_top_p_and_min_p_keep_the_tokens_their_definitions_keep():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = lambda **p: (sampling_distribution(logits, SamplingParams(max_tokens=1, **p)) > 0).tolist()  # noqa: E731
    assert kept(top_k=2) == [True, True, False, False]
    assert kept(top_p=0.8) == [True, True, False, False]  # 0.5 + 0.3 reaches 0.8: the third is not needed
    assert kept(top_p=0.81) == [True, True, True, False]
    assert kept(min_p=0.35) == [True, True, False, False]  # 0.15 < 0.35 * 0.5
    halved = sampling_distribution(logits, SamplingParams(max_tokens=1, temperature=0.5))
    assert torch.allclose(halved, torch.softmax(logits / 0.5, dim=-1))


def test_min_tokens_over_max_tokens_is_refused_as_vllm_refuses_it(engine):
    # vllm/sampling_params.py SamplingParams._verify_args: "min_tokens must be less than or equal to max_tokens".
    with pytest.raises(Refusal) as refused:
        check(COMPLETIONS, body(prompt="the tiger", max_tokens=2, min_tokens=3), engine)
    assert refused.value.status == 400 and refused.value.param == "min_tokens"
    assert "max_tokens=2" in refused.value.message
    assert (
        check(COMPLETIONS, body(prompt="the tiger", max_tokens=3, min_tokens=3), engine).params.min_tokens
        == 3
    )


def test_an_empty_allowed_token_ids_is_refused_as_vllm_refuses_it(engine):
    # vllm/v1/engine/processor.py _validate_sampling_params: "allowed_token_ids is not None and empty!"; an empty
    # list masks every logit (a NaN draw when sampling).
    with pytest.raises(Refusal) as refused:
        check(COMPLETIONS, body(prompt="the tiger", allowed_token_ids=[]), engine)
    assert refused.value.status == 400 and refused.value.param == "allowed_token_ids"


def test_echo_of_a_token_id_prompt_is_its_decoded_text_as_vllm_echoes_it(engine):
    # vllm/entrypoints/openai/serving_engine.py _normalize_prompt_tokens_to_input: the echoed prompt text is
    # tokenizer.decode(input_ids) (after truncate_prompt_tokens).
    ids = engine.tokenizer("the tiger plays")["input_ids"]
    job = check(COMPLETIONS, body(prompt=ids, echo=True), engine)
    assert job.echo == engine.tokenizer.decode(ids) and "the tiger plays" in job.echo
    truncated = check(COMPLETIONS, body(prompt=ids, echo=True, truncate_prompt_tokens=2), engine)
    assert truncated.echo == engine.tokenizer.decode(ids[-2:])


def test_a_chat_without_a_generation_prompt_answers_in_the_last_messages_role_as_vllm_does(engine):
    # vllm/entrypoints/openai/serving_chat.py get_chat_request_role: the response role is the last message's when
    # add_generation_prompt is false, and echo prepends the last message when its role is the response's.
    from trainer.serving.app import Answer
    from trainer.serving.metrics import ServingMetrics

    messages = [{"role": "user", "content": "the tiger"}]
    job = check(CHAT, body(messages=messages, add_generation_prompt=False, echo=True, max_tokens=2), engine)
    assert job.role == "user" and job.echo == "the tiger"
    answer = Answer(job, engine, ServingMetrics({"run": "r", "job_id": "j", "model": "m"})).whole()
    message = answer["choices"][0]["message"]
    assert message["role"] == "user" and message["content"].startswith("the tiger")
    usual = check(CHAT, body(messages=messages, echo=True, max_tokens=2), engine)
    assert usual.role == "assistant" and usual.echo == ""


def test_a_messages_name_reaches_the_chat_template_as_vllm_passes_it(engine):
    # vllm/entrypoints/chat_utils.py _parse_chat_message_content: a message's "name" is kept for the template.
    template = "{% for m in messages %}{{ m.get('name', 'nobody') }}: {{ m.content }}\n{% endfor %}"
    messages = [{"role": "user", "content": "the tiger", "name": "ann"}]
    job = check(CHAT, body(messages=messages, chat_template=template, max_tokens=1), engine)
    assert engine.decode(job.prompt) == "ann: the tiger\n"


def test_chat_template_kwargs_override_the_requests_template_fields_as_in_vllm(engine):
    # vllm/entrypoints/openai/serving_engine.py _preprocess_chat: the template's kwargs are the request's
    # add_generation_prompt, continue_final_message, documents and chat_template, then chat_template_kwargs on top.
    messages = [{"role": "user", "content": "the tiger"}]
    closed = check(CHAT, body(messages=messages, add_generation_prompt=False, max_tokens=1), engine).prompt
    overridden = check(
        CHAT,
        body(messages=messages, chat_template_kwargs={"add_generation_prompt": False}, max_tokens=1),
        engine,
    ).prompt
    assert overridden == closed
    assert check(CHAT, body(messages=messages, max_tokens=1), engine).prompt != closed
