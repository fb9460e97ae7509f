"""GPT training samples from prepared datasets: megatron-core's GPTDataset under BlendedMegatronDatasetBuilder
(blend weights, train/valid/test split, sample order fixed by the seed), plus the checks of a config's data
before any process starts (`data_problems`: datasets and tokenizer present, made for each other, fitting the
model's vocabulary)."""

from __future__ import annotations

import logging
import re
import warnings
from typing import TYPE_CHECKING

import numpy as np

from trainer.data import DataError
from trainer.data.indexed import index_problem
from trainer.data.manifest import DatasetFiles, read_manifest
from trainer.data.tokenizer import HuggingFaceTokenizer, load_tokenizer

if TYPE_CHECKING:
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from torch.utils.data import Dataset

    from trainer.config import TrainConfig


def check_tokenizer_matches_dataset(prefix: str, tokenizer: HuggingFaceTokenizer) -> None:
    """Raise unless `prefix` is a complete dataset whose token ids `tokenizer` produced.

    With a manifest (datasets from `prepare`): the tokenizer's file hash, vocabulary and EOD must be the recorded
    ones. Without one (datasets from other tools): every token id must be below the vocabulary size (one pass
    over the .bin file)."""
    files = DatasetFiles(prefix)
    missing = [str(path) for path in (files.bin, files.idx) if not path.is_file()]
    if missing:
        raise DataError(
            f"dataset {prefix!r} not found: no {' or '.join(missing)}; "
            f"create it with `python -m trainer prepare INPUT... --output {prefix}`"
        )
    manifest = read_manifest(files)
    if manifest is not None:
        manifest.check_files(files)
    dataset = open_indexed_dataset(prefix)
    if manifest is None:
        max_token_id = _max_token_id(prefix, dataset.index.dtype)
        if max_token_id >= tokenizer.vocab_size:
            raise DataError(
                f"dataset {prefix!r} holds token id {max_token_id}, beyond tokenizer {tokenizer.path!r} "
                f"(vocab {tokenizer.vocab_size}): it was tokenized with another tokenizer"
            )
        return
    recorded = manifest.tokenizer
    if (recorded.sha256, recorded.vocab_size, recorded.eod_id) != (
        tokenizer.sha256,
        tokenizer.vocab_size,
        tokenizer.eod,
    ):
        raise DataError(
            f"dataset {prefix!r} was tokenized with {files.tokenizer} (vocab {recorded.vocab_size}, EOD "
            f"{recorded.eod_id}, sha256 {recorded.sha256[:12]}), but the tokenizer given is "
            f"{tokenizer.path!r} (vocab {tokenizer.vocab_size}, EOD {tokenizer.eod}, sha256 "
            f"{tokenizer.sha256[:12]}); use {files.tokenizer} or re-run prepare with this tokenizer"
        )


def open_indexed_dataset(prefix: str) -> IndexedDataset:
    """megatron-core's reader over PREFIX.bin/.idx, or a DataError naming the damaged file: the whole index is
    checked against the .bin first (trainer/data/indexed.py `index_problem`), where megatron-core would assert,
    fail to map an empty file, or read wrong samples only when training reaches them."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    files = DatasetFiles(prefix)
    redo = f"re-run `python -m trainer prepare ... --output {prefix} --force`"
    bin_bytes = files.bin.stat().st_size
    problem = index_problem(files.idx, bin_bytes)
    if problem == "not a Megatron index (bad header)":
        raise DataError(f"dataset {prefix!r}: {files.idx} is {problem}; {redo}")
    if bin_bytes == 0:
        raise DataError(f"dataset {prefix!r}: {files.bin} is empty; {redo}")
    if problem is not None:
        raise DataError(
            f"dataset {prefix!r}: {files.idx} is damaged or not {files.bin}'s index: {problem}; {redo}"
        )
    return IndexedDataset(prefix)


def _max_token_id(prefix: str, dtype: np.dtype) -> int:
    tokens = np.memmap(prefix + ".bin", dtype=dtype, mode="r")
    chunk = 1 << 26
    return max(
        (int(tokens[start : start + chunk].max()) for start in range(0, tokens.size, chunk)), default=0
    )


class _NoCacheNotice(logging.Filter):
    """Drops megatron's per-split notice that indices are not cached: with cache_dir=None that is the intent."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "path_to_cache is None" not in record.getMessage()


_NO_CACHE_NOTICE = _NoCacheNotice()


def _check_split(split: str) -> None:
    """Megatron's "train,valid,test" weights, e.g. "949,50,1", validated here rather than by its asserts."""
    parts = split.split(",")
    if len(parts) != 3 or not all(re.fullmatch(r"\d+(\.\d*)?", part.strip()) for part in parts):
        raise DataError(
            f"split {split!r}: give three non-negative weights for train,valid,test, e.g. '949,50,1'"
        )
    if float(parts[0]) == 0:
        raise DataError(f"split {split!r}: the train weight must be above 0")


def check_every_split_has_documents(prefixes: list[str], split: str) -> None:
    """megatron-core would loop forever drawing samples from a split that got no documents."""
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )

    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    for prefix in prefixes:
        documents = len(open_indexed_dataset(prefix))
        for name, bounds in zip(("train", "valid", "test"), matrix, strict=True):
            # The same rounding megatron-core uses to cut the document ranges.
            if bounds and round(bounds[1] * documents) == round(bounds[0] * documents):
                raise DataError(
                    f"split {split!r} leaves the {name} split of dataset {prefix!r} ({documents} documents) "
                    f"no document; give that split more weight, weight 0, or prepare more documents"
                )


def build_gpt_datasets(
    *,
    prefixes: list[str],
    weights: list[float] | None,
    split: str,
    seq_length: int,
    seed: int,
    num_samples: tuple[int, int, int],
    tokenizer_path: str,
    cache_dir: str | None,
) -> tuple[Dataset, Dataset | None, Dataset | None]:
    """Train, valid and test datasets of `seq_length`-token samples blended from `prefixes`.

    Each split draws `num_samples[i]` samples (a split whose weight is 0 is None). Blend `weights` (None:
    proportional to dataset sizes) fix each dataset's share; `seed` fixes the document and sample order.
    Samples are dicts of `tokens`, `labels`, `loss_mask`, `position_ids` (plus `dataset_id` when blended):
    documents are packed back to back, EOD-separated, under one causal mask (no position or attention reset,
    EOD kept in the loss), as Llama pretraining does.

    `cache_dir` keeps the sample indices between runs: rank 0 builds them while the other ranks wait on a
    barrier, so torch.distributed must be initialized. None builds them in memory on every rank (same seed,
    same indices), which suits small datasets.
    """
    if not prefixes:
        raise DataError("data prefixes: give at least one prepared dataset prefix")
    if weights is not None:
        if len(weights) != len(prefixes):
            raise DataError(
                f"data weights {weights}: one weight per prefix ({len(prefixes)} prefixes: {prefixes})"
            )
        if any(weight <= 0 for weight in weights):
            raise DataError(f"data weights {weights}: every weight must be above 0")
    _check_split(split)
    if seq_length < 1:
        raise DataError(f"seq_length {seq_length}: must be at least 1")
    if len(num_samples) != 3 or any(count < 0 for count in num_samples):
        raise DataError(f"num_samples {num_samples}: three non-negative counts (train, valid, test)")
    import torch.distributed

    if cache_dir is not None and not torch.distributed.is_initialized():
        raise DataError(
            f"cache_dir {cache_dir!r} needs torch.distributed initialized (rank 0 writes the index cache "
            f"while the others wait); initialize the process group first, or pass cache_dir=None"
        )
    tokenizer = load_tokenizer(tokenizer_path)
    for prefix in prefixes:
        check_tokenizer_matches_dataset(prefix, tokenizer)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    check_every_split_has_documents(prefixes, split)
    for name in ("megatron.core.datasets.gpt_dataset", "megatron.core.datasets.blended_dataset"):
        logging.getLogger(name).addFilter(_NO_CACHE_NOTICE)
    config = GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_length,
        # One prefix needs no blend: its weight would only add a BlendedDataset layer.
        blend=(prefixes, weights if len(prefixes) > 1 else None),
        split=split,
        # megatron-core reads "" as "no cache" (None would put one beside the data, under the prefix).
        path_to_cache=cache_dir or "",
        tokenizer=tokenizer,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
    )
    train, valid, test = BlendedMegatronDatasetBuilder(
        GPTDataset, list(num_samples), lambda: True, config
    ).build()
    return train, valid, test


def data_problems(cfg: TrainConfig) -> list[str]:
    """Prepared datasets and tokenizer: present, made for each other, and fitting the model's vocabulary."""
    try:
        tokenizer = load_tokenizer(cfg.data.tokenizer_path)
    except DataError as error:
        return [f"data.tokenizer_path = {cfg.data.tokenizer_path!r}: {error}"]
    problems = []
    for i, prefix in enumerate(cfg.data.prefixes):
        try:
            check_tokenizer_matches_dataset(prefix, tokenizer)
        except DataError as error:
            problems.append(f"data.prefixes[{i}] = {prefix!r}: {error}")
    if not problems:  # megatron-core would wait forever for samples from a split without documents
        try:
            check_every_split_has_documents(cfg.data.prefixes, cfg.data.split)
        except DataError as error:
            problems.append(f"data.split = {cfg.data.split!r}: {error}")
    if (
        not problems and cfg.data.format == "chat"
    ):  # its loss mask, and conversations that fit a packed sample
        from trainer.data.chat import check_chat_dataset

        try:
            check_chat_dataset(cfg.data.prefixes[0], cfg.data.seq_length)
        except DataError as error:
            problems.append(f"data.prefixes[0] = {cfg.data.prefixes[0]!r}: {error}")
    if cfg.model.vocab_size is not None and cfg.model.vocab_size < tokenizer.vocab_size:
        problems.append(
            f"model.vocab_size = {cfg.model.vocab_size} is below the tokenizer's vocabulary "
            f"({tokenizer.vocab_size}, {cfg.data.tokenizer_path}); raise it or leave it unset to use the tokenizer's"
        )
    return problems
