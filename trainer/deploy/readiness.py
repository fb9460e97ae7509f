"""What a model version needs before `make deploy` may put it live, checked in the stack's checkpoints bucket.

- An evaluation (`evaluations/<name>.json` beside its record, trainer/checkpoint/version.py) with a generation task's
  smoke answer: the prompt and greedy answer the rollout's smoke check compares the new fleet with.
- A complete export: `<run>/export/<version>.export.json` (trainer/models/pipeline.py) and every file it lists,
  at its size, under `<run>/export/<version>/` (FSx exports each file on its own, so a marker alone proves nothing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from trainer.models.pipeline import CHECKPOINTS, EXPORT, EXPORT_MARKER_SUFFIX
from trainer.models.registry import Found


@dataclass(frozen=True)
class Smoke:
    prompt: str
    answer: str
    max_new_tokens: int
    stop: list[str]


@dataclass(frozen=True)
class Ready:
    version: str
    export_uri: str  # s3://bucket/<run>/export/<version>/
    smoke: Smoke
    evaluation: dict[str, Any]
    model_config: dict[str, Any]  # the export's config.json
    weight_bytes: int  # its *.safetensors files, as the export's marker lists them


# vLLM's default share of each GPU's memory for weights, activations and the KV cache (vllm/config CacheConfig
# gpu_memory_utilization = 0.9; LMI passes OPTION_GPU_MEMORY_UTILIZATION through, unset here).
GPU_MEMORY_UTILIZATION = 0.9
# What this project keeps aside per GPU for the CUDA context, activations and CUDA graphs before the KV cache: a
# margin of ours, not a published figure (vLLM measures it by profiling at start-up).
RESERVE_BYTES_PER_GPU = 2 * 2**30
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def max_model_len(config: dict[str, Any], weight_bytes: int, gpus: int, gpu_memory_gib: float) -> int:
    """The longest sequence whose KV cache fits beside the weights on `gpus` GPUs (tensor parallel over all of
    them), at most the model's context (max_position_embeddings). vLLM refuses to start when one sequence of its
    max_model_len does not fit the KV cache ("larger than the maximum number of tokens that can be stored in KV
    cache"), which an unset length (the model's 131,072 for Llama 3.1) does on an A10G. 0: the weights alone do
    not fit."""
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    per_token = (
        2 * int(config["num_hidden_layers"]) * int(config.get("num_key_value_heads", heads)) * head_dim
    )
    per_token *= DTYPE_BYTES.get(dtype, 2)
    budget = gpus * (gpu_memory_gib * 2**30 * GPU_MEMORY_UTILIZATION - RESERVE_BYTES_PER_GPU) - weight_bytes
    if budget <= 0:
        return 0
    return min(int(config["max_position_embeddings"]), int(budget // per_token))


def run_prefix(found: Found) -> tuple[str, str]:
    """(bucket, run prefix) of a version in S3: s3://bucket/<run>/checkpoints/iter_N -> (bucket, <run>)."""
    bucket, _, key = found.location.removeprefix("s3://").partition("/")
    run, _, _ = key.rpartition(f"/{CHECKPOINTS}/")
    return bucket, run


def smoke_of(evaluation: dict[str, Any]) -> Smoke | None:
    """The first generation task's smoke answer in an evaluation entry ({"name", "added", "results"}:
    trainer/checkpoint/version.py add_evaluation)."""
    for task in ((evaluation.get("results") or {}).get("generation") or {}).values():
        if isinstance(task, dict) and isinstance(task.get("smoke"), dict):
            s = task["smoke"]
            return Smoke(
                str(s["prompt"]), str(s["answer"]), int(s["max_new_tokens"]), list(s.get("stop") or [])
            )
    return None


def check(found: Found, s3: Any) -> tuple[Ready | None, list[str]]:
    """The version ready to deploy, or the list of what it lacks (each naming what would supply it)."""
    version = found.record.version
    missing: list[str] = []
    evaluations = [e for e in found.evaluations if smoke_of(e) is not None]
    if not found.evaluations:
        missing.append(
            f"an evaluation: none beside {found.location}; run `make finetune` (its evaluate stage) or "
            "`python -m trainer evaluate --record NAME`"
        )
    elif not evaluations:
        missing.append(
            f"an evaluation with a generation task: {len(found.evaluations)} evaluation(s) beside "
            f"{found.location} but none recorded a greedy answer for the smoke check; evaluate it on a suite "
            "with a generation task"
        )
    bucket, run = run_prefix(found)
    marker_key = f"{run}/{EXPORT}/{version}{EXPORT_MARKER_SUFFIX}"
    prefix = f"{run}/{EXPORT}/{version}/"
    try:
        marker = json.loads(s3.get_object(Bucket=bucket, Key=marker_key)["Body"].read())
    except ClientError as error:
        if error.response["Error"]["Code"] not in ("NoSuchKey", "404"):
            raise
        missing.append(
            f"a complete export: no s3://{bucket}/{marker_key}; run the export stage (`make finetune`) and "
            "wait for FSx to export it"
        )
    else:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        present = {o["Key"].removeprefix(prefix): o["Size"] for p in pages for o in p.get("Contents", [])}
        short = [
            f"{name} ({'absent' if name not in present else f'{present[name]} of {size} bytes'})"
            for name, size in sorted(marker["files"].items())
            if present.get(name) != size
        ]
        if short:
            missing.append(
                f"a complete export: s3://{bucket}/{prefix} lacks {', '.join(short[:5])}"
                + (f" and {len(short) - 5} more" if len(short) > 5 else "")
            )
    if missing:
        return None, missing
    evaluation = evaluations[-1]
    smoke = smoke_of(evaluation)
    assert smoke is not None
    config = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}config.json")["Body"].read())
    weights = sum(size for name, size in marker["files"].items() if name.endswith(".safetensors"))
    return Ready(version, f"s3://{bucket}/{prefix}", smoke, evaluation, config, weights), []
