"""The built-in chat set: questions and answers about the Python standard library's own functions, made from its
sources (no download), to fine-tune the `make train` model, which was pretrained on those same sources.

For every public top-level function with a docstring, in sorted file order: "What does MODULE.NAME do?" answered by
the docstring's first line, and "How do I call MODULE.NAME?" answered by its signature as written (`def
NAME(ARGS)`). The same Python version gives byte-identical conversations; a system turn opens every tenth one.
Every HELD_OUT_EVERY-th conversation is held out of training: `make finetune` evaluates on those (their question
rendered through the chat template, the answer as the reference; exact match in docs/evaluate.md).
"""

from __future__ import annotations

import ast
import functools
import gc
import json
import sysconfig
from collections.abc import Callable
from pathlib import Path

from trainer.data.sources import stdlib_sources

SYSTEM = "You answer questions about the Python standard library in one line."
# An answer longer than this is left out: the set is for a 128-token local model.
MAX_ANSWER_CHARS = 100
# One conversation in this many is held out of training, for evaluation (the last of each run of them).
HELD_OUT_EVERY = 20


def parse_python(text: str) -> ast.Module:
    """ast.parse with garbage collection paused: CPython 3.11's AST constructor raises SystemError ("AST constructor
    recursion depth mismatch") when a collection during it runs Python finalizers (python/cpython#106905,
    pytest-dev/pytest#10763; seen in CI after a leaked asyncio Future's finalizer logged)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(text)
    finally:
        if enabled:
            gc.enable()


@functools.cache
def stdlib_conversations() -> tuple[dict, ...]:
    """The chat set as OpenAI-style `messages` records (parsed once per process: the training file and the held-out
    tasks both read it; the records are not to be changed)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    records: list[dict] = []
    for path in stdlib_sources():
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        try:
            tree = parse_python(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a few stdlib files are templates or other encodings: not part of the set
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            name = f"{module}.{node.name}"
            docstring = ast.get_docstring(node)
            summary = docstring.strip().splitlines()[0].strip() if docstring and docstring.strip() else ""
            signature = f"def {node.name}({ast.unparse(node.args)})"
            for question, answer in (
                (f"What does {name} do?", summary),
                (f"How do I call {name}?", signature),
            ):
                if answer and len(answer) <= MAX_ANSWER_CHARS:
                    messages = [
                        {"role": "user", "content": question},
                        {"role": "assistant", "content": answer},
                    ]
                    if len(records) % 10 == 0:
                        messages.insert(0, {"role": "system", "content": SYSTEM})
                    records.append({"messages": messages})
    return tuple(records)


def held_out(index: int) -> bool:
    return index % HELD_OUT_EVERY == HELD_OUT_EVERY - 1


def write_stdlib_chat(path: Path) -> Path:
    """The chat set's training conversations as JSONL at `path` (the held-out ones left out), rewritten only when
    its contents change (so `prepare` finds it cached)."""
    records = [record for i, record in enumerate(stdlib_conversations()) if not held_out(i)]
    return _write_if_changed(path, records)


def write_stdlib_tasks(path: Path, prompt: Callable[[list[dict]], str]) -> Path:
    """The held-out conversations as a generation task (docs/evaluate.md): each question rendered as the model sees
    it by `prompt` (the chat template up to an opened assistant turn), and its answer as the reference."""
    tasks = [
        {
            "prompt": prompt(record["messages"][:-1]),
            "reference": record["messages"][-1]["content"],
        }
        for i, record in enumerate(stdlib_conversations())
        if held_out(i)
    ]
    return _write_if_changed(path, tasks)


def _write_if_changed(path: Path, records: list[dict]) -> Path:
    text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.tmp")
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(path)
    return path
