"""Exports for inference: fp16 refused when a weight overflows it; the export (weights, tokenizer with the chat
template, generation_config.json, model card) loads in transformers and renders a conversation; and end to end,
a trained checkpoint's record becomes the export's model card."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

from trainer.checkpoint.version import RECORD, add_evaluation, read_record
from trainer.data.chat_template import CHAT_TEMPLATE
from trainer.data.tokenizer import EOD_TOKEN, train_bpe
from trainer.interop import export, hf
from trainer.interop.hf import HuggingFaceCheckpoint, HuggingFaceError

VOCAB = 320
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> HuggingFaceCheckpoint:
    """A random transformers Llama whose layer-1 down projection holds one weight beyond float16's 65504."""
    directory = tmp_path_factory.mktemp("hf") / "llama"
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE, tie_word_embeddings=False))
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[3, 5] = -70000.0
    model.save_pretrained(directory)
    return HuggingFaceCheckpoint(directory)


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    """The project's BPE (trainer/data/tokenizer.py), trained on a few sentences."""
    path = tmp_path_factory.mktemp("tokenizer") / "corpus.tokenizer.json"
    text = ["the user asks and the assistant answers the question politely. " * 20]
    train_bpe(text, vocab_size=300).save(str(path))
    return path


def full_weights(source: HuggingFaceCheckpoint) -> dict[str, torch.Tensor]:
    read = source.full_weights()
    return {name: read(name) for name in hf._rules(source.model)}


def export_to(directory: Path, source: HuggingFaceCheckpoint, dtype: torch.dtype) -> dict:
    directory.mkdir()
    config = hf.to_hf_config(source.model, None, dtype, 64)
    hf.write(directory, source.model, full_weights(source), config, dtype, hf.parse_size("5GB"))
    return config


def test_fp16_export_refuses_an_overflowing_weight_naming_it_and_its_max(llama, tmp_path):
    with pytest.raises(HuggingFaceError) as refused:
        export_to(tmp_path / "fp16", llama, torch.float16)
    message = str(refused.value)
    assert "--dtype float16: model.layers.1.mlp.down_proj.weight (max |w| = 70000) exceed" in message
    assert "largest finite value 65504" in message and "Export in bfloat16 or float32" in message
    assert list((tmp_path / "fp16").iterdir()) == []  # nothing written
    export_to(tmp_path / "bf16", llama, torch.bfloat16)  # bf16 has fp32's range: accepted
    assert (tmp_path / "bf16" / "model.safetensors").is_file()


def test_an_export_loads_in_transformers_and_renders_the_chat_template(llama, tokenizer_file, tmp_path):
    out = tmp_path / "export"
    config = export_to(out, llama, torch.float32)
    tokens = export.write_tokenizer(out, tokenizer_file, max_length=64)
    config.update(eos_token_id=tokens.eos_id)
    (out / "config.json").write_text(json.dumps(config))
    (out / export.GENERATION_CONFIG).write_text(json.dumps(export.generation_config(tokens)))
    (out / export.MODEL_CARD).write_text(
        export.model_card("tiny", "float32", None, [], has_chat_template=True)
    )

    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == CHAT_TEMPLATE and tokenizer.eos_token == EOD_TOKEN
    assert GenerationConfig.from_pretrained(out).eos_token_id == tokens.eos_id == 0
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello.<|endoftext|>\n<|user|>\nBye\n<|assistant|>\n"
    )
    ids = tokenizer.apply_chat_template(
        chat, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    assert ids["input_ids"][0].tolist() == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids["input_ids"][0].tolist().count(0) == 1  # <|endoftext|> is one token, not its characters
    with torch.no_grad():
        logits = model(ids["input_ids"]).logits
    assert logits.shape == (1, ids["input_ids"].shape[1], VOCAB)
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\n") and "No model version record" in card


def trainer(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainer", *args]


@pytest.mark.slow
def test_a_trained_checkpoints_record_becomes_its_exports_model_card(single, launcher, capsys):
    """The tiny run's checkpoints each carry a record (the checkpointer's hook); one evaluation is added; the
    bf16 export carries both in its model card and loads in transformers with the chat template."""
    from trainer.__main__ import main as trainer_main

    checkpoints = launcher.base / "exported-run" / "checkpoints"  # a copy: the session's run stays as trained
    shutil.copytree(single.run_dir / "checkpoints", checkpoints)
    newest = checkpoints / (checkpoints / "latest").read_text().strip()
    record = read_record(newest)
    assert record.step == 20 and record.run == "tiny" and record.parent is None
    assert all((c / RECORD).is_file() for c in checkpoints.glob("iter_*"))
    add_evaluation(newest, "heldout", {"perplexity": 42.0})
    assert trainer_main(["models", "list", "--dir", str(checkpoints), "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [v["step"] for v in listed] == sorted(int(c.name[5:]) for c in checkpoints.glob("iter_*"))

    out = launcher.base / "exported-bf16"
    launcher.run(
        "export-bf16", trainer("convert", "--to-hf", str(checkpoints), "--out", str(out), "--dtype", "bf16")
    )
    card = (out / "README.md").read_text()
    assert f"| version | `{record.version}` |" in card and f"`{record.lineage_sha256}`" in card
    assert "| heldout | perplexity | 42.0 |" in card
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    chat = [{"role": "user", "content": "def f():"}]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert tokenizer.decode(ids) == "<|user|>\ndef f():\n<|assistant|>\n"
    assert (
        model.config.eos_token_id
        == tokenizer.eos_token_id
        == GenerationConfig.from_pretrained(out).eos_token_id
    )
    generated = model.generate(torch.tensor([ids]), max_new_tokens=3, do_sample=False)
    assert generated.shape[1] <= len(ids) + 3
    assert GenerationConfig.from_pretrained(out).max_length == record.config["data"]["seq_length"]


def test_the_model_cards_snippet_runs_under_transformers_5(llama, tokenizer_file, tmp_path):
    """transformers 5's apply_chat_template returns a BatchEncoding (return_dict defaults to True): the card's
    snippet, run as written on a real export, generates."""
    out = tmp_path / "export"
    config = export_to(out, llama, torch.float32)
    tokens = export.write_tokenizer(out, tokenizer_file, max_length=64)
    (out / "config.json").write_text(json.dumps(config | {"eos_token_id": tokens.eos_id}))
    (out / export.GENERATION_CONFIG).write_text(json.dumps(export.generation_config(tokens)))
    for has_chat_template in (True, False):
        card = export.model_card("tiny", "float32", None, [], has_chat_template=has_chat_template)
        snippet = card.split("```python\n")[1].split("```")[0].replace("PATH", str(out))
        snippet = snippet.replace("max_new_tokens=32", "max_new_tokens=3")
        exec(compile(snippet, "model card", "exec"), {})  # the card's own code, on our export


def test_an_export_carries_the_template_fine_tuning_used_and_stops_at_its_end_of_turn(tmp_path):
    """A run fine-tuned with a .jinja template (the Llama 3 path: --chat-template, no tokenizer_config.json beside
    the tokenizer) exports that template, not the built-in one, and generation_config.json lists the end-of-turn
    token beside the end-of-text one, as Llama 3 Instruct's lists 128001 and 128009."""
    from tests.data.conftest import write_jsonl
    from tests.data.test_chat import CHAT, LLAMA3_CONFIG, LLAMA3_SPECIAL, bpe
    from trainer.data.chat import prepare_chat, trained_template

    tokenizer_path = tmp_path / "tok" / "tokenizer.json"
    tokenizer_path.parent.mkdir()
    tokenizer = bpe(tokenizer_path, LLAMA3_SPECIAL)
    jinja = tmp_path / "llama3.jinja"
    jinja.write_text(json.loads(LLAMA3_CONFIG.read_text())["chat_template"])
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    prefix = str(tmp_path / "data" / "chat")
    prepare_chat([data], prefix, tokenizer=str(tokenizer_path), chat_template=str(jinja))

    template = trained_template([prefix], tokenizer_path)
    assert template is not None and template.source == jinja.read_text()
    out = tmp_path / "export"
    out.mkdir()
    tokens = export.write_tokenizer(out, tokenizer_path, 64, template)
    (out / export.GENERATION_CONFIG).write_text(json.dumps(export.generation_config(tokens)))

    loaded = AutoTokenizer.from_pretrained(out)
    assert loaded.chat_template == jinja.read_text() != CHAT_TEMPLATE
    assert loaded.apply_chat_template(CHAT, tokenize=False) == template.render(CHAT)
    eot, eod = tokenizer.token_to_id("<|eot_id|>"), tokenizer.token_to_id("<|end_of_text|>")
    assert GenerationConfig.from_pretrained(out).eos_token_id == [eod, eot]
    assert trained_template([str(tmp_path / "not-chat")], tokenizer_path) is None
