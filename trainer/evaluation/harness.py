"""The bridge to EleutherAI's lm-evaluation-harness (`lm-eval` on PyPI, a dev dependency: requirements/dev.txt):
its tasks run on the checkpoint exported to Hugging Face, through its own `hf` model (transformers).

    evaluate --checkpoint CKPT --harness-tasks TASK[,TASK...] [--harness-include DIR] [--harness-limit N]

The checkpoint is exported as `convert --to-hf` does (float32), into a temporary directory beside the run with the
tokenizer, then `lm_eval.simple_evaluate(model="hf", ...)` runs the tasks on the CPU, one request at a time.
`--harness-include` is a directory of task YAML files (lm-eval's `TaskManager(include_path=...)`), for tasks
over local files; the harness's own tasks download their datasets from the Hugging Face Hub, which works only
where that is reachable. Results are lm-eval's `results` dictionary: {task: {"metric,filter": value, ...}}.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from trainer.checkpoint import formats
from trainer.checkpoint.record import ModelRecord
from trainer.data.tokenizer import HuggingFaceTokenizer
from trainer.distributed import parallel
from trainer.distributed.local import single_process
from trainer.interop import hf
from trainer.model import weights

# transformers loads a tokenizer.json alone as this class when tokenizer_config.json names it.
TOKENIZER_CLASS = "PreTrainedTokenizerFast"


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


def export(found: Path, record: ModelRecord, tokenizer: HuggingFaceTokenizer, out: Path) -> None:
    """The checkpoint as a Hugging Face Llama in float32 (convert --to-hf's code) with its tokenizer."""
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
    shutil.copyfile(tokenizer.path, out / "tokenizer.json")
    eos = tokenizer.detokenize([tokenizer.eod])
    settings = {"tokenizer_class": TOKENIZER_CLASS, "eos_token": eos, "pad_token": eos}
    (out / "tokenizer_config.json").write_text(json.dumps(settings | {"model_max_length": record.seq_length}))


def run(
    found: Path,
    record: ModelRecord,
    tokenizer: HuggingFaceTokenizer,
    tasks: list[str],
    include: Path | None,
    limit: int | None,
) -> dict:
    """Export, then lm-eval's simple_evaluate on the export; its per-task results."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory(prefix="harness-") as directory:
        model = Path(directory) / "hf"
        model.mkdir()
        export(found, record, tokenizer, model)
        output = lm_eval.simple_evaluate(
            model="hf",
            model_args={"pretrained": str(model), "dtype": "float32", "device": "cpu"},
            tasks=tasks,
            task_manager=TaskManager(include_path=str(include) if include else None),
            limit=limit,
            batch_size=1,
        )
    assert output is not None  # simple_evaluate returns None on ranks other than 0; this is one process
    return {task: _plain(values) for task, values in output["results"].items()}


def _plain(values: dict) -> dict:
    """JSON-friendly: lm-eval's numbers as floats, its "N/A" strings kept."""
    return {key: float(v) if isinstance(v, int | float) else v for key, v in values.items()}
