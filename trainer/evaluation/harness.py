"""The bridge to EleutherAI's lm-evaluation-harness (`lm-eval` on PyPI, a dev dependency: requirements/dev.txt):
its tasks run on the checkpoint exported to Hugging Face, through its own `hf` model (transformers).

    evaluate --checkpoint CKPT --harness-tasks TASK[,TASK...] [--harness-include DIR] [--harness-limit N]

The checkpoint is exported as `convert --to-hf` does (float32), into a temporary directory beside the run with the
tokenizer files an export has (trainer/interop/export.py: the chat template the run was fine-tuned with, the stop
ids), then `lm_eval.simple_evaluate(model="hf", ...)` runs the tasks on the CPU, one request at a time. A model
fine-tuned on chat data is asked in its chat format: `apply_chat_template=True`, which renders each request with
the tokenizer's chat template (lm-eval 0.4.13 evaluator.py simple_evaluate, `apply_chat_template`; HFLM
chat_template), as the served model is asked.
`--harness-include` is a directory of task YAML files (lm-eval's `TaskManager(include_path=...)`), for tasks
over local files; the harness's own tasks download their datasets from the Hugging Face Hub, which works only
where that is reachable. Results are lm-eval's `results` dictionary: {task: {"metric,filter": value, ...}}.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from trainer.checkpoint import formats
from trainer.checkpoint.record import ModelRecord
from trainer.data.chat import ChatTemplate
from trainer.data.tokenizer import HuggingFaceTokenizer
from trainer.distributed import parallel
from trainer.distributed.local import single_process
from trainer.evaluation.generate import chat_template_of
from trainer.interop import export as inference
from trainer.interop import hf
from trainer.model import weights


class HarnessError(ValueError):
    """A harness run that cannot start."""


def check(tasks: list[str], include: Path | None) -> None:
    """lm-eval importable, the include directory present, every task known to it: before anything is exported."""
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise HarnessError(
            "--harness-tasks needs lm-evaluation-harness: pip install -r requirements/dev.txt (make venv)"
        ) from None
    if include is not None and not include.is_dir():
        raise HarnessError(
            f"--harness-include {include}: no such directory (give a directory of task YAML files)"
        )
    manager = TaskManager(include_path=str(include) if include else None)
    unknown = [task for task in tasks if task not in manager.all_tasks]
    if unknown:
        raise HarnessError(
            f"--harness-tasks: unknown to lm-eval: {', '.join(unknown)} (its tasks, and those in --harness-include)"
        )


def export(
    found: Path,
    record: ModelRecord,
    tokenizer: HuggingFaceTokenizer,
    out: Path,
    template: ChatTemplate | None,
) -> None:
    """The checkpoint as a Hugging Face Llama in float32 (convert --to-hf's code) with an export's tokenizer files
    and generation_config.json (trainer/interop/export.py)."""
    import torch

    with single_process():
        parallel.initialize(weights.model_only_config(record.config, seq_length=record.seq_length))
        try:
            full_weights = formats.full_weights(found, record)
            config = hf.to_hf_config(record.config, record.hf_config, torch.float32, record.seq_length)
            config |= {"eos_token_id": tokenizer.eod, "bos_token_id": None}
            hf.write(out, record.config, full_weights, config, torch.float32, hf.parse_size("5GB"))
        finally:
            parallel.shutdown()
    tokens = inference.write_tokenizer(out, Path(tokenizer.path), record.seq_length, template)
    generation = inference.generation_config(tokens) | {"max_length": record.seq_length}
    (out / inference.GENERATION_CONFIG).write_text(json.dumps(generation, indent=2) + "\n")


def run(
    found: Path,
    record: ModelRecord,
    tokenizer: HuggingFaceTokenizer,
    tasks: list[str],
    include: Path | None,
    limit: int | None,
) -> dict:
    """Export, then lm-eval's simple_evaluate on the export (in the chat format for a chat fine-tune); its
    per-task results."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    template = chat_template_of(found, tokenizer.path)
    with tempfile.TemporaryDirectory(prefix="harness-") as directory:
        model = Path(directory) / "hf"
        model.mkdir()
        export(found, record, tokenizer, model, template)
        output = lm_eval.simple_evaluate(
            model="hf",
            model_args={"pretrained": str(model), "dtype": "float32", "device": "cpu"},
            tasks=tasks,
            task_manager=TaskManager(include_path=str(include) if include else None),
            limit=limit,
            batch_size=1,
            apply_chat_template=template is not None,
        )
    assert output is not None  # simple_evaluate returns None on ranks other than 0; this is one process
    return {task: _plain(values) for task, values in output["results"].items()}


def _plain(values: dict) -> dict:
    """JSON-friendly: lm-eval's numbers as floats, its "N/A" strings kept."""
    return {key: float(v) if isinstance(v, int | float) else v for key, v in values.items()}
