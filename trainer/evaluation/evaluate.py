"""`python -m trainer evaluate`: a checkpoint against a suite (trainer/evaluation/suite.py), in this process.

    evaluate --checkpoint CKPT --suite FILE.yaml [--tokenizer tokenizer.json] [--format text|json]
    evaluate --checkpoint CKPT --harness-tasks TASK,... [--harness-include DIR] [--harness-limit N]

Perplexity tasks are `score --data` at TP=1, PP=1 (the same code: loss per token over the real vocabulary,
windows of the token stream in file order), with a 95 % normal interval over the windows' mean losses.
Generation tasks continue each prompt greedily (`generate --temperature 0`, the task's max_new_tokens and stop)
and count exact matches against the reference after suite.normalise, with a 95 % Wilson interval. The suite,
its files, the checkpoint, the tokenizer and every prompt's length are checked before the model is built.
`--harness-tasks` runs lm-evaluation-harness tasks on the exported model (trainer/evaluation/harness.py).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from trainer.arguments import positive_int
from trainer.checkpoint.record import ModelRecord
from trainer.checkpoint.version import EVALUATIONS, add_evaluation, check_evaluation_name
from trainer.config import ConfigError
from trainer.data import DataError
from trainer.data.tokenizer import HuggingFaceTokenizer, load_tokenizer
from trainer.distributed import local
from trainer.evaluation import generate, harness, score
from trainer.evaluation.suite import (
    Example,
    GenerationTask,
    PerplexityTask,
    Suite,
    exact_match,
    mean_interval,
    read_examples,
    read_suite,
    wilson_interval,
)
from trainer.model.weights import model_only_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint, or a directory of them")
    parser.add_argument("--suite", type=Path, help="the suite YAML (docs/evaluate.md)")
    parser.add_argument(
        "--harness-tasks", help="lm-evaluation-harness tasks, comma-separated, on the exported model"
    )
    parser.add_argument("--harness-include", type=Path, help="a directory of lm-eval task YAML files")
    parser.add_argument("--harness-limit", type=positive_int, help="at most this many documents per task")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        help="a tokenizer.json (default: the one the checkpoint's record names, else tokenizer.json in the "
        "checkpoint's directory or one above it)",
    )
    parser.add_argument("--format", choices=["text", "json"], default="text", help="json: one object")
    parser.add_argument(
        "--record",
        metavar="NAME",
        help="also add the results beside the checkpoint's model version record as evaluations/NAME.json (written "
        "once: the model card and `models show` read it; a checkpoint that has it already is not evaluated again)",
    )


@dataclass(frozen=True)
class PerplexityResult:
    loss: float  # mean cross entropy per predicted token, nats
    perplexity: float
    tokens: int
    samples: int  # windows
    loss_interval: tuple[float, float]  # 95 %, over the windows' mean losses
    perplexity_interval: tuple[float, float]


@dataclass(frozen=True)
class GenerationResult:
    exact_match: float
    correct: int
    samples: int
    interval: tuple[float, float]  # 95 % Wilson
    # The first example's prompt and greedy answer: the smoke request `make deploy` checks a new fleet against.
    smoke: dict[str, object] | None = None


@dataclass(frozen=True)
class Plan:
    """Everything a suite run needs, checked."""

    checkpoint: Path
    record: ModelRecord
    tokenizer: HuggingFaceTokenizer
    stops: frozenset[int]  # the ids that end a generation (generate.stop_ids)
    windows: dict[str, list[list[int]]]
    prompts: dict[str, tuple[GenerationTask, list[Example], list[list[int]]]]


def plan(checkpoint: Path, suite_path: Path | None, tokenizer_path: Path | None) -> Plan:
    """Check the checkpoint, tokenizer, suite and data, and tokenize what will run; raises ValueError
    subclasses (or ConfigError, DataError) naming what is wrong."""
    found, record = generate.checkpoint_and_record(checkpoint)
    tokenizer = load_tokenizer(generate.tokenizer_path(tokenizer_path, checkpoint, found))
    generate.check_vocabulary(tokenizer, record)
    stops = generate.stop_ids(found, tokenizer)
    if suite_path is None:
        return Plan(found, record, tokenizer, stops, {}, {})
    suite: Suite = read_suite(suite_path)
    windows = {task.name: _windows(task, record) for task in suite.perplexity}
    prompts = {}
    for i, task in enumerate(suite.generation):
        examples = read_examples(task, f"suite {suite_path}: generation.{i}.file")
        ids = [tokenizer.tokenize_prompt(example.prompt) for example in examples]
        try:
            generate.check_context(ids, task.max_new_tokens, record.seq_length)
        except generate.GenerateError as error:
            raise generate.GenerateError(
                f"suite {suite_path}: generation task {task.name!r}: {error}"
            ) from None
        prompts[task.name] = (task, examples, ids)
    return Plan(found, record, tokenizer, stops, windows, prompts)


def _windows(task: PerplexityTask, record: ModelRecord) -> list[list[int]]:
    args = argparse.Namespace(data=task.data, samples=task.samples, seq_length=task.seq_length)
    try:
        return score._windows(args, record.seq_length)
    except score.ScoreError as error:
        raise score.ScoreError(f"perplexity task {task.name!r}: {error}") from None


def main(args: argparse.Namespace) -> int:
    tasks = [task.strip() for task in (args.harness_tasks or "").split(",") if task.strip()]
    try:
        if args.suite is None and not tasks:
            raise harness.HarnessError("give --suite FILE.yaml, --harness-tasks TASK,..., or both")
        checked = plan(args.checkpoint, args.suite, args.tokenizer)
        if tasks:
            harness.check(tasks, args.harness_include)
        if args.record is not None and (done := recorded(checked.checkpoint, args.record)) is not None:
            print(f"evaluate: {checked.checkpoint} was evaluated as {args.record!r} already: {done}")
            return 0
    # Every check raises a ValueError (ours subclass it, as pydantic's does), a ConfigError or a DataError.
    except (ValueError, ConfigError, DataError) as error:
        print(f"evaluate: {error}", file=sys.stderr)
        return 2
    results: dict[str, dict[str, dict]] = run(checked)
    if tasks:
        results["harness"] = harness.run(
            checked.checkpoint,
            checked.record,
            checked.tokenizer,
            tasks,
            args.harness_include,
            args.harness_limit,
        )
    if args.record is not None:
        add_evaluation(checked.checkpoint, args.record, {"suite": str(args.suite), **results})
    if args.format == "json":
        print(json.dumps({"checkpoint": str(checked.checkpoint), **results}))
    else:
        print(report(checked.checkpoint, results))
    return 0


def recorded(checkpoint: Path, name: str) -> Path | None:
    """The evaluation `name` already beside the checkpoint's record, if any; raises RecordError (a ValueError) when
    it cannot be added: a bad name, or a checkpoint without a model version record."""
    check_evaluation_name(checkpoint, name)
    path = checkpoint / EVALUATIONS / f"{name}.json"
    return path if path.is_file() else None


def run(checked: Plan) -> dict[str, dict[str, dict]]:
    """Every task of a checked plan, in this process: {"perplexity": {name: ...}, "generation": {name: ...}}."""
    perplexity = {name: asdict(_perplexity(checked, windows)) for name, windows in checked.windows.items()}
    generation: dict[str, dict] = {}
    if checked.prompts:
        loaded = generate.Generator.loaded(
            checked.checkpoint, checked.record, checked.tokenizer, checked.stops
        )
        with loaded as generator:
            for name, (task, examples, ids) in checked.prompts.items():
                generation[name] = asdict(_generation(generator, task, examples, ids))
    return {"perplexity": perplexity, "generation": generation}


def _perplexity(checked: Plan, windows: list[list[int]]) -> PerplexityResult:
    cfg = model_only_config(
        checked.record.config, seq_length=max(len(w) for w in windows) - 1, global_batch_size=len(windows)
    )
    with local.single_process():
        result = score.score(checked.checkpoint, cfg, windows)
    low, high = mean_interval(list(result.sequence_losses))
    return PerplexityResult(
        loss=result.loss,
        perplexity=result.perplexity,
        tokens=result.tokens,
        samples=result.sequences,
        loss_interval=(low, high),
        perplexity_interval=(_exp(low), _exp(high)),
    )


def _exp(value: float) -> float:
    return math.exp(value) if value < 700 else math.inf


def _generation(
    generator: generate.Generator, task: GenerationTask, examples: list[Example], ids: list[list[int]]
) -> GenerationResult:
    sampling = generate.Sampling(max_new_tokens=task.max_new_tokens, stop=tuple(task.stop))
    answers = [generator.generate(prompt, sampling).text for prompt in ids]
    correct = sum(
        exact_match(answer, example.reference) for example, answer in zip(examples, answers, strict=True)
    )
    return GenerationResult(
        exact_match=correct / len(examples),
        correct=correct,
        samples=len(examples),
        interval=wilson_interval(correct, len(examples)),
        smoke={
            "prompt": examples[0].prompt,
            "answer": answers[0],
            "max_new_tokens": task.max_new_tokens,
            "stop": list(task.stop),
        },
    )


def report(checkpoint: Path, results: dict[str, dict[str, dict]]) -> str:
    lines = [f"{checkpoint}:"]
    for name, r in results["perplexity"].items():
        low, high = r["perplexity_interval"]
        lines.append(
            f"  {name}: perplexity {r['perplexity']:.4f} (95 % interval {low:.4f}-{high:.4f}), loss "
            f"{r['loss']:.6f} per token over {r['tokens']:,} tokens in {r['samples']} windows"
        )
    for name, r in results["generation"].items():
        low, high = r["interval"]
        lines.append(
            f"  {name}: exact match {r['exact_match']:.1%} ({r['correct']} of {r['samples']}; 95 % Wilson "
            f"interval {low:.1%}-{high:.1%})"
        )
    for task, values in results.get("harness", {}).items():
        figures = ", ".join(f"{k} {v:.4g}" for k, v in values.items() if isinstance(v, float))
        lines.append(f"  lm-eval {task}: {figures}")
    return "\n".join(lines)
