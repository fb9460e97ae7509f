"""Tokenizers: train a byte-level BPE on a corpus, read a Hugging Face `tokenizer.json`, and present it the
way megatron-core's datasets want one (`.eod`, `.vocab_size`, `.unique_identifiers`)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from trainer.config import ModelConfig, TrainConfig
from trainer.data import DataError

EOD_TOKEN = "<|endoftext|>"
# End-of-document tokens of common tokenizers (GPT-2/NeoX, Llama 3, Llama 2/Mistral, Gemma), in that order.
EOD_CANDIDATES = (EOD_TOKEN, "<|end_of_text|>", "</s>", "<eos>")
# Beginning-of-text tokens a tokenizer may have (Llama 3's first); the project's BPE has none.
BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>")
# 256 byte symbols plus the end-of-document token.
MIN_VOCAB_SIZE = 257


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE (GPT-2 style: every byte is a symbol, so any text round-trips) with EOD_TOKEN as id 0."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def read_tokenizer(path: str | Path) -> Tokenizer:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"tokenizer {str(path)!r} does not exist (give a Hugging Face tokenizer.json)")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:
        raise DataError(
            f"tokenizer {str(path)!r} is not a valid Hugging Face tokenizer.json: {error}"
        ) from None


def encode_documents(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, with no special tokens added, and with special-token text inside a document (say
    a literal "<|endoftext|>") encoded as plain text, so that only the EOD that prepare appends ends a document.

    Encoding special-token text literally is about 3x slower, so only the rare texts that need it pay for it."""
    ids = [encoding.ids for encoding in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    special = {token for token, added in tokenizer.get_added_tokens_decoder().items() if added.special}
    redo = [index for index, document in enumerate(ids) if special and not special.isdisjoint(document)]
    if redo:
        literal = Tokenizer.from_str(tokenizer.to_str())
        literal.encode_special_tokens = True
        for index, encoding in zip(
            redo, literal.encode_batch_fast([texts[i] for i in redo], add_special_tokens=False), strict=True
        ):
            ids[index] = encoding.ids
    return ids


def encode_prompt(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of a prompt to continue: special-token text read as those tokens (a rendered chat's <|eot_id|> is
    one token, as training's chat data has it: trainer/data/chat.py encode_conversation), then the tokenizer's
    post-processor's tokens around it (Llama 3's puts <|begin_of_text|> first), as transformers' `tokenizer(text)`
    and vLLM's /v1/completions give it (vllm entrypoints/openai/protocol.py CompletionRequest.add_special_tokens
    defaults to True). One exception: a text that already begins with what the post-processor puts first (a chat
    rendered with its template's bos_token) does not get it twice; vLLM would double it (vllm-project/vllm#16976,
    closed unmerged), transformers' apply_chat_template avoids it by adding nothing (add_special_tokens=False)."""
    own = tokenizer.encode(text, add_special_tokens=False).ids
    template = document_template(tokenizer, "the prompt's tokenizer")
    prefix = [] if own[: len(template.prefix)] == list(template.prefix) else list(template.prefix)
    return [*prefix, *own, *template.suffix]


def bos_token(tokenizer: Tokenizer) -> str | None:
    """The tokenizer's beginning-of-text token, the first of BOS_CANDIDATES it has; None when it has none."""
    vocabulary = tokenizer.get_vocab(with_added_tokens=True)
    return next((token for token in BOS_CANDIDATES if token in vocabulary), None)


@dataclass(frozen=True)
class DocumentTemplate:
    """The special tokens the tokenizer's post-processor puts around a text (its `single` template: Llama 3's
    tokenizer.json adds <|begin_of_text|> before it); `prepare` frames every document with them."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    prefix_tokens: tuple[str, ...]
    suffix_tokens: tuple[str, ...]

    def ending(self, eod: int) -> tuple[int, ...]:
        """What follows each document's text: the template's suffix, then EOD unless the suffix ends with it."""
        return self.suffix + ((eod,) if self.suffix[-1:] != (eod,) else ())

    def describe(self, eod: int) -> str:
        """Each document's tokens in words, for prepare's summary."""
        after = [*self.suffix_tokens, *(["EOD"] if self.ending(eod) != self.suffix else [])]
        added = " and ".join(
            f"{' '.join(tokens)} {side} the text"
            for tokens, side in ((self.prefix_tokens, "before"), (self.suffix_tokens, "after"))
            if tokens
        )
        why = f"the tokenizer's post-processor adds {added}" if added else "its post-processor adds nothing"
        return f"each document is {' '.join([*self.prefix_tokens, 'TEXT', *after])} ({why})"


def document_template(tokenizer: Tokenizer, path: str | Path) -> DocumentTemplate:
    """What `tokenizer.post_process` adds around one sequence: the special tokens before and after the text's own
    (found by the special-tokens mask, so TemplateProcessing, BERT/RoBERTa processors and Sequences of them all
    work the same way; a post-processor that adds nothing, or none at all, gives an empty template)."""
    text = tokenizer.encode("a", add_special_tokens=False)
    if not text.ids:
        raise DataError(
            f"tokenizer {str(path)!r} encodes the text 'a' to no tokens; it cannot encode documents"
        )
    processed = tokenizer.post_process(text, add_special_tokens=True)
    mask = processed.special_tokens_mask
    first = mask.index(0)
    last = len(mask) - 1 - mask[::-1].index(0)
    ids, tokens = processed.ids, processed.tokens
    return DocumentTemplate(
        prefix=tuple(ids[:first]),
        suffix=tuple(ids[last + 1 :]),
        prefix_tokens=tuple(tokens[:first]),
        suffix_tokens=tuple(tokens[last + 1 :]),
    )


def eod_id(tokenizer: Tokenizer, path: str | Path) -> int:
    """The id of the tokenizer's end-of-document token, the first of EOD_CANDIDATES it has."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    for token in EOD_CANDIDATES:
        if token in vocab:
            return vocab[token]
    special = sorted(
        added.content for added in tokenizer.get_added_tokens_decoder().values() if added.special
    )
    raise DataError(
        f"tokenizer {str(path)!r} has no end-of-document token: expected one of {', '.join(EOD_CANDIDATES)}; "
        f"its special tokens are: {', '.join(special) or 'none'}"
    )


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class HuggingFaceTokenizer:
    """A `tokenizer.json` as megatron-core's GPT datasets use it: `eod` ends every document, `vocab_size` sizes
    the token dtype, and `unique_identifiers` (with the file's hash) keys the dataset index cache."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._tokenizer = read_tokenizer(path)
        self.eod = eod_id(self._tokenizer, path)
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.sha256 = file_sha256(path)
        self.unique_identifiers = OrderedDict(
            [("class", type(self).__name__), ("sha256", self.sha256), ("vocab_size", self.vocab_size)]
        )

    def tokenize(self, text: str) -> list[int]:
        return encode_documents(self._tokenizer, [text])[0]

    def tokenize_prompt(self, text: str) -> list[int]:
        return encode_prompt(self._tokenizer, text)

    def token_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def detokenize(self, ids: Iterable[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    encode = tokenize
    decode = detokenize


def load_tokenizer(path: str | Path) -> HuggingFaceTokenizer:
    return HuggingFaceTokenizer(path)


def resolved_model(cfg: TrainConfig) -> ModelConfig:
    """The model section with its vocabulary size set: the tokenizer's unless the config gives one."""
    vocab_size = cfg.model.vocab_size or load_tokenizer(cfg.data.tokenizer_path).vocab_size
    return cfg.model.model_copy(update={"vocab_size": vocab_size})


def with_resolved_model(cfg: TrainConfig) -> TrainConfig:
    """cfg with resolved_model's model section: what the model is built from."""
    return cfg.model_copy(update={"model": resolved_model(cfg)})
