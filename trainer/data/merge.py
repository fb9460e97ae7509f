"""`python -m trainer merge --output PREFIX SHARD_PREFIX...`: shards prepared apart, one indexed dataset.

The shards are appended in the order given with megatron-core's `IndexedDatasetBuilder.add_index`
(megatron/core/datasets/indexed_dataset.py, tag core_v0.16.1: it extends the sequence lengths, shifts the shard's
document indices by the sequences before it, and copies its .bin), which is what one `prepare` of the shards'
inputs, in the same order, writes, when three things hold, and merge checks each before it writes anything:

- every shard was tokenized with the same tokenizer file (the manifests' SHA-256) and so the same token dtype;
- the same record limits and text key (trainer/data/validate.py);
- a document an earlier shard already holds is left out, as `prepare` leaves out an exact repeat: each shard's
  PREFIX.digests lists its kept documents' digests, and a shard with a repeat is copied document by document
  (`add_document`) instead of whole.

The output is written under temporary names and renamed into place, the manifest (with the index's SHA-256 and
the .bin's sampled hash, and each shard's index hash) last; the same shards again find it and do nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.data import DataError
from trainer.data.manifest import (
    DatasetFiles,
    Manifest,
    Request,
    publish_dataset,
    read_manifest,
    written_files,
)
from trainer.data.tokenizer import file_sha256
from trainer.data.validate import (
    EXAMPLES,
    REJECTIONS,
    ValidationReport,
    check_limits,
    check_reject_rate,
    read_digests,
    write_digests,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output",
        required=True,
        metavar="PREFIX",
        help="writes PREFIX.bin, .idx, .tokenizer.json, .digests and .manifest.json",
    )
    parser.add_argument(
        "shards", nargs="+", metavar="SHARD_PREFIX", help="prepared datasets, in the order of their inputs"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if PREFIX already holds a dataset")
    parser.add_argument(
        "--max-reject-rate",
        type=float,
        help="refuse when more than this share of all the shards' records was rejected (default: the shards' "
        "own --max-reject-rate)",
    )


def main(args: argparse.Namespace) -> int:
    try:
        result = merge_datasets(
            args.shards, args.output, force=args.force, max_reject_rate=args.max_reject_rate
        )
    except DataError as error:
        print(f"merge: {error}", file=sys.stderr)
        return 2
    print(result.summary())
    return 0


@dataclass(frozen=True)
class MergeResult:
    files: DatasetFiles
    manifest: Manifest
    cached: bool
    repeats: int  # documents left out because an earlier shard holds them

    def summary(self) -> str:
        m = self.manifest
        state = "cached" if self.cached else f"merged, {self.repeats:,} repeats across shards left out"
        return (
            f"{self.files.prefix}: {state}; {m.documents:,} documents, {m.tokens:,} tokens from "
            f"{len(m.merged_from or [])} shard(s)"
        )


@dataclass(frozen=True)
class Shard:
    files: DatasetFiles
    manifest: Manifest


def read_shards(prefixes: Sequence[str]) -> list[Shard]:
    """Each shard's manifest, checked complete and compatible with the first one, before anything is written."""
    if not prefixes:
        raise DataError("no SHARD_PREFIX given: name the prepared shards to merge, in input order")
    if len(set(prefixes)) != len(prefixes):
        repeated = next(prefix for prefix in prefixes if prefixes.count(prefix) > 1)
        raise DataError(f"shard {repeated!r} is given twice; each shard once, in input order")
    shards = []
    for prefix in prefixes:
        files = DatasetFiles(prefix)
        manifest = read_manifest(files)
        if manifest is None:
            raise DataError(
                f"shard {prefix!r} has no {files.manifest.name}: prepare it first "
                f"(`python -m trainer prepare ... --output {prefix}`)"
            )
        manifest.check_files(files)
        if not files.digests.exists():
            raise DataError(
                f"shard {prefix!r} has no {files.digests.name} (prepared before prepare wrote document digests): "
                f"re-run its `prepare ... --force`"
            )
        shards.append(Shard(files, manifest))
    first = shards[0].manifest
    for shard in shards[1:]:
        m, prefix = shard.manifest, shard.files.prefix
        for what, mine, theirs in (
            ("tokenizer SHA-256", m.tokenizer.sha256, first.tokenizer.sha256),
            ("token dtype", m.dtype, first.dtype),
            ("--text-key", m.request.text_key, first.request.text_key),
            ("--min-chars", m.request.limits.min_chars, first.request.limits.min_chars),
            ("--max-chars", m.request.limits.max_chars, first.request.limits.max_chars),
        ):
            if mine != theirs:
                raise DataError(
                    f"shard {prefix!r} differs from {shards[0].files.prefix!r} in its {what} ({mine} vs {theirs}): "
                    f"prepare every shard with the same --tokenizer and options"
                )
    return shards


def merge_datasets(
    prefixes: Sequence[str], output: str, *, force: bool = False, max_reject_rate: float | None = None
) -> MergeResult:
    """Everything `merge` does. Shards prepared in parallel check their records alone, so a Batch array's
    children run with --max-reject-rate 1 and the corpus's limit is applied here, to the sum."""
    from trainer.data.prepare import _output_files  # the same --output rules as prepare

    files = _output_files(output)
    shards = read_shards(prefixes)
    first = shards[0].manifest
    limits = first.request.limits
    if max_reject_rate is not None:
        limits = check_limits(limits.min_chars, limits.max_chars, max_reject_rate)
    if files.prefix in prefixes:
        raise DataError(f"--output {output!r} is also a shard; merge into a new PREFIX")
    merged_from = [_index_hash(shard) for shard in shards]
    request = Request(
        inputs=[item for shard in shards for item in shard.manifest.request.inputs],
        text_key=first.request.text_key,
        tokenizer_sha256=first.tokenizer.sha256,
        vocab_size=None,
        limits=limits,
    )
    if not force and (cached := _cached(files, request, merged_from)) is not None:
        return MergeResult(files, cached, cached=True, repeats=0)

    seen: set[bytes] = set()
    keep: list[np.ndarray] = []
    kept_digests: list[bytes] = []
    for shard in shards:
        digests = read_digests(str(shard.files.digests))
        if len(digests) != shard.manifest.documents:
            raise DataError(
                f"{shard.files.digests} lists {len(digests)} documents, its manifest {shard.manifest.documents}: "
                f"re-run the shard's `prepare ... --force`"
            )
        mask = np.array([digest not in seen for digest in digests], dtype=bool)
        for digest, kept in zip(digests, mask, strict=True):
            if kept:
                seen.add(digest)
                kept_digests.append(digest)
        keep.append(mask)
    report = _merged_report(shards, keep)
    check_reject_rate(report, limits)

    temporary = {path: path.with_name(f"{path.name}.tmp-{os.getpid()}") for path in files.all()}
    try:
        files.bin.parent.mkdir(parents=True, exist_ok=True)
        tokens, max_token_id = _write_indexed(
            shards, keep, first.dtype, temporary[files.bin], temporary[files.idx]
        )
        shutil.copyfile(shards[0].files.tokenizer, temporary[files.tokenizer])
        write_digests(str(temporary[files.digests]), kept_digests)
        manifest = Manifest(
            request=request,
            tokenizer=first.tokenizer.model_copy(update={"file": files.tokenizer.name}),
            dtype=first.dtype,
            documents=len(kept_digests),
            tokens=tokens,
            max_token_id=max_token_id,
            **written_files(temporary[files.bin], temporary[files.idx]),
            validation=report,
            merged_from=merged_from,
        )
        publish_dataset(files, temporary, manifest)
    finally:
        for path in temporary.values():
            path.unlink(missing_ok=True)
    return MergeResult(files, manifest, cached=False, repeats=sum(int((~mask).sum()) for mask in keep))


def _index_hash(shard: Shard) -> str:
    return shard.manifest.idx_sha256 or file_sha256(shard.files.idx)


def _cached(files: DatasetFiles, request: Request, merged_from: list[str]) -> Manifest | None:
    existing = [path for path in files.all() if path.exists()]
    if not existing:
        return None
    manifest = read_manifest(files)
    if manifest is None or manifest.request != request or manifest.merged_from != merged_from:
        raise DataError(
            f"{files.prefix!r} holds {'files no manifest describes' if manifest is None else 'another dataset'}; "
            f"pass --force to replace it, or choose another --output"
        )
    manifest.check_files(files)
    return manifest


def _merged_report(shards: Sequence[Shard], keep: Sequence[np.ndarray]) -> ValidationReport:
    """The shards' counts added up, and the repeats across shards counted as the duplicates they are."""
    reports = [shard.manifest.validation or ValidationReport() for shard in shards]
    rejected = {reason: sum(report.rejected[reason] for report in reports) for reason in REJECTIONS}
    repeats = sum(int((~mask).sum()) for mask in keep)
    rejected["duplicate"] += repeats
    examples = [example for report in reports for example in report.first_rejected][:EXAMPLES]
    return ValidationReport(
        records=sum(report.records for report in reports),
        kept=sum(int(mask.sum()) for mask in keep),
        rejected=rejected,
        first_rejected=examples,
    )


def _write_indexed(
    shards: Sequence[Shard], keep: Sequence[np.ndarray], dtype: str, bin_path: Path, idx_path: Path
) -> tuple[int, int]:
    """Append the shards with megatron-core's builder: whole (`add_index`) or, with repeats, document by document."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(str(bin_path), dtype=getattr(np, dtype))
    tokens = max_token_id = 0
    for shard, mask in zip(shards, keep, strict=True):
        if mask.all():
            builder.add_index(shard.files.prefix)
            tokens += shard.manifest.tokens
            max_token_id = max(max_token_id, shard.manifest.max_token_id)
            continue
        dataset = IndexedDataset(shard.files.prefix)
        for index in np.flatnonzero(mask):
            document = dataset[int(index)]
            builder.add_document(torch.from_numpy(document.astype(np.int64)), [document.size])
            tokens += int(document.size)
            max_token_id = max(max_token_id, int(document.max(initial=0)))
    builder.finalize(str(idx_path))
    return tokens, max_token_id
