"""The lm-evaluation-harness bridge: a local custom task (a YAML task over a local JSONL, nothing downloaded) runs on
the exported checkpoint, and its exact match agrees with our own greedy generation; bad requests are refused first."""

import json

import pytest

from trainer.__main__ import main as trainer_main

PROMPTS = ["def parse(self, ", "import email\n", "class Message"]


def task_yaml(data: str) -> str:
    # lm-eval's task guide ("Parameters"): dataset_path / dataset_kwargs are datasets.load_dataset's arguments
    return f"""task: trainstack_echo
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{reference}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


@pytest.mark.slow
def test_a_local_task_runs_on_the_exported_model_and_agrees_with_our_greedy_text(
    tp2_pp2, tiny_corpus, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    checkpoint = [
        "--checkpoint",
        str(tp2_pp2.run_dir / "checkpoints"),
        "--tokenizer",
        tiny_corpus + ".tokenizer.json",
    ]
    ours = []
    for prompt in PROMPTS[:2]:
        assert trainer_main(["generate", *checkpoint, "--prompt", prompt, "--max-new-tokens", "6", "--stop", "\n",
                             "--format", "json"]) == 0  # fmt: skip
        ours.append(json.loads(capsys.readouterr().out)["text"])
    data = tmp_path / "echo.jsonl"
    references = [*ours, "certainly not this"]
    data.write_text(
        "".join(
            json.dumps({"prompt": p, "reference": r}) + "\n" for p, r in zip(PROMPTS, references, strict=True)
        )
    )
    include = tmp_path / "tasks"
    include.mkdir()
    (include / "echo.yaml").write_text(task_yaml(str(data)))
    code = trainer_main(["evaluate", *checkpoint, "--harness-tasks", "trainstack_echo", "--harness-include",
                         str(include), "--format", "json"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out.strip().splitlines()[-1])
    assert result["harness"]["trainstack_echo"]["exact_match,none"] == pytest.approx(2 / 3)


def test_an_unknown_task_or_a_missing_include_directory_is_refused(tmp_path):
    from trainer.evaluation.harness import HarnessError, check

    include = tmp_path / "tasks"
    include.mkdir()
    (include / "echo.yaml").write_text(task_yaml(str(tmp_path / "echo.jsonl")))
    # One index of lm-eval's tasks (seconds to build): the include's task is known, since only the misspelling is named.
    with pytest.raises(HarnessError, match=r"--harness-tasks: unknown to lm-eval: trainstack_ecko \("):
        check(["trainstack_echo", "trainstack_ecko"], include)
    with pytest.raises(HarnessError, match=r"--harness-include .*nowhere: no such directory"):
        check(["trainstack_echo"], tmp_path / "nowhere")


def test_evaluate_needs_a_suite_or_harness_tasks(capsys):
    assert trainer_main(["evaluate", "--checkpoint", "anywhere"]) == 2
    assert "give --suite FILE.yaml, --harness-tasks TASK,..., or both" in capsys.readouterr().err


@pytest.mark.slow
def test_the_harness_export_carries_the_chat_template_that_lm_eval_applies(tp2_pp2, tiny_corpus, tmp_path):
    """A chat fine-tune is evaluated in its chat format: the harness's export holds the run's template (as every
    export does), and lm-eval's hf model, asked to apply_chat_template (lm-eval 0.4.13 simple_evaluate), renders
    each request with it."""
    from lm_eval.models.huggingface import HFLM

    from trainer.data.chat import load_chat_template
    from trainer.data.tokenizer import load_tokenizer, read_tokenizer
    from trainer.evaluation import harness
    from trainer.evaluation.generate import checkpoint_and_record

    path = tiny_corpus + ".tokenizer.json"
    template = load_chat_template(read_tokenizer(path), path, None)
    found, record = checkpoint_and_record(tp2_pp2.run_dir / "checkpoints")
    out = tmp_path / "hf"
    out.mkdir()
    harness.export(found, record, load_tokenizer(path), out, template)
    model = HFLM(pretrained=str(out), dtype="float32", device="cpu", batch_size=1)
    assert model.chat_template(True) == template.source
    chat = [{"role": "user", "content": "def f():"}]
    assert model.apply_chat_template(chat) == template.render(chat, add_generation_prompt=True)
    assert (
        json.loads((out / "generation_config.json").read_text())["eos_token_id"] == load_tokenizer(path).eod
    )
