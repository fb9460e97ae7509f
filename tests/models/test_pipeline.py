"""`finetune-stages`: evaluate -> promote -> export on a real tiny run's checkpoints, in this process; a second call
writes nothing; bad input is refused before any stage; `make finetune` runs its stages 3-5 through it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from trainer.__main__ import main as trainer_main
from trainer.checkpoint.version import EVALUATIONS, read_record
from trainer.models.pipeline import EXPORT_MARKER_SUFFIX
from trainer.models.registry import TAGS


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root with its size and modification time: what a second run must leave unchanged."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def suite_for(tmp_path: Path, corpus: str) -> Path:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": p, "reference": "x"}) + "\n" for p in ("def ", "import ")))
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        f"perplexity:\n  - {{name: heldout, data: {corpus}, samples: 2}}\n"
        f"generation:\n  - {{name: echo, file: {tasks}, max_new_tokens: 4}}\n"
    )
    return suite


@pytest.mark.slow
def test_the_stages_run_once_and_a_second_call_writes_nothing(single, tiny_corpus, tmp_path, capsys):
    run, tags_root = tmp_path / "checkpoints-root" / "sft", tmp_path / "checkpoints-root"
    shutil.copytree(single.run_dir / "checkpoints", run / "checkpoints")  # the session's run stays as trained
    newest = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    version = read_record(newest).version
    argv = [
        "finetune-stages", "--run", str(run), "--suite", str(suite_for(tmp_path, tiny_corpus)), "--record", "sft",
        "--tag", "candidate", "--tokenizer", tiny_corpus + ".tokenizer.json", "--tags-root", str(tags_root),
    ]  # fmt: skip
    assert trainer_main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"{newest}:" in out and "heldout: perplexity" in out and "echo: exact match" in out
    assert f"candidate -> {version}; recorded in {tags_root / TAGS / 'candidate.json'}" in out

    evaluation = json.loads((newest / EVALUATIONS / "sft.json").read_text())
    assert (
        set(evaluation["results"]["perplexity"]) == {"heldout"}
        and evaluation["results"]["generation"]["echo"]
    )
    # At the tags root: on a stack /fsx/checkpoints, whose model-tags/ FSx exports to the bucket's.
    (event,) = json.loads((tags_root / TAGS / "candidate.json").read_text())["events"]
    assert event["version"] == version
    export = run / "export" / version
    assert json.loads((export / "config.json").read_text())["dtype"] == "bfloat16"
    assert "| sft | perplexity |" in (export / "README.md").read_text()  # the evaluation is in the model card
    marker = json.loads((run / "export" / f"{version}{EXPORT_MARKER_SUFFIX}").read_text())
    assert marker["version"] == version
    assert marker["files"] == {p.relative_to(export).as_posix(): p.stat().st_size for p in export.rglob("*")}

    before = snapshot(tmp_path / "checkpoints-root")
    assert trainer_main(argv) == 0
    again = capsys.readouterr().out
    assert f"evaluate: {newest} was evaluated as 'sft' already" in again
    assert f"candidate -> {version} already" in again and "nothing appended" in again
    assert f"export: {export} already" in again
    assert snapshot(tmp_path / "checkpoints-root") == before


def test_a_run_without_checkpoints_or_a_bad_suite_or_tag_is_refused_before_any_stage(tmp_path, capsys):
    argv = [
        "finetune-stages",
        "--run",
        str(tmp_path),
        "--suite",
        str(tmp_path / "none.yaml"),
        "--record",
        "sft",
    ]
    assert trainer_main(argv) == 2
    assert f"--run {tmp_path}: no checkpoints/ in it; train the run first" in capsys.readouterr().err
    (tmp_path / "checkpoints").mkdir()
    assert trainer_main(argv) == 2
    assert f"finetune-stages: suite {tmp_path / 'none.yaml'}: no such file" in capsys.readouterr().err
    (tmp_path / "suite.yaml").write_text("perplexity: []\n")
    argv[4] = str(tmp_path / "suite.yaml")
    assert trainer_main([*argv, "--tag", "Prod!"]) == 2
    assert "--tag 'Prod!': use lowercase letters" in capsys.readouterr().err
    written = sorted(tmp_path.rglob("*"))
    assert written == [tmp_path / "checkpoints", tmp_path / "suite.yaml"]  # nothing but what the test wrote


def test_make_finetune_runs_its_stages_3_to_5_through_the_stages_verb():
    planned = subprocess.run(
        ["make", "--no-print-directory", "-n", "finetune", "FINETUNE_TAG=candidate"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.replace("\\\n", " ")  # the recipe's continued lines as one
    (line,) = [line for line in planned.splitlines() if "finetune-stages" in line]
    assert line.split("-m trainer ")[1].split() == [
        "finetune-stages", "--run", "runs/sft-local", "--suite", "trainer/configs/suites/sft-local.yaml",
        "--record", "sft-local", "--tag", "candidate", "--tokenizer", "data/stdlib.tokenizer.json", "--dtype", "bf16",
    ]  # fmt: skip
    assert "trainer evaluate" not in planned and "trainer convert" not in planned


def test_the_export_dtypes_are_converts_short_names():
    from trainer.interop.hf import DTYPE_ALIASES
    from trainer.models.pipeline import DTYPES

    assert set(DTYPES) == set(DTYPE_ALIASES)
