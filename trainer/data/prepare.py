"""`python -m trainer prepare`: tokenize text files, directories and JSONL into a Megatron indexed dataset.

One document per text file or JSONL line: the special tokens the tokenizer's post-processor puts around a text
(Llama 3's BOS), then the text's tokens, then the end-of-document token. Writes PREFIX.bin and PREFIX.idx
(megatron's indexed dataset format, trainer/data/indexed.py), PREFIX.tokenizer.json (the tokenizer used: the one
given, or a byte-level BPE trained on the inputs) and PREFIX.manifest.json (what it was made from; written last,
it marks a complete dataset, and re-running with the same inputs finds it and does nothing). Neither torch nor
megatron-core is imported. Chat data (`--format chat`) goes through trainer/data/chat.py instead.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import multiprocessing
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)
from tokenizers import Tokenizer

from trainer.data import DataError
from trainer.data.chat import chat_arguments, chat_format, chat_main
from trainer.data.indexed import IndexedDatasetWriter, token_dtype
from trainer.data.manifest import (
    DatasetFiles,
    InputFile,
    Manifest,
    Request,
    TokenizerRecord,
    publish_dataset,
    read_manifest,
    written_files,
)
from trainer.data.sources import (
    DEFAULT_GLOBS,
    Piece,
    find_input_files,
    read_records,
    split_into_pieces,
    stdlib_sources,
)
from trainer.data.tokenizer import (
    MIN_VOCAB_SIZE,
    DocumentTemplate,
    document_template,
    encode_documents,
    eod_id,
    file_sha256,
    read_tokenizer,
    train_bpe,
)
from trainer.data.validate import (
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_REJECT_RATE,
    Validation,
    ValidationLimits,
    Verdict,
    check_limits,
    validate_pieces,
    write_digests,
)

# FACTS.md: on the stdlib corpus a 2-core, 4-minute run learns most with a BPE of 2048-8192.
DEFAULT_VOCAB_SIZE = 8192


def default_workers() -> int:
    return len(os.sched_getaffinity(0))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs",
        nargs="*",
        metavar="INPUT",
        help="text files, .jsonl files, or directories (searched by --glob)",
    )
    parser.add_argument(
        "--stdlib",
        action="store_true",
        help="add the Python standard library's .py sources (the local corpus)",
    )
    parser.add_argument(
        "--output",
        required=True,
        metavar="PREFIX",
        help="writes PREFIX.bin, PREFIX.idx, PREFIX.tokenizer.json and PREFIX.manifest.json",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="TOKENIZER_JSON",
        help="a Hugging Face tokenizer.json to use (default: train a byte-level BPE on the inputs)",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        help=f"vocabulary of the BPE trained when no --tokenizer is given (default {DEFAULT_VOCAB_SIZE})",
    )
    parser.add_argument("--text-key", default="text", help="the JSONL field holding the text (default: text)")
    parser.add_argument(
        "--glob",
        action="append",
        dest="globs",
        metavar="PATTERN",
        help=f"file pattern for input directories, repeatable (default: {' '.join(DEFAULT_GLOBS)})",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=default_workers(),
        help="encoding processes (default: the cores this process may use)",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if PREFIX already holds a dataset")
    parser.add_argument(
        "--max-reject-rate",
        type=float,
        default=DEFAULT_MAX_REJECT_RATE,
        help="refuse the corpus when more than this share of its records is rejected: not UTF-8, malformed or a "
        f"length outlier; empty documents and exact repeats are left out and counted, never refused "
        f"(default {DEFAULT_MAX_REJECT_RATE})",
    )
    parser.add_argument(
        "--min-chars",
        type=int,
        default=1,
        help="reject documents shorter than this (default 1: only empty ones)",
    )
    parser.add_argument(
        "--max-chars",
        type=int,
        default=DEFAULT_MAX_CHARS,
        help=f"reject documents longer than this many characters (default {DEFAULT_MAX_CHARS:,})",
    )
    chat_arguments(parser)


def main(args: argparse.Namespace) -> int:
    console = Console(stderr=True, highlight=False)
    if chat_format(args):
        return chat_main(args, console)
    try:
        result = prepare_dataset(
            args.inputs,
            args.output,
            stdlib=args.stdlib,
            tokenizer=args.tokenizer,
            vocab_size=args.vocab_size,
            text_key=args.text_key,
            globs=args.globs or DEFAULT_GLOBS,
            workers=args.workers,
            force=args.force,
            console=console,
            limits=check_limits(args.min_chars, args.max_chars, args.max_reject_rate),
        )
    except DataError as error:
        console.print(f"[bold red]prepare:[/] {escape(str(error))}", soft_wrap=True)
        return 2
    console.print(escape(result.summary()), soft_wrap=True)
    return 0


@dataclass(frozen=True)
class EncodeTiming:
    """The tokenizing phase: its wall time, and the CPU time its workers spent reading, parsing and encoding
    (tokens per worker CPU-second is what to hold against the tokenizer's own single-core speed)."""

    seconds: float
    worker_cpu_seconds: float


@dataclass(frozen=True)
class PrepareResult:
    files: DatasetFiles
    manifest: Manifest
    cached: bool
    seconds: float
    timing: EncodeTiming
    template: DocumentTemplate | None = None  # None when cached

    def summary(self) -> str:
        m = self.manifest
        if self.cached:
            return (
                f"{self.files.prefix}: cached ({m.documents:,} documents, {m.tokens:,} tokens, tokenizer "
                f"{self.files.tokenizer}); inputs unchanged since it was prepared, --force rebuilds it"
            )
        assert self.template is not None  # only a cached result has none, and it returned above
        rate = m.tokens / max(self.timing.seconds, 1e-9)
        per_core = m.tokens / max(self.timing.worker_cpu_seconds, 1e-9)
        return (
            f"{self.files.prefix}: {m.documents:,} documents, {m.tokens:,} tokens ({m.dtype}, vocab "
            f"{m.tokenizer.vocab_size:,}) in {self.seconds:.1f} s, encoding at {rate:,.0f} tokens/s "
            f"({per_core:,.0f} per worker CPU-second); "
            f"{self.files.bin.name} {m.bin_bytes / 1e6:.1f} MB + {self.files.idx.name} {m.idx_bytes / 1e6:.2f} MB, "
            f"tokenizer {self.files.tokenizer}; {self.template.describe(m.tokenizer.eod_id)}"
        )


def prepare_dataset(
    inputs: Sequence[str],
    output: str,
    *,
    stdlib: bool = False,
    tokenizer: str | None = None,
    vocab_size: int | None = None,
    text_key: str = "text",
    globs: Sequence[str] = DEFAULT_GLOBS,
    workers: int = 1,
    force: bool = False,
    console: Console | None = None,
    limits: ValidationLimits | None = None,
) -> PrepareResult:
    """Everything `prepare` does; every check on the arguments runs before any file is read or written."""
    started = time.perf_counter()
    console = console or Console(stderr=True, quiet=True)
    files = _output_files(output)
    if workers < 1:
        raise DataError(f"--workers {workers}: must be at least 1")
    if tokenizer is not None and vocab_size is not None:
        raise DataError(
            "--vocab-size sizes the tokenizer prepare trains; it cannot change a given --tokenizer"
        )
    if vocab_size is not None and vocab_size < MIN_VOCAB_SIZE:
        raise DataError(
            f"--vocab-size {vocab_size} is too small: at least {MIN_VOCAB_SIZE} (256 byte symbols + EOD)"
        )
    paths = list(dict.fromkeys([*find_input_files(inputs, globs), *(stdlib_sources() if stdlib else [])]))
    if not paths:
        raise DataError("no inputs: give INPUT files or directories, or --stdlib")
    if tokenizer is not None:
        given = read_tokenizer(tokenizer)
        eod_id(given, tokenizer)
        document_template(given, tokenizer)
    request = Request(
        inputs=[InputFile.of(path) for path in paths],
        text_key=text_key,
        tokenizer_sha256=file_sha256(tokenizer) if tokenizer else None,
        vocab_size=None if tokenizer else (vocab_size or DEFAULT_VOCAB_SIZE),
        limits=limits or ValidationLimits(),
    )
    if not force and (cached := _cached(files, request)) is not None:
        return PrepareResult(
            files, cached, cached=True, seconds=time.perf_counter() - started, timing=EncodeTiming(0, 0)
        )

    pieces = split_into_pieces(paths)
    batches = _batches(pieces)
    temporary = {path: path.with_name(f"{path.name}.tmp-{os.getpid()}") for path in files.all()}
    try:
        with _batch_mapper(workers) as map_batches, _progress(console) as progress:
            validation, drops = _scan(batches, pieces, text_key, request.limits, map_batches, progress)
            files.bin.parent.mkdir(parents=True, exist_ok=True)
            tokenizer_path = temporary[files.tokenizer]
            if tokenizer is not None:
                shutil.copyfile(tokenizer, tokenizer_path)
            else:
                assert request.vocab_size is not None  # set whenever no tokenizer is given (above)
                task = progress.add_task(
                    f"training a byte-level BPE (vocab {request.vocab_size:,})", total=None, detail=""
                )
                train_bpe(_documents(batches, drops, text_key), request.vocab_size).save(str(tokenizer_path))
                progress.update(task, total=1, completed=1)
            manifest, timing, template = _encode(
                batches, drops, text_key, request, tokenizer_path, temporary, files, map_batches, progress
            )
            manifest = manifest.model_copy(update={"validation": validation.report})
            write_digests(str(temporary[files.digests]), validation.digests)
        publish_dataset(files, temporary, manifest)
    finally:
        for path in temporary.values():
            path.unlink(missing_ok=True)
    return PrepareResult(files, manifest, False, time.perf_counter() - started, timing, template)


def _output_files(output: str) -> DatasetFiles:
    for suffix in (".bin", ".idx", ".json"):
        if output.endswith(suffix):
            raise DataError(
                f"--output {output!r} is a prefix, not a file name: --output {output[: -len(suffix)]!r} writes "
                f"{output[: -len(suffix)]}.bin, .idx, .tokenizer.json and .manifest.json"
            )
    parent = Path(output).parent
    if parent.exists() and not parent.is_dir():
        raise DataError(f"--output {output!r}: {parent} is not a directory")
    return DatasetFiles(output)


def _cached(files: DatasetFiles, request: Request) -> Manifest | None:
    """The manifest of an identical earlier run; raise when PREFIX holds anything else."""
    existing = [path for path in files.all() if path.exists()]
    if not existing:
        return None
    manifest = read_manifest(files)
    if manifest is None:
        raise DataError(
            f"{existing[0]} exists but no {files.manifest.name} says what it holds; "
            f"pass --force to replace it, or choose another --output"
        )
    if manifest.request != request:
        reasons = "; ".join(request.differences(manifest.request))
        raise DataError(
            f"{files.prefix!r} holds a dataset prepared from other inputs ({reasons}); "
            f"pass --force to replace it, or choose another --output"
        )
    manifest.check_files(files)
    return manifest


# Pieces travel to workers in batches of about this size: few round trips, and batch encoding.
BATCH_BYTES = 1 << 20
Batch = tuple[Piece, ...]


def _batches(pieces: Sequence[Piece]) -> list[Batch]:
    """Consecutive pieces grouped up to BATCH_BYTES (a larger piece goes alone); independent of the worker count."""
    batches: list[list[Piece]] = []
    size = 0
    for piece in pieces:
        if not batches or size + piece.end - piece.start > BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(piece)
        size += piece.end - piece.start
    return [tuple(batch) for batch in batches]


def _batch_bytes(batch: Batch) -> int:
    return sum(piece.end - piece.start for piece in batch)


BatchMapper = Callable[[Callable, Sequence], Iterator]


@contextlib.contextmanager
def _batch_mapper(workers: int) -> Iterator[BatchMapper]:
    """An ordered map over batches: in this process for one worker (the tokenizer then uses its own threads),
    else a pool of single-threaded processes, so N workers use N cores; the pool is terminated on error."""
    if workers == 1:
        yield map
        return
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # inherited by the forked workers only
    # The workers fork with SIGTERM's default action, whatever this process handles it with: a Python handler
    # runs only between bytecodes, so a worker blocked in C would outlive the pool's terminate() (SIGTERM) and its
    # join would wait for ever.
    main_thread = threading.current_thread() is threading.main_thread()
    handler = signal.signal(signal.SIGTERM, signal.SIG_DFL) if main_thread else None
    try:
        pool = multiprocessing.get_context("fork").Pool(workers)
    finally:
        if handler is not None:  # None: set from C, not ours to put back
            signal.signal(signal.SIGTERM, handler)
        if previous is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous
    with pool:
        yield lambda function, batches: pool.imap(function, batches)


def _progress(console: Console) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeRemainingColumn(),
        console=console,
    )


def validate_batch(batch: Batch, text_key: str, limits: ValidationLimits) -> list[Verdict]:
    return validate_pieces(batch, text_key, limits)


def _scan(
    batches: Sequence[Batch],
    pieces: Sequence[Piece],
    text_key: str,
    limits: ValidationLimits,
    map_batches: BatchMapper,
    progress: Progress,
) -> tuple[Validation, list[frozenset[int]]]:
    """Read and check every record once (trainer/data/validate.py), before anything is written: the counts, the
    kept documents' digests, and for each batch the records to leave out. Refuses a corpus over the reject rate."""
    task = progress.add_task("checking inputs", total=sum(map(_batch_bytes, batches)), detail="")
    validation = Validation(limits, pieces)
    drops = []
    check = functools.partial(validate_batch, text_key=text_key, limits=limits)
    for batch, verdicts in zip(batches, map_batches(check, batches), strict=True):
        drops.append(validation.admit(batch, verdicts))
        progress.update(task, advance=_batch_bytes(batch), detail=f"{len(validation.digests):,} documents")
    validation.finish()
    return validation, drops


def _documents(batches: Iterable[Batch], drops: Iterable[frozenset[int]], text_key: str) -> Iterator[str]:
    """The kept documents, in order: every record of the batches but the ones the validation left out."""
    for batch, drop in zip(batches, drops, strict=True):
        records = (record for piece in batch for record in read_records(piece, text_key))
        for ordinal, record in enumerate(records):
            if ordinal not in drop:
                assert record.text is not None  # a record without text is always rejected
                yield record.text


@dataclass(frozen=True)
class EncodedBatch:
    tokens: np.ndarray  # every document's tokens, framed by the template and ended by EOD
    lengths: np.ndarray  # tokens per document, all of those included
    cpu_seconds: float  # the worker's CPU time for this batch: reading, parsing and encoding


@functools.lru_cache(maxsize=1)
def _worker_tokenizer(path: str, sha256: str) -> tuple[Tokenizer, DocumentTemplate, tuple[int, ...]]:
    """The tokenizer, its document template, and the tokens that follow each document's text."""
    tokenizer = read_tokenizer(path)
    template = document_template(tokenizer, path)
    return tokenizer, template, template.ending(eod_id(tokenizer, path))


def encode_batch(
    work: tuple[Batch, frozenset[int]], text_key: str, tokenizer_path: str, tokenizer_sha256: str, dtype: str
) -> EncodedBatch:
    started = time.process_time()
    tokenizer, template, ending = _worker_tokenizer(tokenizer_path, tokenizer_sha256)
    batch, drop = work
    ids = encode_documents(tokenizer, list(_documents([batch], [drop], text_key)))
    flat: list[int] = []
    for document in ids:
        flat += template.prefix
        flat += document
        flat += ending
    frame = len(template.prefix) + len(ending)
    lengths = np.array([len(document) + frame for document in ids], dtype=np.int64)
    tokens = np.array(flat, dtype=dtype)
    return EncodedBatch(tokens, lengths, time.process_time() - started)


def _encode(
    batches: Sequence[Batch],
    drops: Sequence[frozenset[int]],
    text_key: str,
    request: Request,
    tokenizer_path: Path,
    temporary: dict[Path, Path],
    files: DatasetFiles,
    map_batches: BatchMapper,
    progress: Progress,
) -> tuple[Manifest, EncodeTiming, DocumentTemplate]:
    """Encode every batch (in order) into the temporary .bin/.idx; return their manifest, how long it took and
    the document template."""
    started = time.perf_counter()
    tokenizer = read_tokenizer(tokenizer_path)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    template = document_template(tokenizer, tokenizer_path)
    dtype = token_dtype(vocab_size)
    sha256 = file_sha256(tokenizer_path)
    task = progress.add_task("tokenizing", total=sum(map(_batch_bytes, batches)), detail="")
    writer = IndexedDatasetWriter(temporary[files.bin], dtype)
    documents = tokens = max_token_id = 0
    worker_cpu_seconds = 0.0
    encode = functools.partial(
        encode_batch,
        text_key=text_key,
        tokenizer_path=str(tokenizer_path),
        tokenizer_sha256=sha256,
        dtype=dtype.__name__,
    )
    work = list(zip(batches, drops, strict=True))
    for batch, encoded in zip(batches, map_batches(encode, work), strict=True):
        writer.add_documents(encoded.tokens, encoded.lengths)
        documents += encoded.lengths.size
        tokens += encoded.tokens.size
        worker_cpu_seconds += encoded.cpu_seconds
        max_token_id = max(max_token_id, int(encoded.tokens.max(initial=0)))
        progress.update(task, advance=_batch_bytes(batch), detail=f"{tokens:,} tokens")
    writer.finalize(temporary[files.idx])
    seconds = time.perf_counter() - started
    manifest = Manifest(
        request=request,
        tokenizer=TokenizerRecord(
            file=files.tokenizer.name,
            sha256=sha256,
            vocab_size=vocab_size,
            eod_id=eod_id(tokenizer, tokenizer_path),
        ),
        dtype=dtype.__name__,
        documents=documents,
        tokens=tokens,
        max_token_id=max_token_id,
        **written_files(temporary[files.bin], temporary[files.idx]),
    )
    return manifest, EncodeTiming(seconds, worker_cpu_seconds), template
