"""`python -m trainer convert`: trainer checkpoint <-> Hugging Face Llama or DeepSpeed checkpoint, through full
weights (trainer/model/weights.py).

    convert --from-hf DIR --out CKPT [--tp N --pp M]   config.json + safetensors -> CKPT/iter_0000000 (weights
                                                        only), CKPT/latest, CKPT/train.yaml, CKPT/tokenizer.json
    convert --to-hf CKPT --out DIR [--dtype D]          a trainer checkpoint (any, from any layout) -> DIR, ready
                                                        to serve (trainer/interop/export.py: tokenizer with its
                                                        chat template, generation_config.json, model card);
                                                        D: bf16, fp16 (refused if a weight overflows it), fp32
    convert --from-deepspeed CKPT --out CKPT2 [--tp N --pp M]   an `engine: deepspeed` checkpoint (any ZeRO stage
                                                        and DP size) -> CKPT2/iter_0000000 (weights only), latest
    convert --to-deepspeed CKPT --out CKPT2             a trainer checkpoint (any layout) -> CKPT2/iter_0000000
                                                        (DeepSpeed's format, weights only), CKPT2/latest

Everything is checked before a process starts: the config's features, every tensor's name and shape, the output
not existing. Into a trainer checkpoint, torchrun starts TP x PP processes; from Hugging Face each reads only its
own stage's tensors, from DeepSpeed each merges the ZeRO shards (the whole model in fp32 in each process), and
each keeps its shard. The checkpoint loads at any layout. To Hugging Face or DeepSpeed, one process rebuilds the
model at TP=1, PP=1 (the whole model in its memory). Weights convert exactly in fp32; the optimizer state, step
and LR schedule do not carry over (a run continues from the result with checkpoint.load). Every conversion
writes into OUT.tmp and renames it to OUT when complete.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

from trainer.arguments import positive_int
from trainer.checkpoint import deepspeed as deepspeed_checkpoint
from trainer.checkpoint import formats
from trainer.checkpoint import megatron as megatron_checkpoint
from trainer.checkpoint.record import ModelRecord
from trainer.checkpoint.store import Progress
from trainer.checkpoint.version import RECORD, ModelVersion, read_evaluations, read_record
from trainer.config import ConfigError, ModelConfig, layout_problems
from trainer.data import DataError
from trainer.data.chat import ChatTemplate, trained_template
from trainer.device import device_type
from trainer.distributed import local, parallel
from trainer.interop import export, hf
from trainer.interop.hf import DTYPE_ALIASES, DTYPE_NAMES, HuggingFaceCheckpoint, HuggingFaceError, parse_size
from trainer.model import llama, weights

TRAIN_CONFIG = "train.yaml"
TOKENIZER = "tokenizer.json"
# The converted model's starting recipe caps the sequence length here (Llama 3.1 allows 131072 positions).
RECIPE_MAX_SEQ_LENGTH = 4096


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-hf", type=Path, metavar="DIR", help="a Hugging Face Llama directory")
    source.add_argument(
        "--to-hf", type=Path, metavar="CKPT", help="a trainer checkpoint, or a directory of them"
    )
    source.add_argument(
        "--from-deepspeed", type=Path, metavar="CKPT", help="a DeepSpeed checkpoint, or a directory of them"
    )
    source.add_argument(
        "--to-deepspeed", type=Path, metavar="CKPT", help="a trainer checkpoint, or a directory of them"
    )
    parser.add_argument("--out", type=Path, required=True, help="the directory to create (must not exist)")
    parser.add_argument(
        "--tp",
        type=positive_int,
        default=1,
        help="--from-hf/--from-deepspeed: tensor-parallel size to convert at",
    )
    parser.add_argument(
        "--pp",
        type=positive_int,
        default=1,
        help="--from-hf/--from-deepspeed: pipeline-parallel size to convert at",
    )
    parser.add_argument(
        "--dtype",
        choices=[*DTYPE_ALIASES, *DTYPE_NAMES.values()],
        help="--to-hf: tensor dtype (default: the source's for converted models, else fp32, lossless); fp16 is "
        "refused when a weight exceeds its range",
    )
    parser.add_argument(
        "--max-shard-size", default="5GB", help="--to-hf: safetensors shard size (default 5GB)"
    )


class ConvertError(ValueError):
    """A conversion that cannot start."""


def main(args: argparse.Namespace) -> int:
    try:
        if args.out.exists():
            raise ConvertError(f"--out {args.out} exists; convert never overwrites: give a new directory")
        if args.from_hf:
            source = HuggingFaceCheckpoint(args.from_hf)
            _check_layout(source.model, args.tp, args.pp)
            nproc = args.tp * args.pp
        elif args.from_deepspeed:
            _, record = _checkpoint_to_export(args.from_deepspeed, "--from-deepspeed", deepspeed=True)
            _check_layout(record.config, args.tp, args.pp)
            nproc = args.tp * args.pp
        else:
            flag = "--to-hf" if args.to_hf else "--to-deepspeed"
            if args.tp != 1 or args.pp != 1:
                raise ConvertError(
                    f"--tp/--pp apply to --from-hf and --from-deepspeed; {flag} reads any checkpoint in one process"
                )
            found, _ = _checkpoint_to_export(args.to_hf or args.to_deepspeed, flag, deepspeed=False)
            if args.to_hf:  # its record and tokenizer read before any process starts
                version = _version_of(found)
                tokenizer = _tokenizer_of(found, version)
                if tokenizer is not None:
                    export.special_tokens(tokenizer, _template_of(version, tokenizer))
            parse_size(args.max_shard_size)
            nproc = 1
    # Every check above raises a ValueError (ours subclass it, as pydantic's does) or a ConfigError.
    except (ValueError, ConfigError) as error:
        print(f"convert: {error}", file=sys.stderr)
        return 2
    if not local.under_torchrun():
        local.exec_torchrun(nproc, _verb_args(args))
    if args.from_hf:
        _from_hf(source, args.out, args.tp, args.pp)
    elif args.from_deepspeed:
        _from_deepspeed(args.from_deepspeed, args.out, args.tp, args.pp)
    elif args.to_deepspeed:
        _to_deepspeed(args.to_deepspeed, args.out)
    else:
        return _to_hf(args.to_hf, args.out, args.dtype, parse_size(args.max_shard_size))
    return 0


def _verb_args(args: argparse.Namespace) -> list[str]:
    """This command line again, for each process torchrun starts."""
    flag, path = next(
        (f"--{key.replace('_', '-')}", value)
        for key in ("from_hf", "to_hf", "from_deepspeed", "to_deepspeed")
        if (value := getattr(args, key))
    )
    source = [flag, str(path)]
    verb = ["convert", *source, "--out", str(args.out), "--tp", str(args.tp), "--pp", str(args.pp)]
    return [*verb, *(["--dtype", args.dtype] if args.dtype else []), "--max-shard-size", args.max_shard_size]


def _check_layout(model: ModelConfig, tp: int, pp: int) -> None:
    cfg = weights.model_only_config(model, tensor_parallel=tp, pipeline_parallel=pp, seq_length=1)
    problems = layout_problems(cfg, tp * pp, device_type())
    if problems:
        raise ConvertError(f"--tp {tp} --pp {pp} does not fit the model: " + "; ".join(problems))


def _checkpoint_to_export(path: Path, flag: str, *, deepspeed: bool) -> tuple[Path, ModelRecord]:
    """The checkpoint (or the newest of a directory of them) and its model record; of the engine `flag` reads
    (--to-hf reads either)."""
    found = formats.resolve(path)
    is_deepspeed = formats.format_of(found) is deepspeed_checkpoint
    if flag != "--to-hf" and is_deepspeed != deepspeed:
        saved_by, other = (
            ("DeepSpeed", "--from-deepspeed") if is_deepspeed else ("trainer (megatron)", "--to-deepspeed")
        )
        raise ConvertError(f"{flag} {path}: {found} is a {saved_by} checkpoint; give it to {other}")
    record = formats.read_record(found)
    if record is None:
        raise ConvertError(
            f"{flag}: {found} records no model config (saved before checkpoints carried one); resave it"
        )
    return found, record


def _staging(out: Path) -> Path:
    """OUT.tmp, emptied: the output grows there and becomes OUT by one rename."""
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def _from_hf(source: HuggingFaceCheckpoint, out: Path, tp: int, pp: int) -> None:
    record = ModelRecord(
        source.model,
        seq_length=source.hf_config.get("max_position_embeddings", RECIPE_MAX_SEQ_LENGTH),
        hf_config={**source.hf_config, "dtype": DTYPE_NAMES[source.dtype]},
    )

    def add_recipe(staging: Path) -> None:
        tokenizer = source.directory / TOKENIZER
        if tokenizer.is_file():
            shutil.copyfile(tokenizer, staging / TOKENIZER)
        (staging / TRAIN_CONFIG).write_text(finetune_recipe(source, out, tp, pp, tokenizer.is_file()))
        print(
            f"convert: {source.directory} -> {out} (train with: --config {out / TRAIN_CONFIG})",
            file=sys.stderr,
        )

    _write_trainer_checkpoint(out, tp, pp, record, source.full_weights(), add_recipe)


def _from_deepspeed(source: Path, out: Path, tp: int, pp: int) -> None:
    found, record = _checkpoint_to_export(source, "--from-deepspeed", deepspeed=True)

    def report(_: Path) -> None:
        print(f"convert: {found} -> {out} (train from it with: --set checkpoint.load={out})", file=sys.stderr)

    full_weights = deepspeed_checkpoint.full_weights(found)
    _write_trainer_checkpoint(out, tp, pp, record, full_weights.__getitem__, report)


def _write_trainer_checkpoint(
    out: Path,
    tp: int,
    pp: int,
    record: ModelRecord,
    full_weight: Callable[[str], torch.Tensor],
    finish: Callable[[Path], None],
) -> None:
    """Under torchrun at TP x PP: each rank's shard of the full weights, saved as a weights-only checkpoint in
    OUT.tmp; rank 0 adds what `finish` writes, then renames it to OUT."""
    cfg = weights.model_only_config(record.config, tensor_parallel=tp, pipeline_parallel=pp, seq_length=1)
    dims = parallel.initialize(cfg)
    try:
        rank = torch.distributed.get_rank()
        chunks = llama.build(cfg).chunks
        weights.load_into(chunks, full_weight)
        staging = out.with_name(out.name + ".tmp")
        if rank == 0:
            _staging(out)
        torch.distributed.barrier()
        megatron_checkpoint.save(staging, chunks, None, None, Progress(), dims, record).finish()
        if rank == 0:
            finish(staging)
            os.replace(staging, out)
        torch.distributed.barrier()
    finally:
        parallel.shutdown()


def finetune_recipe(source: HuggingFaceCheckpoint, out: Path, tp: int, pp: int, has_tokenizer: bool) -> str:
    """A trainer config that fine-tunes the converted model: its model section is config.json's."""
    max_positions = source.hf_config.get("max_position_embeddings", RECIPE_MAX_SEQ_LENGTH)
    tokenizer = str(out / TOKENIZER) if has_tokenizer else "CHANGE-ME/tokenizer.json"
    recipe = {
        "name": f"{source.directory.name}-finetune",
        "precision": "bf16",
        "model": source.model.model_dump(exclude_none=True),
        "parallel": {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp},
        "data": {
            "prefixes": ["CHANGE-ME"],
            "tokenizer_path": tokenizer,
            "seq_length": min(max_positions, RECIPE_MAX_SEQ_LENGTH),
        },
        "optimizer": {"lr": 1.0e-5, "min_lr": 1.0e-6, "weight_decay": 0.1, "clip_grad": 1.0},
        "schedule": {
            "train_iters": 1000,
            "micro_batch_size": 1,
            "global_batch_size": 64,
            "lr_warmup_iters": 50,
            "eval_interval": 100,
        },
        "checkpoint": {"load": str(out), "finetune": True, "save_interval": 200},
    }
    header = (
        f"# Fine-tunes {source.directory} (converted to {out}): the model section is its config.json's.\n"
        f"# Prepare data with its tokenizer and set data.prefixes, e.g.\n"
        f"#   python -m trainer prepare INPUT... --tokenizer {tokenizer} --output data/mine\n"
        f"#   python -m trainer train --config {out / TRAIN_CONFIG} --set data.prefixes=[data/mine]\n"
    )
    return header + yaml.safe_dump(recipe, sort_keys=False)


def _to_hf(source: Path, out: Path, dtype_name: str | None, max_shard_bytes: int) -> int:
    found, record = _checkpoint_to_export(source, "--to-hf", deepspeed=False)
    dtype_name = DTYPE_ALIASES.get(dtype_name or "", dtype_name) or (record.hf_config or {}).get(
        "dtype", "float32"
    )
    dtype = {name: dtype for dtype, name in DTYPE_NAMES.items()}[dtype_name]
    version = _version_of(found)
    tokenizer = _tokenizer_of(found, version)
    parallel.initialize(weights.model_only_config(record.config, seq_length=record.seq_length))
    try:
        full_weights = formats.full_weights(found, record)
        staging = _staging(out)
        hf_config = hf.to_hf_config(record.config, record.hf_config, dtype, record.seq_length)
        try:
            hf.write(staging, record.config, full_weights, hf_config, dtype, max_shard_bytes)
        except HuggingFaceError as error:
            shutil.rmtree(staging, ignore_errors=True)
            print(f"convert: {error}", file=sys.stderr)
            return 2
        _add_inference_files(staging, found, dtype_name, record.seq_length, version, tokenizer, hf_config)
        os.replace(staging, out)
        print(f"convert: {found} -> {out} ({dtype_name})", file=sys.stderr)
    finally:
        parallel.shutdown()
    return 0


def export_to_hf(source: Path, out: Path, dtype_name: str, max_shard_size: str = "5GB") -> int:
    """`convert --to-hf SOURCE --out OUT --dtype D` in this process (a world of one, no torchrun), with the same
    checks before anything is written; its exit status."""

    try:
        if out.exists():
            raise ConvertError(f"--out {out} exists; convert never overwrites: give a new directory")
        if dtype_name not in (*DTYPE_ALIASES, *DTYPE_NAMES.values()):
            raise ConvertError(
                f"--dtype {dtype_name!r}: use one of {', '.join((*DTYPE_ALIASES, *DTYPE_NAMES.values()))}"
            )
        found, _ = _checkpoint_to_export(source, "--to-hf", deepspeed=False)
        version = _version_of(found)
        tokenizer = _tokenizer_of(found, version)
        if tokenizer is not None:
            export.special_tokens(tokenizer, _template_of(version, tokenizer))
        max_shard_bytes = parse_size(max_shard_size)
    except (ValueError, ConfigError) as error:
        print(f"convert: {error}", file=sys.stderr)
        return 2
    with local.single_process():
        return _to_hf(source, out, dtype_name, max_shard_bytes)


def _version_of(checkpoint: Path) -> ModelVersion | None:
    """The checkpoint's model version record (trainer/checkpoint/version.py); None for one no run published."""
    return read_record(checkpoint) if (checkpoint / RECORD).is_file() else None


def _tokenizer_of(checkpoint: Path, version: ModelVersion | None) -> Path | None:
    """The model's tokenizer: its record's data.tokenizer_path, else the one `convert --from-hf` put beside it."""
    for candidate in (Path(version.tokenizer_path) if version else None, checkpoint.parent / TOKENIZER):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def _template_of(version: ModelVersion | None, tokenizer: Path) -> ChatTemplate | None:
    """The chat template the version's run was fine-tuned with (its chat data's manifests), if it was."""
    if version is None:
        return None
    try:
        return trained_template(version.config["data"]["prefixes"], tokenizer)
    except DataError as error:
        raise ConvertError(f"{version.version}: {error}") from None


def _add_inference_files(
    staging: Path,
    checkpoint: Path,
    dtype_name: str,
    max_length: int,
    version: ModelVersion | None,
    tokenizer: Path | None,
    hf_config: dict,
) -> None:
    """The tokenizer with its chat template, generation_config.json and the model card (trainer/interop/export.py)."""
    if tokenizer is None:
        print(
            f"convert: warning: no tokenizer found for {checkpoint} (its record's data.tokenizer_path, or "
            f"{checkpoint.parent / TOKENIZER}): the export has no tokenizer files",
            file=sys.stderr,
        )
    else:
        tokens = export.write_tokenizer(staging, tokenizer, max_length, _template_of(version, tokenizer))
        if hf_config.get("eos_token_id") is None:  # a model the trainer trained: its tokenizer decides
            hf_config.update(eos_token_id=tokens.eos_id, bos_token_id=tokens.bos_id)
            (staging / hf.CONFIG).write_text(json.dumps(hf_config, indent=2) + "\n")
        generation = {**export.generation_config(tokens), "max_length": max_length}
        (staging / export.GENERATION_CONFIG).write_text(json.dumps(generation, indent=2) + "\n")
    evaluations = read_evaluations(checkpoint) if version else []
    has_template = (staging / export.TOKENIZER_CONFIG).is_file() and "chat_template" in json.loads(
        (staging / export.TOKENIZER_CONFIG).read_text()
    )
    card = export.model_card(
        version.run if version else checkpoint.parent.name, dtype_name, version, evaluations, has_template
    )
    (staging / export.MODEL_CARD).write_text(card)


def _to_deepspeed(source: Path, out: Path) -> None:
    from trainer.engines import (
        deepspeed as deepspeed_engine,  # imports DeepSpeed, which the other directions do without
    )

    found, record = _checkpoint_to_export(source, "--to-deepspeed", deepspeed=False)
    # ZeRO's default stage: a DeepSpeed run takes a weights-only checkpoint's full weights at its own layout.
    cfg = weights.model_only_config(record.config, seq_length=record.seq_length).model_copy(
        update={"engine": "deepspeed"}
    )
    parallel.initialize(cfg)
    try:
        full_weights = formats.full_weights(found, record)
        staging = _staging(out)
        deepspeed_engine.save_weights(cfg, full_weights, record, staging)
        os.replace(staging, out)
        print(f"convert: {found} -> {out} (train from it with: --set checkpoint.load={out})", file=sys.stderr)
    finally:
        parallel.shutdown()
