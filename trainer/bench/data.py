"""Data preparation: `prepare` (trainer/data/prepare.py) against the straightforward way to do the same job, a
single-process loop of Hugging Face tokenizer `encode` calls into megatron-core's IndexedDatasetBuilder. Both use
the same tokenizer and inputs and must write byte-identical .bin and .idx files; tokens/s counts the whole job
(reading, checking, encoding, writing), with the baseline's megatron-core import paid beforehand (prepare needs
none) and the inputs in the page cache. Beside it, the tokenizer-bound limit: the tokenizer alone on one thread,
in tokens per CPU-second, against prepare's tokens per worker CPU-second (CPU time, so other jobs' load on the
machine does not count)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from trainer.data.prepare import default_workers, prepare_dataset
from trainer.data.sources import find_input_files, read_documents, split_into_pieces, stdlib_sources
from trainer.data.tokenizer import eod_id, read_tokenizer


@contextlib.contextmanager
def _one_tokenizer_thread() -> Iterator[None]:
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


def tokenizer_tokens_per_cpu_second(
    paths: Sequence[Path], tokenizer_path: str, text_key: str = "text"
) -> float:
    """The tokenizer alone, on one thread: `encode_batch_fast` over every document (read beforehand), tokens
    per CPU-second. prepare's workers do this and also read, parse and frame the documents: their ceiling."""
    tokenizer = read_tokenizer(tokenizer_path)
    texts = [text for piece in split_into_pieces(paths) for text in read_documents(piece, text_key) if text]
    with _one_tokenizer_thread():
        started = time.process_time()
        encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        seconds = time.process_time() - started
    return sum(len(encoding.ids) for encoding in encodings) / seconds


def baseline_prepare(paths: Sequence[Path], tokenizer_path: str, prefix: Path) -> int:
    """One process, one document at a time: read the file, encode it, append EOD, add it to the builder (each
    distinct non-empty document once, as prepare keeps them)."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder  # slow import: only here

    tokenizer = Tokenizer.from_file(tokenizer_path)
    tokenizer.encode_special_tokens = (
        True  # special-token text inside a document is plain text, as in prepare
    )
    eod = eod_id(tokenizer, tokenizer_path)
    dtype = DType.optimal_dtype(tokenizer.get_vocab_size(with_added_tokens=True))
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    tokens = 0
    seen: set[str] = set()
    for path in paths:
        text = Path(path).read_bytes().decode("utf-8")
        if not text or text in seen:  # prepare leaves out empty documents and exact repeats
            continue
        seen.add(text)
        ids = [*tokenizer.encode(text).ids, eod]  # with what the post-processor adds (a BOS), as prepare
        builder.add_document(np.array(ids, dtype=dtype), [len(ids)])
        tokens += len(ids)
    builder.finalize(f"{prefix}.idx")
    return tokens


def bench_data(
    out: Path,
    tokenizer_path: str,
    inputs: Sequence[str] = (),
    *,
    stdlib: bool = False,
    globs: Sequence[str] = ("*.py",),
    workers: int | None = None,
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    paths = list(dict.fromkeys([*find_input_files(inputs, globs), *(stdlib_sources() if stdlib else [])]))
    workers = workers or default_workers()
    # The baseline's megatron-core import, and reading the files from disk the first time, count for neither.
    from megatron.core.datasets import indexed_dataset  # noqa: F401

    for path in paths:
        path.read_bytes()
    started = time.perf_counter()
    ours = prepare_dataset(
        inputs,
        str(out / "ours"),
        stdlib=stdlib,
        tokenizer=tokenizer_path,
        globs=globs,
        workers=workers,
        force=True,
    )
    ours_seconds = time.perf_counter() - started
    started = time.perf_counter()
    tokens = baseline_prepare(paths, tokenizer_path, out / "baseline")
    baseline_seconds = time.perf_counter() - started
    limit = tokenizer_tokens_per_cpu_second(paths, tokenizer_path)
    identical = all(
        (out / f"ours{suffix}").read_bytes() == (out / f"baseline{suffix}").read_bytes()
        for suffix in (".bin", ".idx")
    )
    return {
        "documents": ours.manifest.documents,
        "tokens": ours.manifest.tokens,
        "workers": workers,
        "ours_seconds": ours_seconds,
        "baseline_seconds": baseline_seconds,
        "ours_tokens_per_s": ours.manifest.tokens / ours_seconds,
        "baseline_tokens_per_s": tokens / baseline_seconds,
        "ours_tokens_per_worker_cpu_s": ours.manifest.tokens / ours.timing.worker_cpu_seconds,
        "tokenizer_tokens_per_cpu_s": limit,
        "identical_output": identical,
    }
