"""`trainer serve` for real on 127.0.0.1, driven by the official openai client: the tiny run's newest version,
exported on first use, served by the project's server (trainer/serving/app.py) with its checks and metrics.
Greedy completions equal `trainer generate` token for token; chats get the export's template; streams give the same text; a prompt
past the context, an unknown model and malformed requests get a clear 4xx and the server stays up. (Every request
field, sampling and the Llama-3-style BOS rule: tests/serving/test_conformance.py.)"""

from __future__ import annotations

import json
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.serving.conftest import start_server, stop
from trainer.__main__ import main as trainer_main
from trainer.data.chat_template import CHAT_TEMPLATE
from trainer.data.tokenizer import load_tokenizer

PROMPT = "def parse(self, "


@dataclass
class Server:
    url: str
    version: str
    checkpoints: Path
    tokenizer: Path
    log: Path

    def client(self):
        from openai import OpenAI

        return OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120)

    def get(self, path: str) -> tuple[int, str]:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=30) as answer:
            return answer.status, answer.read().decode()

    def post(self, path: str, body: bytes) -> tuple[int, dict]:
        request = urllib.request.Request(
            f"{self.url}{path}", body, {"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())


@pytest.fixture(scope="module")
def server(single, tiny_corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve") / "runs"
    checkpoints = root / "tiny" / "checkpoints"
    shutil.copytree(single.run_dir / "checkpoints", checkpoints)  # the session's run stays as trained
    log = root.parent / "serve.log"
    process, url = start_server(["newest", "--dir", str(root)], log)
    newest = checkpoints / (checkpoints / "latest").read_text().strip()
    version = json.loads((newest / "model_version.json").read_text())["version"]
    yield Server(url, version, checkpoints, Path(tiny_corpus + ".tokenizer.json"), log)
    stop(process, log)


def generated(capsys, checkpoints: Path, prompt: str, max_new_tokens: int) -> dict:
    code = trainer_main(
        [
            "generate",
            "--checkpoint",
            str(checkpoints),
            "--prompt",
            prompt,
            "--max-new-tokens",
            str(max_new_tokens),
            "--format",
            "json",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


@pytest.mark.slow
def test_greedy_completions_equal_trainer_generate_and_streams_give_the_same_text(server, capsys):
    client = server.client()
    assert [model.id for model in client.models.list().data] == [server.version]
    want = generated(capsys, server.checkpoints, PROMPT, 12)
    answer = client.completions.create(model=server.version, prompt=PROMPT, max_tokens=12, temperature=0)
    assert answer.choices[0].text == want["text"]
    assert answer.usage.prompt_tokens == len(want["prompt_tokens"])
    assert answer.usage.completion_tokens == len(want["tokens"])
    streamed = client.completions.create(
        model=server.version, prompt=PROMPT, max_tokens=12, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == want["text"]


@pytest.mark.slow
def test_a_chat_gets_the_exports_template_and_streams_the_same_answer(server, capsys):
    client = server.client()
    messages = [{"role": "user", "content": "def f():"}]
    tokenizer = load_tokenizer(server.tokenizer)
    rendered = "<|user|>\ndef f():\n<|assistant|>\n"  # CHAT_TEMPLATE with the generation prompt
    assert CHAT_TEMPLATE.startswith("{% for message in messages %}")
    want = generated(capsys, server.checkpoints, rendered, 8)
    answer = client.chat.completions.create(
        model=server.version, messages=messages, max_tokens=8, temperature=0
    )
    assert answer.usage.prompt_tokens == len(tokenizer.tokenize_prompt(rendered))
    assert answer.choices[0].message.content == want["text"]
    streamed = client.chat.completions.create(
        model=server.version, messages=messages, max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == want["text"]


@pytest.mark.slow
def test_bad_requests_get_a_clear_4xx_and_the_server_stays_up(server):
    import openai

    client = server.client()
    with pytest.raises(openai.BadRequestError, match="maximum context length is 32 tokens") as refused:
        client.completions.create(model=server.version, prompt="x " * 40, max_tokens=4)
    assert refused.value.code == "context_length_exceeded"
    with pytest.raises(
        openai.BadRequestError, match=r"requested \d+ tokens \(\d+ in the messages, 30 in the completion\)"
    ):
        client.completions.create(model=server.version, prompt=PROMPT, max_tokens=30)
    with pytest.raises(openai.NotFoundError, match="The model `gpt-4` does not exist"):
        client.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=2)
    for body, message in (
        (b"{not json", "not JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (json.dumps({"model": server.version}).encode(), "'messages': Field required"),
        (
            json.dumps({"model": server.version, "messages": [{"role": "bot", "content": "x"}]}).encode(),
            "'messages.0.role'",
        ),
    ):
        status, answer = server.post("/v1/chat/completions", body)
        assert status == 400 and message in answer["error"]["message"], answer
    status, answer = server.post(
        "/v1/completions", json.dumps({"model": server.version, "prompt": 7}).encode()
    )
    assert status == 400 and answer["error"]["param"] == "prompt", answer

    assert server.get("/health")[0] == 200
    after = client.completions.create(model=server.version, prompt=PROMPT, max_tokens=2, temperature=0)
    assert after.usage.completion_tokens <= 2


@pytest.mark.slow
def test_the_servers_metrics_count_requests_by_endpoint_and_status(server):
    from prometheus_client.parser import text_string_to_metric_families

    client = server.client()
    client.completions.create(model=server.version, prompt=PROMPT, max_tokens=3, temperature=0)
    server.post("/v1/completions", b"{")
    status, text = server.get("/metrics")
    families = {family.name: family for family in text_string_to_metric_families(text)}
    requests = {
        (s.labels["endpoint"], s.labels["status"]): s.value
        for s in families["trainstack_serving_requests"].samples
        if s.name.endswith("_total")
    }
    assert (
        status == 200
        and requests[("/v1/completions", "200")] >= 1
        and requests[("/v1/completions", "400")] >= 1
    )
    sample = families["trainstack_serving_completion_tokens"].samples[0]
    assert (
        sample.labels["model"] == server.version and sample.labels["job_id"] == "local" and sample.value >= 3
    )
