"""An evaluation suite: the YAML file `evaluate --suite` and `evaluation.suite` read, checked whole before any
model is built, and the arithmetic of its figures (exact match, intervals).

    perplexity:                      # held-out prepared datasets: loss per token and perplexity, as `score`
      - name: stdlib-heldout
        data: data/stdlib            # PREFIX.bin / PREFIX.idx
        samples: 16                  # windows of seq_length + 1 tokens from the start of the token stream
        seq_length: 128              # default: the checkpoint's training sequence length
    generation:                      # local JSONL tasks, one {"prompt": ..., "reference": ...} per line
      - name: completions
        file: tasks/completions.jsonl
        max_new_tokens: 16
        stop: ["\\n"]                 # default: none
        limit: 100                   # default: every line
    deploy:                          # optional: the continuous-delivery gate (`make finetune STACK= DEPLOY=1`)
      metric: generation.completions.exact_match   # <perplexity|generation>.<task>.<figure>
      margin: 0.02                   # beat the live version's figure by this much (lower is better for perplexity
                                     # and loss, higher for exact_match)

Paths are relative to the working directory, as a training config's are.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, model_validator

from trainer.config import TrainConfig
from trainer.evaluation.jsonl import string_records

# The two-sided 95 % normal quantile, Phi^-1(0.975), for both intervals.
Z_95 = 1.959963984540054


class SuiteError(ValueError):
    """A suite that cannot run; names the file, the key and what is valid."""


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")  # a metric name's part


class PerplexityTask(_Entry):
    data: str = Field(min_length=1)
    samples: PositiveInt = 16
    seq_length: PositiveInt | None = None


class GenerationTask(_Entry):
    file: str = Field(min_length=1)
    max_new_tokens: PositiveInt = 32
    stop: list[str] = []
    limit: PositiveInt | None = None


# The figures a gate may compare, and which way is better.
GATE_FIGURES = {"perplexity": {"perplexity": -1, "loss": -1}, "generation": {"exact_match": 1}}


class DeployGate(BaseModel):
    """When a new version may replace the live one on the stack's endpoint (trainer/deploy/gate.py)."""

    model_config = ConfigDict(extra="forbid")
    metric: str = Field(pattern=r"^(perplexity|generation)\.[A-Za-z0-9_.-]+\.[a-z_]+$")
    margin: float = Field(ge=0)

    @property
    def parts(self) -> tuple[str, str, str]:
        kind, rest = self.metric.split(".", 1)
        task, figure = rest.rsplit(".", 1)
        return kind, task, figure

    @property
    def better(self) -> int:
        """1: higher is better, -1: lower is."""
        kind, _, figure = self.parts
        return GATE_FIGURES[kind][figure]


class Suite(BaseModel):
    model_config = ConfigDict(extra="forbid")
    perplexity: list[PerplexityTask] = []
    generation: list[GenerationTask] = []
    deploy: DeployGate | None = None

    @model_validator(mode="after")
    def _named_once(self) -> Suite:
        names = [task.name for task in (*self.perplexity, *self.generation)]
        if not names:
            raise ValueError("the suite names no task: give a perplexity or a generation list")
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"task names must differ; repeated: {', '.join(repeated)}")
        if self.deploy is not None:
            kind, task, figure = self.deploy.parts
            tasks = [t.name for t in (self.perplexity if kind == "perplexity" else self.generation)]
            if task not in tasks or figure not in GATE_FIGURES[kind]:
                valid = [f"{kind}.{t}.{f}" for t in tasks for f in GATE_FIGURES[kind]]
                raise ValueError(
                    f"deploy.metric {self.deploy.metric!r} names no figure of this suite; valid: "
                    f"{', '.join(valid) or 'none (add a ' + kind + ' task)'}"
                )
        return self


def _valid_keys(loc: tuple) -> list[str]:
    """The keys allowed where an unknown one stood: the top level's, or a perplexity or generation task's."""
    model: type[BaseModel] = Suite
    if len(loc) > 1 and loc[0] in ("perplexity", "generation"):
        model = PerplexityTask if loc[0] == "perplexity" else GenerationTask
    return list(model.model_fields)


def read_suite(path: str | Path) -> Suite:
    """The suite at path, every task's files checked to exist; SuiteError names what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise SuiteError(f"suite {path}: no such file")
    try:
        raw = yaml.safe_load(path.read_text())
        suite = Suite.model_validate(raw if raw is not None else {})
    except yaml.YAMLError as error:
        raise SuiteError(f"suite {path}: not YAML ({error})") from None
    except ValidationError as error:
        problems = []
        for detail in error.errors():
            where = ".".join(str(part) for part in detail["loc"]) or "(top level)"
            message = detail["msg"].removeprefix("Value error, ")
            if detail["type"] == "extra_forbidden":
                message = f"unknown key; valid: {', '.join(_valid_keys(detail['loc']))}"
            problems.append(
                f"{where}: {message}" + ("" if detail["type"] == "missing" else f" (got {detail['input']!r})")
            )
        raise SuiteError(f"suite {path}: " + "; ".join(problems)) from None
    for i, task in enumerate(suite.perplexity):
        if not (Path(task.data + ".bin").is_file() and Path(task.data + ".idx").is_file()):
            raise SuiteError(
                f"suite {path}: perplexity.{i}.data = {task.data!r}: no {task.data}.bin / .idx "
                "(prepare it with `python -m trainer prepare`)"
            )
    for i, generation in enumerate(suite.generation):
        read_examples(generation, f"suite {path}: generation.{i}.file")
    return suite


@dataclass(frozen=True)
class Example:
    prompt: str
    reference: str


def read_examples(task: GenerationTask, where: str) -> list[Example]:
    path = Path(task.file)
    if not path.is_file():
        raise SuiteError(f"{where} = {task.file!r}: no such file")
    shape = 'give an object with string "prompt" and "reference"'
    entries = string_records(path, ("prompt", "reference"), f"{where}: {task.file}", shape, SuiteError)
    examples = [Example(entry["prompt"], entry["reference"]) for entry in entries]
    if not examples:
        raise SuiteError(
            f'{where}: {task.file} holds no examples; give one {{"prompt", "reference"}} per line'
        )
    return examples[: task.limit]


def normalise(text: str) -> str:
    """Exact match compares answers after this: Unicode NFKC, case folded, whitespace runs made one space, and
    the ends stripped. Punctuation and articles are kept (code and arithmetic answers depend on them)."""
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text).casefold()).strip()


def exact_match(prediction: str, reference: str) -> bool:
    return normalise(prediction) == normalise(reference)


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval for a proportion (E. B. Wilson, "Probable inference, the law of succession, and
    statistical inference", JASA 22 (1927) 209-212): unlike the normal one it stays inside [0, 1] and is not empty
    at 0 or n successes."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"wilson_interval: {successes} successes in {trials} trials")
    p, n = successes / trials, trials
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(values: list[float], z: float = Z_95) -> tuple[float, float]:
    """The normal-approximation interval for a mean, mean +- z s / sqrt(n) with the sample standard deviation
    (n - 1); one value gives no spread, so an unbounded interval."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return -math.inf, math.inf
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean - z * spread / math.sqrt(n), mean + z * spread / math.sqrt(n)


def evaluation_problems(cfg: TrainConfig) -> list[str]:
    """The suite readable and whole, the interval on checkpoint saves: checked before training starts."""
    e = cfg.evaluation
    if e.suite is None:
        return (
            []
            if e.interval is None
            else ["evaluation.interval is set but evaluation.suite is not: give both"]
        )
    problems = []
    try:
        read_suite(e.suite)
    except SuiteError as error:
        problems.append(f"evaluation.suite = {e.suite!r}: {error}")
    save = cfg.checkpoint.save_interval
    if e.interval is not None and (save is None or e.interval % save):
        problems.append(
            f"evaluation.interval = {e.interval}: evaluation runs on a saved checkpoint, so give a multiple of "
            f"checkpoint.save_interval ({save}), or leave it unset to evaluate at every save"
        )
    return problems
