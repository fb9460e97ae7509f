"""`prepare --format chat`: conversations through a chat template into tokens and a loss mask that keeps only the
assistant's tokens; bad conversations refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers.utils.chat_template_utils import render_jinja_template

from tests.data.conftest import write_jsonl
from trainer.__main__ import main as trainer_main
from trainer.data import DataError
from trainer.data.chat import (
    BUILTIN_TEMPLATE,
    check_chat_dataset,
    load_chat_template,
    prepare_chat,
    read_conversations,
)

FIXTURES = Path(__file__).parent / "fixtures"
# Meta-Llama-3-8B-Instruct's tokenizer_config.json (huggingface.co/meta-llama/Meta-Llama-3-8B-Instruct), its
# chat_template verbatim as vLLM's entrypoints/openai/serving_chat.py logs it ("Using default chat template").
LLAMA3_CONFIG = FIXTURES / "llama3_instruct_tokenizer_config.json"
LLAMA3_SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]

CHAT = [
    {"role": "system", "content": "Answer in one line."},
    {"role": "user", "content": "What does json.dumps do?"},
    {"role": "assistant", "content": "Serialize obj to a JSON formatted str."},
    {"role": "user", "content": "And json.loads?"},
    {"role": "assistant", "content": "Deserialize s to a Python object."},
]


def bpe(path: Path, special: list[str]) -> Tokenizer:
    """A byte-level BPE with the given special tokens, trained on the test conversations' words."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = __import__("tokenizers").decoders.ByteLevel()
    texts = [message["content"] for message in CHAT] * 20
    tokenizer.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=special,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tokenizer.save(str(path))
    return tokenizer


@pytest.fixture
def plain_bpe(tmp_path) -> tuple[str, Tokenizer]:
    path = tmp_path / "bpe" / "tokenizer.json"
    path.parent.mkdir()
    return str(path), bpe(path, ["<|endoftext|>"])


@pytest.fixture
def llama3(tmp_path) -> tuple[str, Tokenizer]:
    """A Llama 3 style tokenizer.json with the Instruct model's tokenizer_config.json beside it (a converted
    checkpoint's layout)."""
    path = tmp_path / "llama3" / "tokenizer.json"
    path.parent.mkdir()
    (path.parent / "tokenizer_config.json").write_text(LLAMA3_CONFIG.read_text())
    return str(path), bpe(path, LLAMA3_SPECIAL)


def trained_text(tokenizer: Tokenizer, prefix: Path) -> tuple[list[str], list[list[int]]]:
    tokens, mask = IndexedDataset(str(prefix)), IndexedDataset(f"{prefix}-mask")
    texts = [
        tokenizer.decode([t for t, m in zip(tokens[i], mask[i], strict=True) if m], skip_special_tokens=False)
        for i in range(len(tokens))
    ]
    return texts, [list(tokens[i]) for i in range(len(tokens))]


def test_the_llama3_template_renders_as_transformers_renders_it(llama3):
    path, tokenizer = llama3
    template = load_chat_template(tokenizer, path, None)
    config = json.loads(LLAMA3_CONFIG.read_text())
    for add_generation_prompt in (False, True):
        rendered, _ = render_jinja_template(
            conversations=[CHAT],
            chat_template=config["chat_template"],
            add_generation_prompt=add_generation_prompt,
            bos_token=config["bos_token"],
            eos_token=config["eos_token"],
        )
        assert template.render(CHAT, add_generation_prompt=add_generation_prompt) == rendered[0]
    assert template.origin.endswith("tokenizer_config.json")


def test_the_llama3_mask_keeps_each_assistant_answer_and_its_eot(llama3, tmp_path):
    path, tokenizer = llama3
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])

    prepare_chat([data], str(tmp_path / "out" / "c"), tokenizer=path)

    texts, ids = trained_text(tokenizer, tmp_path / "out" / "c")
    assert texts == [
        "Serialize obj to a JSON formatted str.<|eot_id|>Deserialize s to a Python object.<|eot_id|>"
    ]
    assert ids[0][0] == tokenizer.token_to_id("<|begin_of_text|>")  # the template's BOS, not a second one
    assert ids[0].count(tokenizer.token_to_id("<|begin_of_text|>")) == 1


def test_the_builtin_template_trains_answers_through_their_end_of_document_not_the_newline_after(
    plain_bpe, tmp_path
):
    path, tokenizer = plain_bpe
    data = write_jsonl(
        tmp_path / "pairs.jsonl", [{"prompt": "What does json.dumps do?", "completion": "Serialize."}]
    )

    result = prepare_chat([data], str(tmp_path / "p"), tokenizer=path)

    texts, ids = trained_text(tokenizer, tmp_path / "p")
    # The newline after <|endoftext|> starts the next turn: a model stopping at the token never predicts it
    # (Megatron-Bridge's mask, transformers' {% generation %} block, ends at the end-of-turn token).
    assert texts == ["Serialize.<|endoftext|>"]
    assert tokenizer.decode(ids[0], skip_special_tokens=False) == (
        "<|user|>\nWhat does json.dumps do?\n<|assistant|>\nSerialize.<|endoftext|>\n"
    )
    assert result.manifest.template_origin.startswith("the built-in template")
    assert load_chat_template(tokenizer, path, None).source == BUILTIN_TEMPLATE


def test_a_second_run_with_the_same_inputs_is_cached_and_other_inputs_are_refused(plain_bpe, tmp_path):
    path, _ = plain_bpe
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    first = prepare_chat([data], str(tmp_path / "c"), tokenizer=path)
    again = prepare_chat([data], str(tmp_path / "c"), tokenizer=path)
    assert not first.cached and again.cached and again.manifest == first.manifest

    with pytest.raises(DataError, match=r"other inputs.*--force"):
        prepare_chat([data], str(tmp_path / "c"), tokenizer=path, seq_length=64)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"messages": [', "chat.jsonl:2: not valid JSON"),
        (
            '{"text": "hi"}',
            r"chat.jsonl:2: no 'messages' and no 'prompt'/'completion' \(keys present: 'text'\)",
        ),
        ('{"messages": []}', "chat.jsonl:2: 'messages' must be a non-empty list"),
        ('{"messages": [{"role": "user"}]}', r"messages\[0\] must be an object with 'role' and 'content'"),
        (
            '{"messages": [{"role": "robot", "content": "x"}]}',
            r"messages\[0\] has role 'robot', which the chat template does not know; valid: system, user, assistant",
        ),
        ('{"messages": [{"role": "user", "content": 3}]}', r"messages\[0\].content must be a string"),
        ('{"messages": [{"role": "user", "content": "x"}]}', "no assistant message"),
        ('{"prompt": "x"}', "'completion' must be a string"),
    ],
)
def test_bad_conversations_are_refused_with_their_line_before_anything_is_written(
    plain_bpe, tmp_path, line, message
):
    path, _ = plain_bpe
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": CHAT}) + "\n" + line + "\n")

    with pytest.raises(DataError, match=message):
        prepare_chat([data], str(tmp_path / "out" / "c"), tokenizer=path)
    assert not (tmp_path / "out").exists()


def test_a_conversation_longer_than_the_sequence_is_refused_without_truncate_and_cut_with_it(
    plain_bpe, tmp_path
):
    path, tokenizer = plain_bpe
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    length = len(tokenizer.encode(load_chat_template(tokenizer, path, None).render(CHAT)).ids)

    with pytest.raises(
        DataError, match=rf"chat.jsonl:1: the conversation is {length} tokens, longer than --seq-length 20"
    ):
        prepare_chat([data], str(tmp_path / "c"), tokenizer=path, seq_length=20)
    assert not list(tmp_path.glob("c.*")) and not list(tmp_path.glob("c-mask*"))

    result = prepare_chat([data], str(tmp_path / "c"), tokenizer=path, seq_length=length - 5, truncate=True)
    assert result.manifest.longest == length - 4 and result.manifest.truncated == 1


def test_chat_data_needs_the_models_tokenizer(tmp_path):
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    with pytest.raises(DataError, match="--format chat needs --tokenizer"):
        prepare_chat([data], str(tmp_path / "c"), tokenizer=None)


def test_training_refuses_a_sequence_shorter_than_the_longest_conversation(plain_bpe, tmp_path):
    path, _ = plain_bpe
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    longest = prepare_chat([data], str(tmp_path / "c"), tokenizer=path).manifest.longest

    assert check_chat_dataset(str(tmp_path / "c"), longest - 1).longest == longest
    with pytest.raises(DataError, match=f"data.seq_length = 8: .* needs data.seq_length >= {longest - 1}"):
        check_chat_dataset(str(tmp_path / "c"), 8)


def test_prepare_detects_chat_jsonl_and_reports_bad_lines_with_status_2(plain_bpe, tmp_path, capsys):
    path, _ = plain_bpe
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])

    assert trainer_main(["prepare", str(data), "--tokenizer", path, "--output", str(tmp_path / "c")]) == 0
    assert len(read_conversations([data])) == 1 and (tmp_path / "c-mask.bin").is_file()

    data.write_text('{"messages": [{"role": "robot", "content": "x"}]}\n')
    assert (
        trainer_main(
            ["prepare", "--format", "chat", str(data), "--tokenizer", path, "--output", str(tmp_path / "d")]
        )
        == 2
    )
    assert "role 'robot'" in capsys.readouterr().err


def test_a_named_chat_template_must_exist_and_hold_a_template(plain_bpe, tmp_path):
    path, _ = plain_bpe
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    with pytest.raises(DataError, match=r"--chat-template '.*none\.json' does not exist"):
        prepare_chat([data], str(tmp_path / "c"), tokenizer=path, chat_template=str(tmp_path / "none.json"))
    (tmp_path / "config.json").write_text('{"bos_token": "<s>"}')
    with pytest.raises(DataError, match="has no 'chat_template' string"):
        prepare_chat([data], str(tmp_path / "c"), tokenizer=path, chat_template=str(tmp_path / "config.json"))


def test_a_jinja_template_gets_the_tokenizers_bos_and_every_special_token_and_strftime_now(llama3, tmp_path):
    """transformers passes every template the tokenizer's named special tokens and a strftime_now global
    (tokenization_utils_base.py apply_chat_template, utils/chat_template_utils.py): a .jinja file is rendered
    with the same, not with an empty bos_token."""
    path, tokenizer = llama3
    config = json.loads(LLAMA3_CONFIG.read_text())
    jinja = tmp_path / "llama3.jinja"
    jinja.write_text(config["chat_template"] + "{{ strftime_now('%Y') }}|{{ pad_token }}")
    template = load_chat_template(tokenizer, path, str(jinja))
    rendered, _ = render_jinja_template(
        conversations=[CHAT],
        chat_template=jinja.read_text(),
        bos_token=config["bos_token"],
        eos_token=config["eos_token"],
    )
    assert template.render(CHAT) == rendered[0]
    assert rendered[0].startswith("<|begin_of_text|>") and rendered[0].endswith("|")  # its config has no pad


def test_a_jinja_template_without_a_tokenizer_config_reads_the_tokenizers_own_bos(tmp_path):
    path = tmp_path / "bare" / "tokenizer.json"
    path.parent.mkdir()
    tokenizer = bpe(path, LLAMA3_SPECIAL)
    jinja = tmp_path / "t.jinja"
    jinja.write_text("{{ bos_token }}{% for m in messages %}{{ m['content'] }}<|eot_id|>{% endfor %}")
    template = load_chat_template(tokenizer, str(path), str(jinja))
    assert template.render(CHAT[:1]) == "<|begin_of_text|>Answer in one line.<|eot_id|>"
    assert template.eos_token == "<|end_of_text|>"  # the tokenizer's end-of-text: no config says otherwise


def test_the_end_of_turn_token_is_the_first_special_token_after_an_assistant_turn(llama3, plain_bpe):
    """Llama 3 Instruct ends a turn with <|eot_id|> (its generation_config.json lists 128001 and 128009); the
    built-in template with the end-of-text token."""
    for (path, tokenizer), expected in ((llama3, "<|eot_id|>"), (plain_bpe, "<|endoftext|>")):
        assert load_chat_template(tokenizer, path, None).end_of_turn() == expected


def test_data_prepared_under_the_older_mask_rule_is_prepared_again_without_force(plain_bpe, tmp_path):
    """Rule 1 trained the newline after the end-of-turn token: the same inputs are prepared again under rule 2,
    not served from the cache, and nothing needs --force."""
    path, _ = plain_bpe
    data = write_jsonl(
        tmp_path / "pairs.jsonl", [{"prompt": "What does json.dumps do?", "completion": "Ok."}]
    )
    prefix = tmp_path / "p"
    prepare_chat([data], str(prefix), tokenizer=path)
    manifest = json.loads((tmp_path / "p.chat.json").read_text())
    manifest["request"].pop("mask_rule")  # as rule 1 wrote it
    (tmp_path / "p.chat.json").write_text(json.dumps(manifest))
    result = prepare_chat([data], str(prefix), tokenizer=path)
    assert not result.cached and result.manifest.request.mask_rule == 2
    assert prepare_chat([data], str(prefix), tokenizer=path).cached
