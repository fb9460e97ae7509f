"""The GPU suite (`make bench-gpu`), for whoever has a GPU: bf16 training of a ~1B Llama at sequence 4096 on one
GPU through the real trainer (the same bench worker as the CPU suite), tokens/s and MFU against the GPU's
catalog peak, its measured peak memory against the planner's, and an all-reduce bus-bandwidth sweep over the
machine's GPUs (on one GPU: see trainer/bench/allreduce.py for what that measures). About 2-3 minutes on one
H200 with the defaults; written to <out>/bench-gpu.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from trainer.bench.command import add_memory_results, add_result, machine
from trainer.bench.training import ROOT, BenchError, Layout, run_worker, step_seconds, tokens_per_s
from trainer.data.prepare import default_workers, prepare_dataset
from trainer.launch.batch import Rendezvous
from trainer.metrics import peak_tflops_per_device
from trainer.model.flops import model_flops_per_sequence
from trainer.plan.search import vocab_size

GPU_CONFIG = Path("trainer/configs/bench-gpu.yaml")


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise BenchError(
            "make bench-gpu needs a CUDA GPU and a CUDA build of torch; this machine has none "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False). make bench runs the CPU suite."
        )


def run_gpu_suite(
    config: Path,
    out: Path,
    *,
    steps: int,
    processes: int = 1,
    allreduce_processes: int | None = None,
    allreduce_max_bytes: int = 1 << 30,
) -> dict:
    """Train `config` on `processes` devices for `steps` timed steps, then sweep all-reduce over every device
    (or `allreduce_processes` of them)."""
    from trainer.config import load_config

    cfg = load_config(config)
    if not Path(f"{cfg.data.prefixes[0]}.bin").exists():  # make train's corpus, prepared once
        prepare_dataset([], cfg.data.prefixes[0], stdlib=True, workers=default_workers())
    report = {"machine": machine(), "config": str(config), "results": [], "details": {}}
    run = run_worker(config, Layout("gpu-train", processes, ()), out / "runs", steps=steps)
    flops = (
        model_flops_per_sequence(cfg.model, cfg.data.seq_length, vocab_size(cfg))
        * cfg.schedule.global_batch_size
    )
    achieved = flops / step_seconds(run) / processes / 1e12
    peak = peak_tflops_per_device(cfg.logging.peak_tflops_per_device)
    report["details"]["training"] = {
        "step_seconds": step_seconds(run),
        "tflops_per_device": achieved,
        "peak_tflops": peak,
    }
    # Tokens/s at the peak: the ratio is the model FLOPs utilization (MFU).
    at_peak = tokens_per_s(run) / achieved * peak if peak else 0.0
    add_result(
        report,
        "training tokens/s (ratio: MFU)",
        "tokens/s",
        tokens_per_s(run),
        "at the catalog's dense bf16 peak",
        at_peak,
    )
    add_memory_results(report, [run])

    devices = allreduce_processes or torch.cuda.device_count()
    sweep = allreduce_sweep(out / "allreduce.json", devices, allreduce_max_bytes)
    report["details"]["allreduce"] = sweep
    largest = sweep["sizes"][-1]
    add_result(
        report,
        f"all-reduce bus bandwidth, {largest['bytes'] >> 20} MiB, {devices} device(s)",
        "GB/s",
        largest["busbw_gbytes_per_s"],
        "algorithm bandwidth",
        largest["algbw_gbytes_per_s"],
    )
    return report


def allreduce_sweep(path: Path, processes: int, max_bytes: int) -> dict:
    single_node = Rendezvous(nnodes=1, node_rank=0, master_addr=None)
    command = [sys.executable, "-m", "torch.distributed.run", *single_node.torchrun_args(processes, 0, 0)]
    command += ["-m", "trainer.bench.allreduce", str(path), "--max-bytes", str(max_bytes)]
    path.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=False,
    )
    if result.returncode != 0:
        raise BenchError(
            f"all-reduce sweep failed ({result.returncode}):\n{(result.stdout + result.stderr)[-4000:]}"
        )
    return json.loads(path.read_text())
