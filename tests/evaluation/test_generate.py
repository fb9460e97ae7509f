"""`generate`: greedy decoding with megatron-core's KV cache equals transformers' greedy `generate` on the exported
model token for token (from a TP=2 x PP=2 checkpoint); sampling filters equal transformers' warpers; bad input is
refused before the model is built."""

import json

import pytest
import torch
from transformers import LlamaForCausalLM
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from trainer.__main__ import main as trainer_main
from trainer.data.tokenizer import load_tokenizer
from trainer.evaluation.generate import (
    GenerateError,
    Sampling,
    check_context,
    next_token_distribution,
    read_prompts,
)

PROMPTS = ["def parse(self, ", "import email\n", "class Message"]
NEW_TOKENS = 24


def run_generate(capsys, *args: str) -> tuple[int, str, str]:
    code = trainer_main(["generate", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_greedy_equals_transformers_generate_from_a_tp2_pp2_checkpoint(
    tp2_pp2, exported_tp2_pp2, tiny_corpus, tmp_path, capsys
):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    tokenizer_file = tiny_corpus + ".tokenizer.json"
    code, out, err = run_generate(
        capsys,
        "--checkpoint",
        str(tp2_pp2.run_dir / "checkpoints"),
        "--prompts",
        str(prompts),
        "--tokenizer",
        tokenizer_file,
        "--max-new-tokens",
        str(NEW_TOKENS),
        "--temperature",
        "0",
        "--format",
        "json",
    )
    assert code == 0, err
    results = [json.loads(line) for line in out.splitlines()]
    tokenizer = load_tokenizer(tokenizer_file)
    model = LlamaForCausalLM.from_pretrained(exported_tp2_pp2, dtype=torch.float32).eval()
    for prompt, result in zip(PROMPTS, results, strict=True):
        ids = tokenizer.tokenize(prompt)
        assert result["prompt_tokens"] == ids
        with torch.no_grad():
            want = model.generate(
                torch.tensor([ids]),
                do_sample=False,
                max_new_tokens=NEW_TOKENS,
                eos_token_id=tokenizer.eod,
                pad_token_id=tokenizer.eod,
            )[0, len(ids) :].tolist()
        assert result["tokens"] == want
        assert result["text"] == tokenizer.detokenize(t for t in want if t != tokenizer.eod)
    assert len({tuple(r["tokens"]) for r in results}) > 1  # the prompts steer the model


@pytest.mark.slow
def test_streamed_text_is_the_json_text_and_a_stop_sequence_cuts_it(tp2_pp2, tiny_corpus, capsys):
    common = [
        "--checkpoint",
        str(tp2_pp2.run_dir / "checkpoints"),
        "--tokenizer",
        tiny_corpus + ".tokenizer.json",
    ]
    common += ["--prompt", PROMPTS[0], "--max-new-tokens", str(NEW_TOKENS)]
    _, out, _ = run_generate(capsys, *common, "--format", "json")
    full = json.loads(out)
    _, streamed, _ = run_generate(capsys, *common)
    assert streamed == PROMPTS[0] + full["text"] + "\n"
    stop = full["text"][len(full["text"]) // 2 :][:3]
    assert stop  # a stop sequence from the middle of the greedy text
    _, out, _ = run_generate(capsys, *common, "--format", "json", "--stop", stop)
    cut = json.loads(out)
    assert cut["text"] == full["text"][: full["text"].find(stop)]
    assert cut["tokens"] == full["tokens"][: len(cut["tokens"])] and len(cut["tokens"]) < len(full["tokens"])


@pytest.mark.slow
def test_sampling_is_seeded_and_differs_from_greedy(tp2_pp2, tiny_corpus, capsys):
    common = [
        "--checkpoint",
        str(tp2_pp2.run_dir / "checkpoints"),
        "--tokenizer",
        tiny_corpus + ".tokenizer.json",
    ]
    common += ["--prompt", PROMPTS[1], "--max-new-tokens", "16", "--format", "json"]
    sampled = [
        json.loads(run_generate(capsys, *common, "--temperature", "1.5", "--top-p", "0.95", "--seed", s)[1])[
            "tokens"
        ]
        for s in ("1", "1", "2")
    ]
    assert sampled[0] == sampled[1] != sampled[2]


@pytest.mark.slow
def test_a_prompt_longer_than_the_context_is_refused_before_the_model_is_built(
    tp2_pp2, tiny_corpus, capsys, monkeypatch
):
    from trainer.evaluation import generate

    monkeypatch.setattr(generate.Generator, "loaded", None)  # building the model would fail loudly
    code, _, err = run_generate(
        capsys,
        "--checkpoint",
        str(tp2_pp2.run_dir / "checkpoints"),
        "--tokenizer",
        tiny_corpus + ".tokenizer.json",
        "--prompt",
        "def f(x):\n    return x\n" * 20,
    )
    assert code == 2
    assert "prompt 0 has" in err and "more than the model's context of 32" in err


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(temperature=-1.0), "--temperature -1.0: give 0 (greedy) or a positive number"),
        (dict(temperature=float("nan")), "--temperature nan"),
        (dict(top_k=-2), "--top-k -2: give 0 (off) or a positive count"),
        (dict(top_p=0.0), "--top-p 0.0: give a probability mass in (0, 1]"),
        (dict(top_p=1.5), "--top-p 1.5"),
        (dict(max_new_tokens=0), "--max-new-tokens 0: give 1 or more"),
        (dict(stop=("",)), "--stop '': give a non-empty stop sequence"),
    ],
)
def test_bad_sampling_settings_are_refused(settings, message):
    with pytest.raises(
        GenerateError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        Sampling(**settings)


def test_context_check_names_the_prompt_its_length_and_the_remedy():
    check_context([[1] * 20], 12, 32)  # exactly fits
    with pytest.raises(GenerateError) as error:
        check_context([[1] * 5, [1] * 20], 13, 32)
    assert str(error.value) == (
        "prompt 1 has 20 tokens; with --max-new-tokens 13 it needs 33 positions, more than the model's context "
        "of 32 (the sequence length it was trained at): shorten the prompt or give --max-new-tokens 12 or less"
    )
    with pytest.raises(GenerateError, match="give at most 31 prompt tokens"):
        check_context([[1] * 40], 1, 32)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"prompt": "a"}\nnot json\n', "line 2: not JSON"),
        ('{"text": "a"}\n', 'line 1: give an object with a string "prompt"'),
        ("\n\n", "no prompts"),
    ],
)
def test_bad_prompt_files_are_refused(content, message, tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(content)
    with pytest.raises(GenerateError, match=message):
        read_prompts(path)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(0.7, 0, 1.0), (1.0, 5, 1.0), (1.0, 0, 0.8), (1.3, 7, 0.6)]
)
def test_sampling_filters_equal_transformers_warpers(temperature, top_k, top_p):
    logits = torch.randn(300, generator=torch.Generator().manual_seed(5)) * 3
    want = logits[None].clone()
    # transformers' own order in GenerationMixin._get_logits_processor: temperature, top-k, top-p
    want = TemperatureLogitsWarper(temperature)(None, want)
    if top_k:
        want = TopKLogitsWarper(top_k)(None, want)
    if top_p < 1:
        want = TopPLogitsWarper(top_p)(None, want)
    got = next_token_distribution(logits, Sampling(temperature=temperature, top_k=top_k, top_p=top_p))
    assert torch.equal(torch.isinf(got), torch.isinf(want[0]))
    kept = ~torch.isinf(got)
    assert 1 < kept.sum() < 300 or (top_k == 0 and top_p == 1)
    assert torch.allclose(got[kept], want[0][kept])


@pytest.mark.slow
def test_the_sample_after_training_is_the_greedy_continuation_of_the_runs_newest_checkpoint(
    tp2_pp2, tiny_config, tiny_corpus, capsys
):
    from trainer.config import load_config
    from trainer.evaluation.generate import sample_after_training

    cfg = load_config(tiny_config, [f"logging.run_dir={tp2_pp2.run_dir}"])
    sample_after_training(cfg, PROMPTS[2], 8)
    sample = capsys.readouterr().out
    common = [
        "--checkpoint",
        str(tp2_pp2.run_dir / "checkpoints"),
        "--tokenizer",
        tiny_corpus + ".tokenizer.json",
    ]
    _, out, _ = run_generate(
        capsys, *common, "--prompt", PROMPTS[2], "--max-new-tokens", "8", "--format", "json"
    )
    assert f"(greedy, 8 tokens):\n{PROMPTS[2]}{json.loads(out)['text']}\n--- (" in sample


@pytest.mark.slow
def test_a_checkpoint_alone_is_enough_its_record_names_the_tokenizer_and_an_end_of_turn_id_stops(
    tp2_pp2, tiny_corpus, capsys
):
    """`generate --checkpoint <run>/checkpoints` reads the tokenizer its model version record names; and a
    generator stops at any of its stop ids (the end-of-turn token of a chat template, stop_ids), which the text
    leaves out, as transformers stops at every id of generation_config.json's eos_token_id."""
    from trainer.evaluation.generate import Generator, checkpoint_and_record

    checkpoints = str(tp2_pp2.run_dir / "checkpoints")
    common = ["--prompt", PROMPTS[0], "--max-new-tokens", "8", "--format", "json"]
    code, alone, err = run_generate(capsys, "--checkpoint", checkpoints, *common)
    assert code == 0, err
    tokenizer_file = tiny_corpus + ".tokenizer.json"
    _, given, _ = run_generate(capsys, "--checkpoint", checkpoints, "--tokenizer", tokenizer_file, *common)
    assert json.loads(alone) == json.loads(given)

    greedy = json.loads(alone)["tokens"]
    tokenizer = load_tokenizer(tokenizer_file)
    found, record = checkpoint_and_record(tp2_pp2.run_dir / "checkpoints")
    with Generator.loaded(found, record, tokenizer, frozenset({tokenizer.eod, greedy[3]})) as generator:
        result = generator.generate(tokenizer.tokenize_prompt(PROMPTS[0]), Sampling(max_new_tokens=8))
    assert result.tokens == greedy[: greedy.index(greedy[3]) + 1] and result.stopped_by == "eod"
    assert result.text == tokenizer.detokenize(greedy[: greedy.index(greedy[3])])


def test_prompts_read_special_token_text_as_the_token_where_training_data_reads_it_literally(tiny_corpus):
    """Training data encodes a literal "<|endoftext|>" inside a document as characters (only prepare's EOD ends
    one); a prompt, like transformers' tokenizer, vLLM and lm-eval, reads it as the token."""
    tokenizer = load_tokenizer(tiny_corpus + ".tokenizer.json")
    text = "x = 1<|endoftext|>"
    assert tokenizer.tokenize_prompt(text)[-1] == tokenizer.eod
    assert tokenizer.eod not in tokenizer.tokenize(text)
