"""A Llama-3-style export built here (no hub download is possible): a byte-level BPE with Llama 3's special tokens
and post-processor (<|begin_of_text|> before every text: transformers
src/transformers/models/llama/convert_llama_weights_to_hf.py, Llama3Converter.update_post_processor), Llama 3
Instruct's chat template (tests/data/fixtures/llama3_instruct_tokenizer_config.json, copied from
meta-llama/Meta-Llama-3-8B-Instruct), <|eot_id|> as end of turn distinct from <|end_of_text|> (generation_config
lists both, as Llama 3 Instruct's lists 128001 and 128009), and a tiny LlamaForCausalLM with seeded random weights:
a real transformers model whose next-token distribution is wide, which is what sampling tests need."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

FIXTURES = Path(__file__).resolve().parent.parent / "data" / "fixtures"
LLAMA3_CONFIG = FIXTURES / "llama3_instruct_tokenizer_config.json"
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CONTEXT = 64
TEXTS = [
    "the tiger plays the piano and the cat sings a song about the moon. " * 8,
    "answer in one line. " * 8,
]


def llama3_style_tokenizer(texts: list[str], vocab_size: int, special: list[str] | None = None) -> Tokenizer:
    """A byte-level BPE with Llama 3's special tokens and its post-processor (ByteLevel, then a template that
    puts <|begin_of_text|> before the text)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=special or SPECIAL[:2],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    bos = tokenizer.token_to_id("<|begin_of_text|>")
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                pair="<|begin_of_text|>:0 $A:0 <|begin_of_text|>:1 $B:1",
                special_tokens=[("<|begin_of_text|>", bos)],
            ),
        ]
    )
    return tokenizer


def write_llama3_export(directory: Path) -> Path:
    """The export directory (named by `directory`'s last part): config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json with the chat template, generation_config.json."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = llama3_style_tokenizer(TEXTS, 320, SPECIAL)
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL}
    template = json.loads(LLAMA3_CONFIG.read_text())["chat_template"]
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        model_max_length=CONTEXT,
    )
    wrapped.chat_template = template
    wrapped.save_pretrained(directory)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        bos_token_id=ids["<|begin_of_text|>"],
        eos_token_id=ids["<|end_of_text|>"],
        initializer_range=0.5,  # wide logits: a next-token distribution far from uniform and far from one-hot
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    generation = {
        "bos_token_id": ids["<|begin_of_text|>"],
        "eos_token_id": [ids["<|end_of_text|>"], ids["<|eot_id|>"]],
        "max_length": CONTEXT,
    }
    (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory
