"""All-reduce bus bandwidth over message sizes, as nccl-tests reports it, on every process torchrun started.

    python -m trainer.distributed.torchrun --standalone --nproc-per-node=N -m trainer.bench.allreduce OUT.json

NCCL on GPUs, gloo on CPUs (the same code). For each size: the mean time of a few all-reduces (sum, float32),
algorithm bandwidth = bytes / time, bus bandwidth = algbw x 2 (n-1)/n, the traffic each rank's links carry in a
ring (nccl-tests' definition, comparable across GPU counts). On one GPU n = 1: the all-reduce moves nothing
between GPUs (NCCL only copies the buffer), so its bus bandwidth is 0 by definition and algbw measures a
device-memory copy.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch


def sweep(max_bytes: int, iterations: int) -> list[dict]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    world = torch.distributed.get_world_size()
    rows = []
    size = 1 << 20
    while size <= max_bytes:
        tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(2):  # warm-up: NCCL sets up its channels on the first call of a size
            torch.distributed.all_reduce(tensor)
        _synchronize()
        started = time.perf_counter()
        for _ in range(iterations):
            torch.distributed.all_reduce(tensor)
        _synchronize()
        seconds = (time.perf_counter() - started) / iterations
        algbw = size / seconds / 1e9
        rows.append(
            {
                "bytes": size,
                "seconds": seconds,
                "algbw_gbytes_per_s": algbw,
                "busbw_gbytes_per_s": algbw * 2 * (world - 1) / world,
            }
        )
        size *= 4
    return rows


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    torch.distributed.barrier()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m trainer.bench.allreduce")
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--iterations", type=int, default=10)
    args = parser.parse_args()
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.distributed.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    try:
        rows = sweep(args.max_bytes, args.iterations)
        if torch.distributed.get_rank() == 0:
            result = {
                "world_size": torch.distributed.get_world_size(),
                "backend": torch.distributed.get_backend(),
                "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                "sizes": rows,
            }
            args.out.write_text(json.dumps(result, indent=1))
    finally:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
