"""`evaluate`: a suite's figures against the same figures computed by hand with transformers on the exported model
(perplexity and its interval over windows; exact match after normalisation and its Wilson interval); a bad suite or
a prompt beyond the context is refused before the model is built; --record adds the results beside the model
version once."""

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from trainer.__main__ import main as trainer_main
from trainer.checkpoint.version import EVALUATIONS, RECORD, read_evaluations
from trainer.data.tokenizer import load_tokenizer
from trainer.evaluation.score import _windows

Z = 1.959963984540054
PROMPTS = ["def parse(self, ", "import email\n", "class Message"]


def test_wilson_interval_of_two_in_three_is_the_hand_computed_one():
    # n = 3, p = 2/3, z^2 = 3.841459: centre (2/3 + z^2/6) / (1 + z^2/3) = 0.573084,
    # half z / (1 + z^2/3) * sqrt(p (1 - p) / 3 + z^2 / 36) = 0.365424
    from trainer.evaluation.suite import wilson_interval

    low, high = wilson_interval(2, 3)
    assert (low, high) == (pytest.approx(0.207660, abs=2e-6), pytest.approx(0.938508, abs=2e-6))


@pytest.mark.slow
def test_suite_figures_equal_a_hand_computation_on_the_exported_model(
    tp2_pp2, exported_tp2_pp2, tiny_corpus, tmp_path, capsys
):
    tokenizer_file = tiny_corpus + ".tokenizer.json"
    tokenizer = load_tokenizer(tokenizer_file)
    model = LlamaForCausalLM.from_pretrained(exported_tp2_pp2, dtype=torch.float32).eval()

    def greedy_text(prompt: str) -> str:
        ids = tokenizer.tokenize(prompt)
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                do_sample=False,
                max_new_tokens=8,
                eos_token_id=tokenizer.eod,
                pad_token_id=tokenizer.eod,
            )[0, len(ids) :].tolist()
        return tokenizer.detokenize(t for t in out if t != tokenizer.eod)

    # Two references that match after normalisation (one as generated, one re-cased and re-spaced), one that does not.
    references = [
        greedy_text(PROMPTS[0]),
        "  " + greedy_text(PROMPTS[1]).upper() + "\n",
        "certainly not this",
    ]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"prompt": p, "reference": r}) + "\n" for p, r in zip(PROMPTS, references, strict=True)
        )
    )
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        f"perplexity:\n  - {{name: heldout, data: {tiny_corpus}, samples: 4}}\n"
        f"generation:\n  - {{name: echo, file: {tasks}, max_new_tokens: 8}}\n"
    )
    code = trainer_main(
        [
            "evaluate",
            "--checkpoint",
            str(tp2_pp2.run_dir / "checkpoints"),
            "--suite",
            str(suite),
            "--tokenizer",
            tokenizer_file,
            "--format",
            "json",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)

    # By hand: each window's mean cross entropy under transformers, their mean, mean +- z s / sqrt(n).
    windows = _windows(type("Args", (), {"data": tiny_corpus, "samples": 4, "seq_length": None})(), 32)
    with torch.no_grad():
        losses = [
            F.cross_entropy(model(torch.tensor([w])).logits[0, :-1], torch.tensor(w[1:])).item()
            for w in windows
        ]
    mean = sum(losses) / 4
    spread = (sum((x - mean) ** 2 for x in losses) / 3) ** 0.5
    heldout = result["perplexity"]["heldout"]
    assert (heldout["tokens"], heldout["samples"]) == (4 * 32, 4)
    assert heldout["loss"] == pytest.approx(mean, rel=1e-5)
    assert heldout["perplexity"] == pytest.approx(torch.tensor(mean).exp().item(), rel=1e-5)
    assert heldout["loss_interval"] == pytest.approx([mean - Z * spread / 2, mean + Z * spread / 2], rel=1e-4)
    assert spread > 0

    echo = result["generation"]["echo"]
    assert (echo["correct"], echo["samples"]) == (2, 3)
    assert echo["exact_match"] == pytest.approx(2 / 3)
    assert echo["interval"] == pytest.approx([0.207660, 0.938508], abs=2e-6)
    # the first prompt's greedy answer, transformers' own: what make deploy's smoke request must get back
    assert echo["smoke"] == {"prompt": PROMPTS[0], "answer": references[0], "max_new_tokens": 8, "stop": []}


@pytest.mark.slow
def test_a_generation_prompt_beyond_the_context_is_refused_before_the_model_is_built(
    tp2_pp2, tiny_corpus, tmp_path, capsys, monkeypatch
):
    from trainer.evaluation import generate

    monkeypatch.setattr(generate.Generator, "loaded", None)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"prompt": "x = 1\n" * 40, "reference": "y"}) + "\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"generation:\n  - {{name: long, file: {tasks}}}\n")
    code = trainer_main(
        [
            "evaluate",
            "--checkpoint",
            str(tp2_pp2.run_dir / "checkpoints"),
            "--suite",
            str(suite),
            "--tokenizer",
            tiny_corpus + ".tokenizer.json",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "generation task 'long': prompt 0 has" in err and "model's context of 32" in err


@pytest.mark.slow
def test_record_adds_the_results_beside_the_model_version_once(tp2_pp2, tiny_corpus, tmp_path, capsys):
    newest = max((tp2_pp2.run_dir / "checkpoints").glob("iter_*"))
    checkpoint = tmp_path / newest.name  # a copy: the session's checkpoint stays as other tests read it
    shutil.copytree(newest, checkpoint)
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"perplexity:\n  - {{name: heldout, data: {tiny_corpus}, samples: 2}}\n")
    arguments = ["evaluate", "--checkpoint", str(checkpoint), "--suite", str(suite), "--record", "nightly"]
    arguments += ["--tokenizer", tiny_corpus + ".tokenizer.json"]
    assert trainer_main(arguments) == 0, capsys.readouterr().err
    (entry,) = read_evaluations(checkpoint)
    assert entry["name"] == "nightly" and entry["results"]["suite"] == str(suite)
    assert entry["results"]["perplexity"]["heldout"]["samples"] == 2
    written = (checkpoint / EVALUATIONS / "nightly.json").read_bytes()
    capsys.readouterr()

    assert trainer_main(arguments) == 0  # a re-run (a pipeline resumed) evaluates nothing, rewrites nothing
    assert "was evaluated as 'nightly' already" in capsys.readouterr().out
    assert (checkpoint / EVALUATIONS / "nightly.json").read_bytes() == written

    (checkpoint / RECORD).unlink()
    assert trainer_main(arguments) == 2
    assert (
        "has no model_version.json: evaluations attach to a registered model version"
        in capsys.readouterr().err
    )
