"""The baseline row of `make bench-gpu`: the same model shape trained by the plain transformers loop a user would
write in twenty lines, in its own process on the same GPU, in the same run.

`LlamaForCausalLM` built from the trainer's model config (trainer/interop/hf.py to_hf_config, the converter's
mapping), torch SDPA attention (`attn_implementation="sdpa"`), fp32 master weights under bf16 autocast (fp32
throughout when the trainer's config is fp32), torch's
fused AdamW, the config's global batch in micro-batches of the trainer pass's size with gradient accumulation.
Tokens are random ids of the vocabulary: a step's time does not depend on their values. Writes the median step
time and the peak allocated memory to OUT (JSON); the caller turns them into tokens/s and MFU by the trainer's
formula.

    python -m trainer.bench.hf_baseline CONFIG OUT --micro-batch-size M --steps N [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from trainer.config import load_config
from trainer.interop.hf import to_hf_config
from trainer.plan.search import vocab_size

WARMUP_STEPS = 2  # kernel selection, the allocator's first blocks, AdamW's states


def train_steps(config: Path, overrides: list[str], micro_batch_size: int, steps: int) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = load_config(config, overrides)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    vocabulary = vocab_size(cfg)
    model_cfg = cfg.model.model_copy(update={"vocab_size": vocabulary})
    hf = to_hf_config(model_cfg, None, torch.float32, cfg.data.seq_length)
    with torch.device(device):  # initialized where it trains: 1.24 B parameters take seconds on a CPU
        # transformers 5.24 configuration_utils.py PreTrainedConfig takes attn_implementation among its kwargs
        model = LlamaForCausalLM(LlamaConfig(**hf, attn_implementation="sdpa"))
    # fused=True: one kernel for every parameter (torch docs, torch.optim.AdamW; CPU and CUDA since torch 2.4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optimizer.lr, fused=True)
    accumulation = cfg.schedule.global_batch_size // micro_batch_size
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    shape = (micro_batch_size, cfg.data.seq_length)
    batches = [
        torch.randint(0, vocabulary, shape, device=device, generator=generator) for _ in range(accumulation)
    ]
    seconds = []
    for step in range(WARMUP_STEPS + steps):
        _synchronize(device)
        started = time.perf_counter()
        for tokens in batches:
            with torch.autocast(device, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
                loss = model(input_ids=tokens, labels=tokens).loss / accumulation
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _synchronize(device)
        if step >= WARMUP_STEPS:
            seconds.append(time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    return {
        "step_seconds": statistics.median(seconds),
        "micro_batch_size": micro_batch_size,
        "global_batch_size": cfg.schedule.global_batch_size,
        "seq_length": cfg.data.seq_length,
        "peak_memory_bytes": peak,
        "attention": "sdpa",
        "precision": cfg.precision,
    }


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m trainer.bench.hf_baseline")
    parser.add_argument("config", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--micro-batch-size", type=int, required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    result = train_steps(args.config, args.overrides, args.micro_batch_size, args.steps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
