"""One process of a measured training run, started by torchrun: the production build and step, instrumented.

    python -m trainer.distributed.torchrun --standalone --nproc-per-node=N -m trainer.bench.worker \
        CONFIG OUT [--set key=value ...] [--steps N] [--load CHECKPOINT]
        [--checkpoint [--checkpoint-keep-last N] [--background-saves N]]

Each rank writes OUT/rank<R>.json with
- memory: bytes of the weights, the gradient buffers and everything else allocated before the second step
  (optimizer states), and the peak of that second step, from an allocation trace of the build and the first two
  steps (trainer/bench/allocations.py); Adam's states exist from the first step on, so the second is the steady
  state;
- steps: the wall time of each further step and the seconds this rank spent inside pipeline send/receive calls,
  which is where a stage waits for its neighbours (the pipeline's idle time, transfers included);
- checkpoint (with --checkpoint): seconds to save and to load the run's checkpoint, and its bytes; the stall of a
  background save (trainer/bench/checkpointing.py);
- load (with --load): seconds to load a checkpoint saved at another layout.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from megatron.core import parallel_state
from rich.console import Console

from trainer.bench.allocations import AllocationTrace
from trainer.bench.checkpointing import BACKGROUND_SAVES, time_checkpoint, time_load
from trainer.config import ParallelDims, load_config
from trainer.data.tokenizer import with_resolved_model
from trainer.device import device_type
from trainer.distributed import parallel
from trainer.engines import megatron
from trainer.model import attention
from trainer.model.llama import HAVE_TRANSFORMER_ENGINE

TRACED_STEPS = 2


class PipelineWaits:
    """Wall time spent in megatron-core's pipeline send/receive (trainer/distributed/parallel.py on_pipeline_wait)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        parallel.on_pipeline_wait(self.add)

    def add(self, seconds: float) -> None:
        self.seconds += seconds


def kernels() -> str:
    """The planner's name for the layer implementation this process runs (trainer/model/llama.py picks it)."""
    backend = attention.core_attention_backend(device_type(), HAVE_TRANSFORMER_ENGINE)
    return attention.PLANNER_KERNELS[backend]


def _storage_bytes(tensors) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def measure_memory(run: megatron.MegatronEngine, trace: AllocationTrace) -> dict:
    weights = _storage_bytes(p for chunk in run.chunks for p in chunk.parameters())
    gradients = _storage_bytes(b.grad_data for chunk in run.chunks for b in chunk.buffers)
    steady = trace.phases("step")[-1]
    static = trace.allocated_at(steady.start_ns)
    return {
        "weights": weights,
        "gradients": gradients,
        "optimizer_states": static - weights - gradients,
        "static": static,
        "peak": trace.peak_during(steady),
        "peak_in_optimizer_step": trace.peak_during(trace.phases("optimizer")[-1]),
    }


def measure(
    cfg,
    dims: ParallelDims,
    steps: int,
    save_checkpoint: bool,
    load: Path | None = None,
    checkpoint_keep_last: int | None = None,
    background_saves: int = BACKGROUND_SAVES,
) -> dict:
    device = device_type()
    waits = PipelineWaits()
    with AllocationTrace(device) as trace:
        with trace.phase("build"):
            run = megatron.build(with_resolved_model(cfg), dims)
        step_optimizer = run.apply_gradients  # clip and AdamW (the gradients are prepared already)

        def traced_optimizer_step(grad_norm):
            with trace.phase("optimizer"):
                return step_optimizer(grad_norm)

        run.apply_gradients = traced_optimizer_step  # type: ignore[method-assign]  # traced, this instance only
        batches = run.train_batches(0)
        for _ in range(TRACED_STEPS):
            with trace.phase("step"):
                run.train_step(batches)
    run.apply_gradients = step_optimizer  # type: ignore[method-assign]  # the engine's own step back
    result = {
        "rank": torch.distributed.get_rank(),
        "pipeline_rank": parallel_state.get_pipeline_model_parallel_rank(),
        "kernels": kernels(),
        "memory": measure_memory(run, trace),
        "steps": [],
    }
    for _ in range(steps):
        torch.distributed.barrier()
        waits.seconds = 0.0
        started = time.perf_counter()
        run.train_step(batches)
        result["steps"].append(
            {"seconds": time.perf_counter() - started, "pipeline_wait_seconds": waits.seconds}
        )
    if save_checkpoint:
        result["checkpoint"] = time_checkpoint(
            run, batches, TRACED_STEPS, checkpoint_keep_last, background_saves
        )
    if load is not None:
        result["load"] = time_load(run, load)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m trainer.bench.worker")
    parser.add_argument("config")
    parser.add_argument("out", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--steps", type=int, default=0, help="timed steps after the two traced ones")
    parser.add_argument(
        "--checkpoint", action="store_true", help="time checkpoint saves (synchronous, background) and a load"
    )
    parser.add_argument("--load", type=Path, help="time loading this checkpoint (saved at another layout)")
    parser.add_argument(
        "--checkpoint-keep-last", type=int, help="checkpoints kept while timing saves (default: all of them)"
    )
    parser.add_argument(
        "--background-saves",
        type=int,
        default=BACKGROUND_SAVES,
        help=f"background saves timed after the synchronous one (default {BACKGROUND_SAVES})",
    )
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    dims = parallel.initialize(cfg)
    Console(stderr=True, quiet=torch.distributed.get_rank() != 0).print(f"bench worker: {cfg.name} at {dims}")
    try:
        result = measure(
            cfg,
            dims,
            args.steps,
            args.checkpoint,
            args.load,
            args.checkpoint_keep_last,
            args.background_saves,
        )
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"rank{result['rank']}.json").write_text(json.dumps(result, indent=1))
    finally:
        parallel.shutdown()


if __name__ == "__main__":
    main()
