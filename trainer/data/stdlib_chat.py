"""The built-in chat set: questions and answers about the Python standard library's own functions, made from its
sources (no download), to fine-tune the `make train` model, which was pretrained on those same sources.

For every public top-level function with a docstring, in sorted file order: "What does MODULE.NAME do?" answered by
the docstring's first line, and "How do I call MODULE.NAME?" answered by its signature as written (`def
NAME(ARGS)`). The same Python version gives byte-identical conversations; a system turn opens every tenth one.
"""

from __future__ import annotations

import ast
import json
import sysconfig
from pathlib import Path

from trainer.data.sources import stdlib_sources

SYSTEM = "You answer questions about the Python standard library in one line."
# An answer longer than this is left out: the set is for a 128-token local model.
MAX_ANSWER_CHARS = 100


def stdlib_conversations() -> list[dict]:
    """The chat set as OpenAI-style `messages` records."""
    root = Path(sysconfig.get_paths()["stdlib"])
    records: list[dict] = []
    for path in stdlib_sources():
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
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
    return records


def write_stdlib_chat(path: Path) -> Path:
    """The chat set as JSONL at `path`, rewritten only when its contents change (so `prepare` finds it cached)."""
    text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in stdlib_conversations())
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.tmp")
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(path)
    return path
