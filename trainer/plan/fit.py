"""Before the first step: does the planner's peak (trainer/plan/memory.py) fit the device's free memory?

A run that does not fit is refused with the estimate, the free memory, and the changes that would fit (a smaller
micro-batch, recompute, a larger TP or PP), instead of an out-of-memory traceback minutes into the run.
`largest_micro_batch` is the same arithmetic for `bench --gpu`, which picks the largest micro-batch that fits.
"""

from __future__ import annotations

from trainer.config import TrainConfig
from trainer.model.flops import Kernels
from trainer.plan.memory import estimate_memory

GIB = 2**30
# Of the free memory, what tensors may use: the caching allocator reserves whole blocks, so its reserved memory
# runs ahead of the allocated bytes the planner models.
USABLE_FRACTION = 0.95


class DeviceMemoryError(Exception):
    """The layout's estimated peak does not fit the device's free memory; the message says what would."""


def usable_bytes(free_bytes: float) -> float:
    return free_bytes * USABLE_FRACTION


def _with(cfg: TrainConfig, *, micro_batch_size: int | None = None, **parallel) -> TrainConfig:
    schedule = cfg.schedule
    if micro_batch_size is not None:
        schedule = schedule.model_copy(update={"micro_batch_size": micro_batch_size})
    return cfg.model_copy(update={"parallel": cfg.parallel.model_copy(update=parallel), "schedule": schedule})


def _peak(cfg: TrainConfig, world_size: int, padded_vocab_size: int, kernels: Kernels) -> float:
    return estimate_memory(cfg, world_size, padded_vocab_size, kernels).total


def micro_batch_sizes(cfg: TrainConfig, world_size: int) -> list[int]:
    """Micro-batch sizes that divide this layout's share of the global batch, largest first."""
    p = cfg.parallel
    dp = world_size // (
        p.tensor_model_parallel_size * p.pipeline_model_parallel_size * p.context_parallel_size
    )
    per_replica = cfg.schedule.global_batch_size // max(dp, 1)
    return [size for size in range(per_replica, 0, -1) if per_replica % size == 0]


def largest_micro_batch(
    cfg: TrainConfig, world_size: int, padded_vocab_size: int, kernels: Kernels, free_bytes: float
) -> int | None:
    """The largest micro-batch (dividing the global batch's share) whose estimated peak fits; None: not even 1."""
    for size in micro_batch_sizes(cfg, world_size):
        candidate = _with(cfg, micro_batch_size=size)
        if _peak(candidate, world_size, padded_vocab_size, kernels) <= usable_bytes(free_bytes):
            return size
    return None


def _alternatives(
    cfg: TrainConfig, world_size: int, padded_vocab_size: int, kernels: Kernels
) -> list[tuple[str, TrainConfig, int]]:
    """Single changes to try, each with the config it makes and the devices it needs."""
    p, m = cfg.parallel, cfg.model
    options = []
    for size in micro_batch_sizes(cfg, world_size):
        if size < cfg.schedule.micro_batch_size:
            options.append(
                (f"schedule.micro_batch_size={size}", _with(cfg, micro_batch_size=size), world_size)
            )
    for recompute in ("selective", "full"):
        if p.recompute != recompute and not (p.recompute == "full" and recompute == "selective"):
            options.append((f"parallel.recompute={recompute}", _with(cfg, recompute=recompute), world_size))
    tp = p.tensor_model_parallel_size * 2
    if m.num_attention_heads % tp == 0 and m.query_groups % tp == 0:
        devices = (
            world_size
            if world_size % (tp * p.pipeline_model_parallel_size * p.context_parallel_size) == 0
            else 0
        )
        options.append(
            (f"parallel.tensor_model_parallel_size={tp}", _with(cfg, tensor_model_parallel_size=tp), devices)
        )
    pp = p.pipeline_model_parallel_size * 2
    if m.num_layers % (pp * p.virtual_pipeline_model_parallel_size) == 0:
        devices = (
            world_size
            if world_size % (p.tensor_model_parallel_size * pp * p.context_parallel_size) == 0
            else 0
        )
        options.append(
            (
                f"parallel.pipeline_model_parallel_size={pp}",
                _with(cfg, pipeline_model_parallel_size=pp),
                devices,
            )
        )
    resolved = []
    for change, candidate, devices in options:
        if devices == 0:  # this world cannot hold the layout: the smallest one that can
            c = candidate.parallel
            devices = c.tensor_model_parallel_size * c.pipeline_model_parallel_size * c.context_parallel_size
        resolved.append((change, candidate, devices))
    return resolved


def fit_problem(
    cfg: TrainConfig,
    world_size: int,
    padded_vocab_size: int,
    kernels: Kernels,
    free_bytes: float,
    device: str = "the GPU",
) -> str | None:
    """None when the estimated peak fits `free_bytes`; otherwise one message: the estimate, the free memory and
    each single change (with its estimate) that fits."""
    estimate = estimate_memory(cfg, world_size, padded_vocab_size, kernels)
    usable = usable_bytes(free_bytes)
    if estimate.total <= usable:
        return None
    fits, micro_batch_named = [], False
    for change, candidate, devices in _alternatives(cfg, world_size, padded_vocab_size, kernels):
        is_micro_batch = change.startswith("schedule.micro_batch_size")
        if is_micro_batch and micro_batch_named:
            continue  # the largest micro-batch that fits is the one to name
        peak = _peak(candidate, devices, padded_vocab_size, kernels)
        if peak <= usable:
            micro_batch_named |= is_micro_batch
            on = "" if devices == world_size else f" on {devices} GPUs"
            fits.append(f"{change}{on} ({peak / GIB:.1f} GiB)")
    advice = (
        "changes that fit: " + "; ".join(fits)
        if fits
        else "no single change of micro-batch, recompute, TP or PP fits; combine them (python -m trainer plan "
        "searches layouts)"
    )
    return (
        f"the estimated peak memory of this layout is {estimate.total / GIB:.1f} GiB per GPU (pipeline rank "
        f"{estimate.pipeline_rank}, at the {estimate.moment}; kernels {kernels!r}), more than {device}'s "
        f"{free_bytes / GIB:.1f} GiB free ({USABLE_FRACTION:.0%} usable: {usable / GIB:.1f} GiB); {advice}"
    )


def check_device_memory(cfg: TrainConfig, world_size: int, padded_vocab_size: int, kernels: Kernels) -> None:
    """On GPUs: refuse, on every rank alike, a layout whose estimated peak exceeds the least free memory of any
    rank's GPU (measured after the CUDA context, before the model is built). Nothing to check on CPUs."""
    import torch

    if not torch.cuda.is_available():
        return
    free, _ = (
        torch.cuda.mem_get_info()
    )  # torch docs, torch.cuda.mem_get_info: (free, total) bytes of the device
    least = torch.tensor([free], dtype=torch.int64, device="cuda")
    torch.distributed.all_reduce(least, op=torch.distributed.ReduceOp.MIN)
    problem = fit_problem(
        cfg,
        world_size,
        padded_vocab_size,
        kernels,
        float(least.item()),
        f"cuda:{torch.cuda.current_device()}",
    )
    if problem is not None:
        raise DeviceMemoryError(problem)
