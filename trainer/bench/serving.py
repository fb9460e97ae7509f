"""The local server (`trainer serve`: the project's OpenAI-compatible server, trainer/serving/) against `trainer generate`
(megatron-core's KV-cache decoding, in this process) on the same prompts, greedy, and a bounded load test of the
server on 127.0.0.1 (issue 37 part 6; `--only serving` runs this alone).

The model: a tiny run of local.yaml's data (one process, 2 layers of 64, a few steps: the sweep's trial shape)
trained here into <out>/serving/runs, whose newest version the server exports on first use. Rows:
- tokens/s, one request at a time: the server (non-streamed completions, `usage.completion_tokens`) against
  `generate` on the same prompts and new-token budget (the row says TEXT DIFFERS where their greedy texts do);
- time to the first token: the server's first streamed chunk with text against `generate`'s first piece of text
  (medians over the prompts);
- a bounded load: C client threads sending R completions in all; p50 and p99 latency against one request at a
  time (median), the load's tokens/s against one at a time, the errors against the requests (a /health after the
  load that is not 200 counts as one), the server's resident memory after the load against before it.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trainer.bench.report import add_result
from trainer.bench.training import BenchError
from trainer.sweep.trial import train_command

RECIPE = Path("trainer/configs/local.yaml")
# The sweep's trial shape (trainer/configs/local-sweep.yaml), 20 steps: the model only has to exist and be the
# shape both sides serve; ~15 s of training on 2 cores, most of it start-up.
TINY = (
    "parallel.tensor_model_parallel_size=1",
    "parallel.pipeline_model_parallel_size=1",
    "model.num_layers=2",
    "model.hidden_size=64",
    "model.ffn_hidden_size=176",
    "data.seq_length=64",
    "schedule.micro_batch_size=8",
    "schedule.global_batch_size=8",
    "schedule.train_iters=20",
    "schedule.lr_warmup_iters=2",
    "schedule.eval_interval=20",
    "schedule.eval_iters=1",
    "checkpoint.save_interval=20",
    "checkpoint.keep_last=1",
    "logging.tensorboard=false",
)
PROMPTS = (
    "def parse(self, ",
    "import os\n",
    "class Reader:\n    def __init__(self",
    "for line in ",
    "    return ",
    "if __name__ == ",
    "with open(path) as f:\n",
    "raise ValueError(",
)
NEW_TOKENS = 32
CLIENTS = 4
REQUESTS = 64
START_TIMEOUT_S = 240
REQUEST_TIMEOUT_S = 120


def bench_serving(
    report: dict,
    out: Path,
    *,
    recipe: Path = RECIPE,
    overrides: Sequence[str] = TINY,
    prompts: Sequence[str] = PROMPTS,
    new_tokens: int = NEW_TOKENS,
    clients: int = CLIENTS,
    requests: int = REQUESTS,
) -> None:
    """Train the tiny run, serve it, measure both sides and the load; add the rows and details to the report."""
    try:
        import openai  # noqa: F401 - the client the load uses; requirements/dev.txt, as `make serve`
    except ImportError as error:
        raise BenchError(
            f"serving: {error.name} is missing: make venv installs requirements/dev.txt"
        ) from None
    root = out / "serving"
    shutil.rmtree(root, ignore_errors=True)  # a benchmark measures, it does not resume
    runs = root / "runs"
    run_dir = runs / "bench"
    run_dir.mkdir(parents=True)
    _run(train_command(recipe, overrides, run_dir), root / "train.log", "training the served model")
    generate = measure_generate(run_dir / "checkpoints", prompts, new_tokens)
    with Server(runs, root / "serve.log") as server:
        served = measure_server(server, prompts, new_tokens)
        load = measure_load(server, prompts, new_tokens, clients, requests)
    details = {
        "model": {"recipe": str(recipe), "overrides": list(overrides), "version": server.version},
        "prompts": len(prompts),
        "new_tokens": new_tokens,
        "generate": generate,
        "server": served,
        "load": load,
    }
    report["details"]["serving"] = details
    add_serving_results(report, details)


def add_serving_results(report: dict, details: dict) -> None:
    """The section's rows from its raw measurements (each request's seconds and tokens)."""
    generate, served, load = details["generate"], details["server"], details["load"]
    shape = f"{details['prompts']} prompts, {details['new_tokens']} new tokens, greedy"
    one_at_a_time = statistics.median(served["seconds"])
    add_result(
        report,
        f"serving tokens/s, one request at a time ({shape})",
        "tokens/s",
        tokens_per_s(served),
        "trainer generate (megatron-core KV cache), same prompts"
        + ("" if generate["texts"] == served["texts"] else " (TEXT DIFFERS)"),
        tokens_per_s(generate),
    )
    add_result(
        report,
        "serving time to first token (median, streamed)",
        "s",
        statistics.median(served["first_token_seconds"]),
        "trainer generate's first token",
        statistics.median(generate["first_token_seconds"]),
    )
    what = f"{load['clients']} clients, {load['requests']} requests"
    add_result(
        report,
        f"serving load p50 latency ({what})",
        "s",
        percentile(load["seconds"], 50),
        "one request at a time (median)",
        one_at_a_time,
    )
    add_result(
        report,
        f"serving load p99 latency ({what})",
        "s",
        percentile(load["seconds"], 99),
        "one request at a time (median)",
        one_at_a_time,
    )
    add_result(
        report,
        f"serving load tokens/s ({what})",
        "tokens/s",
        sum(load["tokens"]) / load["wall_seconds"],
        "one request at a time",
        tokens_per_s(served),
    )
    add_result(
        report,
        f"serving load errors (/health after: {load['health_after']})",
        "requests",
        load["errors"] + (load["health_after"] != 200),
        "requests sent",
        load["requests"],
    )
    add_result(
        report,
        "serving resident memory after the load",
        "MiB",
        load["rss_after_bytes"] / 2**20,
        "before the load",
        load["rss_before_bytes"] / 2**20,
    )


def tokens_per_s(side: dict) -> float:
    return sum(side["tokens"]) / sum(side["seconds"])


def percentile(samples: Sequence[float], q: float) -> float:
    """The nearest-rank percentile: the smallest sample with at least q % of the samples at or below it."""
    if not samples or not 0 < q <= 100:
        raise ValueError(f"percentile {q} of {len(samples)} samples")
    ordered = sorted(samples)
    return ordered[max(math.ceil(q / 100 * len(ordered)), 1) - 1]


def measure_generate(checkpoints: Path, prompts: Sequence[str], new_tokens: int) -> dict[str, Any]:
    """`trainer generate`'s own loading and decoding (trainer/evaluation/generate.py), in this process, timed per
    prompt after the model is loaded (the server's times start after its load too)."""
    from trainer.data.tokenizer import load_tokenizer
    from trainer.evaluation.generate import (
        Generator,
        Sampling,
        checkpoint_and_record,
        stop_ids,
        tokenizer_path,
    )

    found, record = checkpoint_and_record(checkpoints)
    tokenizer = load_tokenizer(tokenizer_path(None, checkpoints, found))
    sampling = Sampling(max_new_tokens=new_tokens)
    result: dict[str, Any] = {"seconds": [], "tokens": [], "first_token_seconds": [], "texts": []}
    with Generator.loaded(found, record, tokenizer, stop_ids(found, tokenizer)) as generator:
        generator.generate(tokenizer.tokenize_prompt(prompts[0]), sampling)  # warm-up, as the server's below
        for prompt in prompts:
            ids = tokenizer.tokenize_prompt(prompt)
            first: list[float] = []
            started = time.perf_counter()
            generation = generator.generate(ids, sampling, on_text=_first_text(first))
            ended = time.perf_counter()
            result["seconds"].append(ended - started)
            result["tokens"].append(len(generation.tokens))
            result["first_token_seconds"].append((first[0] if first else ended) - started)
            result["texts"].append(generation.text)
    return result


def _first_text(times: list[float]) -> Callable[[str], None]:
    """A `generate` on_text that notes when each non-empty piece of text arrives."""

    def noted(text: str) -> None:
        if text:
            times.append(time.perf_counter())

    return noted


class Server:
    """`python -m trainer serve newest --dir RUNS` on 127.0.0.1 at a free port, from start to SIGTERM."""

    def __init__(self, runs: Path, log: Path) -> None:
        self.runs, self.log = runs, log
        self.url = ""
        self.version = ""
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        command = [
            sys.executable,
            "-m",
            "trainer",
            "serve",
            "newest",
            "--dir",
            str(self.runs),
            "--port",
            str(port),
        ]
        with self.log.open("w") as output:
            self.process = subprocess.Popen(
                command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.health() != 200:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise BenchError(
                    f"serving: the server did not start; its log:\n{self.log.read_text()[-3000:]}"
                )
            time.sleep(0.5)
        try:
            self.version = self.client().models.list().data[0].id
        except Exception:
            self.stop()  # __exit__ does not run when __enter__ raises
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def health(self) -> int | None:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as answer:
                return int(answer.status)
        except OSError:
            return None

    def rss_bytes(self) -> int:
        import psutil

        assert self.process is not None
        return int(psutil.Process(self.process.pid).memory_info().rss)

    def client(self) -> Any:
        from openai import OpenAI

        return OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S)

    def complete(self, client: Any, prompt: str, new_tokens: int) -> tuple[float, int, str]:
        """One greedy completion: its seconds, its generated tokens and its text."""
        started = time.perf_counter()
        answer = client.completions.create(
            model=self.version, prompt=prompt, max_tokens=new_tokens, temperature=0
        )
        return time.perf_counter() - started, answer.usage.completion_tokens, answer.choices[0].text


def measure_server(server: Server, prompts: Sequence[str], new_tokens: int) -> dict[str, Any]:
    """The same prompts one at a time: a completion each, then a streamed one for its first token."""
    client = server.client()
    server.complete(client, prompts[0], new_tokens)  # warm-up: the first request's one-off costs
    result: dict[str, Any] = {"seconds": [], "tokens": [], "first_token_seconds": [], "texts": []}
    for prompt in prompts:
        seconds, tokens, text = server.complete(client, prompt, new_tokens)
        result["seconds"].append(seconds)
        result["tokens"].append(tokens)
        result["texts"].append(text)
        started = time.perf_counter()
        first = None
        for chunk in client.completions.create(
            model=server.version, prompt=prompt, max_tokens=new_tokens, temperature=0, stream=True
        ):
            if first is None and chunk.choices and chunk.choices[0].text:
                first = time.perf_counter()
        result["first_token_seconds"].append((first or time.perf_counter()) - started)
    return result


def measure_load(
    server: Server, prompts: Sequence[str], new_tokens: int, clients: int, requests: int
) -> dict[str, Any]:
    """`requests` completions from `clients` threads (each its own client), the prompts in turn; then /health."""
    rss_before = server.rss_bytes()
    local_clients = [server.client() for _ in range(clients)]
    errors: list[str] = []

    def one(index: int) -> tuple[float, int] | None:
        try:
            seconds, tokens, _ = server.complete(
                local_clients[index % clients], prompts[index % len(prompts)], new_tokens
            )
        except Exception as error:  # every failure is counted, none stops the load
            errors.append(f"{type(error).__name__}: {error}"[:300])
            return None
        return seconds, tokens

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        answers = [a for a in pool.map(one, range(requests)) if a is not None]
    wall = time.perf_counter() - started
    return {
        "clients": clients,
        "requests": requests,
        "wall_seconds": wall,
        "seconds": [seconds for seconds, _ in answers],
        "tokens": [tokens for _, tokens in answers],
        "errors": len(errors),
        "error_samples": errors[:5],
        "health_after": server.health(),
        "rss_before_bytes": rss_before,
        "rss_after_bytes": server.rss_bytes(),
    }


def _run(command: Sequence[str], log: Path, what: str) -> None:
    with log.open("w") as output:
        code = subprocess.run(list(command), stdout=output, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        raise BenchError(f"serving: {what} failed ({code}); its log:\n{log.read_text()[-3000:]}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
