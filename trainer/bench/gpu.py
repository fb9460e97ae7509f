"""The GPU suite (`make bench-gpu`), for whoever has a GPU: training of a ~1B Llama at sequence 4096 on one GPU
through the real trainer (the same bench worker as the CPU suite), tokens/s and MFU against the GPU's catalog
dense bf16 peak, its measured peak memory against the planner's; against the same shape trained by a plain
transformers loop with SDPA attention in the same run (trainer/bench/hf_baseline.py); the background save's stall
against a synchronous save and its write speed; and an all-reduce bus-bandwidth sweep over the machine's GPUs
("n/a on one device"); written to <out>/bench-gpu.json.

Which training passes run (`gpu_passes`): with TransformerEngine installed, the production path: the TE layer
spec with its fused attention and the fused kernels (`fusion.*`), in bf16 and, on GPUs with FP8 tensor cores, in
FP8 (MXFP8 on Blackwell, tensorwise elsewhere), each MFU printed. Without it (GPU machines lent for tests have
torch but no TE), one bf16 pass on megatron-core's local spec with torch SDPA attention (trainer/model/
attention.py): every figure is labelled with that spec and kernel and is never presented as production MFU. Each
pass runs at the config's micro-batch if the planner says it fits the GPU, else at the largest that does. The
cut-offs below keep the suite under 8 minutes on one H200 (with make train's corpus already prepared).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.bench.report import add_memory_results, add_result, machine
from trainer.bench.training import (
    ROOT,
    BenchError,
    Layout,
    checkpoint_throughput,
    run_worker,
    steady_blocking,
    step_seconds,
    tokens_per_s,
)
from trainer.data.prepare import default_workers, prepare_dataset
from trainer.distributed import fast_path
from trainer.distributed.torchrun import Rendezvous, torchrun
from trainer.metrics import peak_tflops_per_device
from trainer.model.flops import Kernels, model_flops_per_sequence
from trainer.plan.fit import fit_problem, largest_micro_batch
from trainer.plan.search import vocab_size

GPU_CONFIG = Path("trainer/configs/bench-gpu.yaml")
# On one H200 (the GPU report: 1.24 B at 0.67 s a step; 17 GB saves): the first pass starts, builds, runs 2 traced
# and 20 timed steps (~60 s), a synchronous save, its load and 3 background saves (~90 s at 1-2 GB/s); a later
# pass has no saves (~60 s); the baseline builds and runs 12 steps (~30 s). Cut-offs at about twice those, and
# with TE's two passes 220 + 120 + 60 + 60 = 460 s < 8 minutes (tests/bench/test_gpu_suite.py).
FIRST_PASS_TIMEOUT_S = 220
PASS_TIMEOUT_S = 120
BASELINE_TIMEOUT_S = 60
BASELINE_STEPS = 10
ALLREDUCE_TIMEOUT_S = 60
CPU_TIMEOUT_S = 600  # the suite's own test on a shared CPU: the cut-offs above size an H200 run, not that


def _cutoff(seconds: int) -> int:
    return seconds if torch.cuda.is_available() else CPU_TIMEOUT_S


CUDA_CONTEXT_BYTES = 1 << 30  # kept aside for each process's CUDA context and its libraries' workspaces
FUSED = ("fusion.gradient_accumulation_fusion=true", "fusion.cross_entropy_loss_fusion=true")


@dataclass(frozen=True)
class GpuPass:
    name: str
    overrides: tuple[str, ...]
    label: str  # the layer spec and attention kernel that produced the figures
    production: bool  # the path the recipes train with (TransformerEngine)


def gpu_passes(transformer_engine: bool, compute_capability: tuple[int, int]) -> list[GpuPass]:
    """The training passes this machine can run: TE bf16 (+ FP8 where the GPU has it), else the local spec."""
    if not transformer_engine:
        return [
            GpuPass(
                "local-bf16",
                (),
                "local spec (megatron-core plain-torch layers), torch SDPA attention (trainer/model/attention.py), "
                "bf16; NOT the production path (no TransformerEngine here)",
                False,
            )
        ]
    passes = [GpuPass("te-bf16", FUSED, "TransformerEngine spec, TE fused attention, bf16", True)]
    if compute_capability >= (8, 9):  # FP8 tensor cores: Ada/Hopper and later
        recipe = "mxfp8" if compute_capability >= (10, 0) else "tensorwise"
        passes.append(
            GpuPass(
                f"te-fp8-{recipe}",
                (*FUSED, "fp8.format=hybrid", f"fp8.recipe={recipe}"),
                f"TransformerEngine spec, TE fused attention, FP8 ({recipe}) GEMMs",
                True,
            )
        )
    return passes


def fitting_micro_batch(config: Path, gpu_pass: GpuPass, processes: int, transformer_engine: bool) -> int:
    """The config's micro-batch if the planner says it fits the GPU, else the largest that does (trainer/plan/
    fit.py); on CPUs (the suite's own test) the config's."""
    from trainer.config import load_config

    cfg = load_config(config, list(gpu_pass.overrides))
    if not torch.cuda.is_available():
        return cfg.schedule.micro_batch_size
    # The whole device less the CUDA context (about half a GiB): read without creating a context here, which
    # would stay and take memory from the workers.
    free = torch.cuda.get_device_properties(0).total_memory - CUDA_CONTEXT_BYTES
    kernels: Kernels = "transformer_engine" if transformer_engine else "local"
    if fit_problem(cfg, processes, vocab_size(cfg), kernels, free) is None:
        return cfg.schedule.micro_batch_size
    fits = largest_micro_batch(cfg, processes, vocab_size(cfg), kernels, free)
    if fits is None:
        raise BenchError(fit_problem(cfg, processes, vocab_size(cfg), kernels, free))
    return fits


def add_checkpoint_stall(report: dict, run, pass_name: str) -> None:
    """The background save's stall against the synchronous save's, and the synchronous save's write speed."""
    saved = checkpoint_throughput(run)
    report["details"]["checkpoint"] = saved
    size = f"{saved['bytes'] / 1e9:.1f} GB"
    add_result(
        report,
        f"checkpoint stall per background save, steady state, {pass_name} ({size})",
        "s",
        steady_blocking(saved),
        "synchronous save",
        saved["save_seconds"],
    )
    add_result(
        report, f"checkpoint save write speed ({size})", "GB/s", saved["save_gbytes_per_s"], "n/a", None
    )


def _run_part(command: list[str], timeout_s: int, what: str) -> None:
    """One part of the suite in its own process (its cut-off applies on GPUs); BenchError with its output's tail."""
    result = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=False,
        timeout=_cutoff(timeout_s),
    )
    if result.returncode != 0:
        raise BenchError(f"{what} failed ({result.returncode}):\n{(result.stdout + result.stderr)[-4000:]}")


def add_baseline(
    report: dict,
    config: Path,
    out: Path,
    gpu_pass: GpuPass,
    micro_batch: int,
    trainer_tokens_per_s: float,
    flops_per_step: float,
    peak: float | None,
) -> None:
    """The transformers SDPA loop at the same shape and micro-batch (trainer/bench/hf_baseline.py), its MFU by
    the trainer's formula, and the trainer's tokens/s against it."""
    path = out / "baseline" / "transformers-sdpa.json"
    command = [sys.executable, "-m", "trainer.bench.hf_baseline", str(config), str(path)]
    command += ["--micro-batch-size", str(micro_batch), "--steps", str(BASELINE_STEPS)]
    command += [
        arg for override in gpu_pass.overrides if "fusion." not in override for arg in ("--set", override)
    ]
    _run_part(command, BASELINE_TIMEOUT_S, "the transformers baseline")
    baseline = json.loads(path.read_text())
    report["details"]["baseline"] = baseline
    sequences = baseline["global_batch_size"]
    tokens = sequences * baseline["seq_length"] / baseline["step_seconds"]
    achieved = flops_per_step / baseline["step_seconds"] / 1e12
    add_result(
        report,
        "transformers LlamaForCausalLM loop, SDPA attention, same shape and micro-batch (ratio: MFU)",
        "tokens/s",
        tokens,
        "at the catalog's dense bf16 peak",
        tokens / achieved * peak if peak else 0.0,
    )
    add_result(
        report,
        f"trainer {gpu_pass.name} tokens/s against the transformers SDPA loop (goal: 1.3x)",
        "tokens/s",
        trainer_tokens_per_s,
        "transformers SDPA loop, same run",
        tokens,
    )


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
    report: dict[str, Any] = {
        "machine": machine(),
        "config": str(config),
        "results": [],
        "details": {"training": {}},
    }
    flops = (
        model_flops_per_sequence(cfg.model, cfg.data.seq_length, vocab_size(cfg))
        * cfg.schedule.global_batch_size
    )
    peak = peak_tflops_per_device(cfg.logging.peak_tflops_per_device)
    runs = []
    transformer_engine, capability = fast_path.accelerator() if torch.cuda.is_available() else (False, (0, 0))
    for index, gpu_pass in enumerate(gpu_passes(transformer_engine, capability)):
        micro_batch = fitting_micro_batch(config, gpu_pass, processes, transformer_engine)
        overrides = (*gpu_pass.overrides, f"schedule.micro_batch_size={micro_batch}")
        layout = Layout(gpu_pass.name, processes, overrides)
        first = index == 0  # the first pass also times the checkpoint saves of this model
        run = run_worker(
            config,
            layout,
            out / "runs",
            steps=steps,
            timeout_s=_cutoff(FIRST_PASS_TIMEOUT_S if first else PASS_TIMEOUT_S),
            checkpoint=first,
            checkpoint_keep_last=1 if first else None,  # 17 GB a save at 1.24 B: one kept, not four
            background_saves=3,  # plan, check, one steady-state save: 17 GB each
        )
        runs.append(run)
        if first:
            add_checkpoint_stall(report, run, gpu_pass.name)
            add_baseline(report, config, out, gpu_pass, micro_batch, tokens_per_s(run), flops, peak)
        achieved = flops / step_seconds(run) / processes / 1e12
        report["details"]["training"][gpu_pass.name] = {
            "spec": gpu_pass.label,
            "production": gpu_pass.production,
            "kernels": run.ranks[0]["kernels"],
            "micro_batch_size": micro_batch,
            "step_seconds": step_seconds(run),
            "tflops_per_device": achieved,
            "peak_tflops": peak,
        }
        # Tokens/s at the peak: the ratio is the model FLOPs utilization (MFU), labelled with what produced it.
        at_peak = tokens_per_s(run) / achieved * peak if peak else 0.0
        add_result(
            report,
            f"training tokens/s, {gpu_pass.label} (ratio: {'MFU' if gpu_pass.production else 'local-spec MFU'})",
            "tokens/s",
            tokens_per_s(run),
            "at the catalog's dense bf16 peak",
            at_peak,
        )
    add_memory_results(report, runs)

    add_allreduce(report, out, allreduce_processes or torch.cuda.device_count(), allreduce_max_bytes)
    return report


def add_allreduce(report: dict, out: Path, devices: int, max_bytes: int) -> None:
    """The all-reduce sweep's bus bandwidth at its largest size; on one device, n/a (nothing to reduce with)."""
    if devices < 2:
        report["details"]["allreduce"] = {"world_size": devices, "sizes": []}
        add_result(report, "all-reduce bus bandwidth, 1 device", "GB/s", None, "n/a on one device", None)
        return
    sweep = allreduce_sweep(out / "allreduce.json", devices, max_bytes)
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


def allreduce_sweep(path: Path, processes: int, max_bytes: int) -> dict:
    single_node = Rendezvous(nnodes=1, node_rank=0, master_addr=None)
    command = [*torchrun(), *single_node.torchrun_args(processes, 0, 0)]
    command += ["-m", "trainer.bench.allreduce", str(path), "--max-bytes", str(max_bytes)]
    path.parent.mkdir(parents=True, exist_ok=True)
    _run_part(command, ALLREDUCE_TIMEOUT_S, "all-reduce sweep")
    return json.loads(path.read_text())
