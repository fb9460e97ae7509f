"""Every layout `train` accepts for a config on N nodes of an instance type, estimated and ranked.

A layout is a value for each of trainer/config/load.py's LAYOUT_KEYS. The keys the search may change are the free
ones (those the config marks `auto`, or all of them); the others keep the config's value. Each candidate passes
`layout_problems` (the check `train` runs before starting), with TP inside a node; sequence parallelism is on
whenever TP > 1 (less activation memory for the same communication volume). When both TP and PP are free, the
search also tries `engine: deepspeed` (data parallel only): ZeRO stage 1, 2 and 3, with the optimizer states
offloaded to the host (stage 2 and 3) and the weights too (stage 3), at each micro-batch size and recompute; its
layout adds the keys `engine` and `zero.*` (ZERO_KEYS). Ranked: layouts that fit first, then by step time, then by
memory, so DeepSpeed wins where megatron's layouts do not fit, or fit only slower.

The GPU fast path (docs/trainer.md), where its keys are free: context parallelism over the divisors of the GPUs a
TP group leaves (each sequence cut into 2 x CP equal chunks); recompute as none, selective, full of every layer,
and partial full recompute of 1/4, 1/2 and 3/4 of each chunk's layers (`recompute_method: block`); FP8 off and on
where the GPU has FP8 tensor cores (the recipe: the config's when the GPU runs it, else the catalog's first for
the GPU: MXFP8 on Blackwell, tensorwise current scaling on Hopper). The overlaps are modelled as communication
hidden behind compute, never slower, so a free overlap key is on wherever it applies: the DP gradient reduce
(DP x CP > 1), the weight all-gather (with the distributed optimizer) and TP communication (with sequence
parallelism).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from trainer.config import (
    LAYOUT_KEYS,
    ConfigError,
    FP8Config,
    FusionConfig,
    ParallelConfig,
    ParallelDims,
    TrainConfig,
    ZeroConfig,
    consistency_problems,
    layout_problems,
)
from trainer.contract.catalog import InstanceType
from trainer.plan.memory import MemoryEstimate, estimate_memory
from trainer.plan.performance import Assumptions, StepTime, estimate_step_time

GIB = 2**30
# What a DeepSpeed layout sets: the engine and ZeRO keys, and megatron's own keys at values DeepSpeed accepts.
ZERO_KEYS = ("engine", "zero.stage", "zero.offload_optimizer", "zero.offload_param")
# The fused kernels are megatron's; a DeepSpeed layout turns them off.
FUSION_KEYS = ("fusion.gradient_accumulation_fusion", "fusion.cross_entropy_loss_fusion")
DEEPSPEED_KEYS = (*LAYOUT_KEYS, *FUSION_KEYS, *ZERO_KEYS)
CONTEXT_PARALLEL_CHOICES = (1, 2, 4, 8, 16)
# Below this many tokens of a sequence per CP rank, a layer's attention is too short to hide the K,V ring behind.
MIN_TOKENS_PER_CP_RANK = 4096
# ZeRO's (stage, optimizer offload, weight offload) choices: offload needs stage 2 or 3, weight offload stage 3.
ZERO_CHOICES = (
    (1, "none", "none"),
    (2, "none", "none"),
    (2, "cpu", "none"),
    (3, "none", "none"),
    (3, "cpu", "none"),
    (3, "cpu", "cpu"),
)


@dataclass(frozen=True)
class Candidate:
    cfg: TrainConfig  # the config with this layout
    data_parallel_size: int
    memory: MemoryEstimate
    step: StepTime
    fits: bool

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys this layout sets: LAYOUT_KEYS; for DeepSpeed, every key it depends on (DEEPSPEED_KEYS)."""
        return DEEPSPEED_KEYS if self.cfg.engine == "deepspeed" else LAYOUT_KEYS

    @property
    def layout(self) -> dict[str, Any]:
        return {key: _get(self.cfg, key) for key in self.keys}

    def overrides(self, keys: Sequence[str] = LAYOUT_KEYS) -> list[str]:
        """`--set` values (key=value) that give a config this layout: `keys` of it; a DeepSpeed one, all of its
        keys, so that megatron-only settings of the config (its distributed optimizer, overlap) step aside."""
        keys = self.keys if self.cfg.engine == "deepspeed" else keys
        return [f"{key}={_text(_get(self.cfg, key))}" for key in keys]

    @property
    def sharding(self) -> str:
        """What is sharded over data parallelism: megatron's distributed optimizer, or ZeRO's stage and offload."""
        if self.cfg.engine == "megatron":
            return "dist opt" if self.cfg.parallel.use_distributed_optimizer else "none"
        z = self.cfg.zero
        offloaded = [
            what
            for what, where in (("opt", z.offload_optimizer), ("weights", z.offload_param))
            if where != "none"
        ]
        return f"ZeRO-{z.stage}" + (f" +{'+'.join(offloaded)} on CPU" if offloaded else "")

    def describe(self) -> str:
        p, s = self.cfg.parallel, self.cfg.schedule
        if self.cfg.engine == "deepspeed":
            return (
                f"engine: deepspeed, {self.sharding} x DP={self.data_parallel_size}, micro-batch "
                f"{s.micro_batch_size}, recompute {p.recompute}"
            )
        interleave = (
            f" (x{p.virtual_pipeline_model_parallel_size} virtual)"
            if p.virtual_pipeline_model_parallel_size > 1
            else ""
        )
        return (
            f"TP={p.tensor_model_parallel_size} x PP={p.pipeline_model_parallel_size}{interleave} x "
            f"DP={self.data_parallel_size}{self.context}, micro-batch {s.micro_batch_size}, recompute "
            f"{self.recompute}{'' if self.fp8 == 'bf16' else ', ' + self.fp8}"
            f"{'' if self.overlap == '-' else ', overlap ' + self.overlap}"
        )

    @property
    def context(self) -> str:
        cp = self.cfg.parallel.context_parallel_size
        return f" x CP={cp}" if cp > 1 else ""

    @property
    def recompute(self) -> str:
        p = self.cfg.parallel
        if p.recompute != "full" or (p.recompute_method, p.recompute_num_layers) == ("uniform", 1):
            return p.recompute
        return f"full ({p.recompute_method} {p.recompute_num_layers})"

    @property
    def fp8(self) -> str:
        f = self.cfg.fp8
        return "bf16" if f.format is None else f"fp8 {f.recipe}"

    @property
    def overlap(self) -> str:
        """The communication overlapped with compute: DP gradient reduce, weight gather, TP collectives."""
        p = self.cfg.parallel
        on = [
            name
            for name, flag in (
                ("grad", p.overlap_grad_reduce),
                ("param", p.overlap_param_gather),
                ("tp", p.tp_comm_overlap),
            )
            if flag
        ]
        return "+".join(on) or "-"


@dataclass(frozen=True)
class Plan:
    config: TrainConfig  # as given, before any layout
    instance: InstanceType
    nodes: int
    padded_vocab_size: int
    free_keys: tuple[str, ...]
    assumptions: Assumptions
    candidates: list[Candidate]  # ranked

    @property
    def chosen(self) -> Candidate | None:
        """The fastest layout that fits, if any does."""
        return next((c for c in self.candidates if c.fits), None)


def vocab_size(cfg: TrainConfig) -> int:
    """The padded vocabulary: model.vocab_size, else the tokenizer's (read here, as train would)."""
    if cfg.model.vocab_size is None:
        from trainer.data import DataError
        from trainer.data.tokenizer import load_tokenizer

        try:
            size = load_tokenizer(cfg.data.tokenizer_path).vocab_size
        except DataError as error:
            raise ConfigError(
                [
                    f"model.vocab_size is unset and data.tokenizer_path cannot tell it ({error}); set model.vocab_size"
                ]
            ) from None
    else:
        size = cfg.model.vocab_size
    return cfg.model.padded_vocab_size(size)


def search(
    cfg: TrainConfig,
    instance: InstanceType,
    nodes: int,
    free_keys: Sequence[str] = LAYOUT_KEYS,
    assumptions: Assumptions | None = None,
) -> Plan:
    assumptions = assumptions or Assumptions()
    padded_vocab = vocab_size(cfg)
    world = nodes * instance.gpus
    capacity = instance.gpu_memory_gib * GIB * assumptions.memory_usable_fraction
    # ZeRO-Offload's host memory: every GPU of a node offloads into the node's memory.
    host_capacity = instance.memory_gib * GIB * assumptions.memory_usable_fraction / instance.gpus
    candidates = []
    free = set(free_keys)
    for candidate in [*_layouts(cfg, instance, world, free), *_zero_layouts(cfg, world, free)]:
        if layout_problems(candidate, world, "cuda") or consistency_problems(candidate):
            continue
        if candidate.fp8.format is not None and candidate.fp8.recipe not in instance.fp8_recipes:
            continue  # no FP8 on the GPU, or not this recipe (MXFP8 is Blackwell's)
        dp = ParallelDims.from_config(candidate.parallel, world).dp
        memory = estimate_memory(candidate, world, padded_vocab, "transformer_engine")
        step = estimate_step_time(candidate, instance, nodes, padded_vocab, memory.parameters, assumptions)
        fits = memory.total <= capacity and memory.host <= host_capacity
        candidates.append(Candidate(candidate, dp, memory, step, fits))
    candidates.sort(key=lambda c: (not c.fits, c.step.total_s, c.memory.total))
    return Plan(cfg, instance, nodes, padded_vocab, tuple(free_keys), assumptions, candidates)


def _layouts(cfg: TrainConfig, instance: InstanceType, world: int, free: set[str]) -> Iterator[TrainConfig]:
    m, p, s = cfg.model, cfg.parallel, cfg.schedule

    def values(key: str, choices) -> list:
        return list(choices) if key in free else [_get(cfg, key)]

    def chosen(key: str, value):
        return value if key in free else _get(cfg, key)

    fp8_choices = _fp8_choices(cfg, instance, free)
    seq = cfg.data.seq_length
    for tp in values("parallel.tensor_model_parallel_size", _divisors(instance.gpus)):
        context_choices = [
            c
            for c in CONTEXT_PARALLEL_CHOICES
            if (world // tp) % c == 0
            and seq % (2 * c) == 0
            and (c == 1 or seq // c >= MIN_TOKENS_PER_CP_RANK)
        ]
        for cp in values("parallel.context_parallel_size", context_choices):
            pipeline_choices = [pp for pp in _divisors(m.num_layers) if (world // (tp * cp)) % pp == 0]
            for pp in values("parallel.pipeline_model_parallel_size", pipeline_choices):
                if world % (tp * pp * cp):
                    continue
                dp = world // (tp * pp * cp)
                virtual_choices = [1] + (
                    [v for v in _divisors(m.num_layers // pp) if v > 1] if pp > 1 else []
                )
                micro_choices = _divisors(s.global_batch_size // dp) if s.global_batch_size % dp == 0 else []
                for vp in values("parallel.virtual_pipeline_model_parallel_size", virtual_choices):
                    recomputes = _recompute_choices(cfg, free, m.num_layers // (pp * vp))
                    for micro_batch in values("schedule.micro_batch_size", micro_choices):
                        for recompute, method, layers in recomputes:
                            for distributed in values("parallel.use_distributed_optimizer", (True, False)):
                                for fp8 in fp8_choices:
                                    sequence_parallel = chosen("parallel.sequence_parallel", tp > 1)
                                    parallel = p.model_copy(
                                        update={
                                            "tensor_model_parallel_size": tp,
                                            "pipeline_model_parallel_size": pp,
                                            "virtual_pipeline_model_parallel_size": vp,
                                            "context_parallel_size": cp,
                                            "sequence_parallel": sequence_parallel,
                                            "use_distributed_optimizer": distributed,
                                            "recompute": recompute,
                                            "recompute_method": method,
                                            "recompute_num_layers": layers,
                                            "overlap_grad_reduce": chosen(
                                                "parallel.overlap_grad_reduce", dp * cp > 1
                                            ),
                                            "overlap_param_gather": chosen(
                                                "parallel.overlap_param_gather", distributed and dp * cp > 1
                                            ),
                                            "tp_comm_overlap": chosen(
                                                "parallel.tp_comm_overlap", sequence_parallel
                                            ),
                                        }
                                    )
                                    schedule = s.model_copy(update={"micro_batch_size": micro_batch})
                                    yield cfg.model_copy(
                                        update={"parallel": parallel, "schedule": schedule, "fp8": fp8}
                                    )


def _recompute_choices(cfg: TrainConfig, free: set[str], layers_per_chunk: int) -> list[tuple[str, str, int]]:
    """(recompute, recompute_method, recompute_num_layers): none, selective, full of every layer, and full
    recompute of a quarter, half and three quarters of each chunk's layers."""
    p = cfg.parallel
    layers = (p.recompute_method, p.recompute_num_layers)
    if "parallel.recompute" not in free and p.recompute != "full":
        return [(p.recompute, *layers)]
    choices: list[tuple[str, str, int]] = [("full", *layers)]
    if {"parallel.recompute_method", "parallel.recompute_num_layers"} <= free:
        choices = [("full", "uniform", 1)]
        choices += [
            ("full", "block", n)
            for n in sorted({layers_per_chunk * quarter // 4 for quarter in (1, 2, 3)})
            if 0 < n < layers_per_chunk
        ]
    if "parallel.recompute" in free:
        choices = [("none", "uniform", 1), ("selective", "uniform", 1), *choices]
    return choices


def _fp8_choices(cfg: TrainConfig, instance: InstanceType, free: set[str]) -> list[FP8Config]:
    f = cfg.fp8
    formats = [None, f.format or "hybrid"] if "fp8.format" in free else [f.format]
    recipe = f.recipe
    if "fp8.recipe" in free or recipe not in instance.fp8_recipes:
        recipe = instance.fp8_recipes[0] if instance.fp8_recipes else recipe
    return [
        FP8Config(format=None) if fmt is None else FP8Config(format=fmt, recipe=recipe)
        for fmt in formats
        if fmt is None or instance.fp8_recipes
    ]


def _zero_layouts(cfg: TrainConfig, world: int, free: set[str]) -> Iterator[TrainConfig]:
    """DeepSpeed's layouts, when the search may choose TP and PP (ZeRO runs at TP = PP = 1, DP = world)."""
    if not {"parallel.tensor_model_parallel_size", "parallel.pipeline_model_parallel_size"} <= free:
        return
    s = cfg.schedule
    micro_choices = _divisors(s.global_batch_size // world) if s.global_batch_size % world == 0 else []
    for micro_batch in micro_choices if "schedule.micro_batch_size" in free else [s.micro_batch_size]:
        for recompute in (
            ("none", "selective", "full") if "parallel.recompute" in free else [cfg.parallel.recompute]
        ):
            for stage, offload_optimizer, offload_param in ZERO_CHOICES:
                # megatron's own keys (distributed optimizer, overlap, TP/PP) at DeepSpeed's values.
                parallel = ParallelConfig(
                    use_distributed_optimizer=False,
                    recompute=recompute,
                    distributed_timeout_minutes=cfg.parallel.distributed_timeout_minutes,
                )
                zero = ZeroConfig(
                    stage=stage, offload_optimizer=offload_optimizer, offload_param=offload_param
                )
                schedule = s.model_copy(update={"micro_batch_size": micro_batch})
                yield cfg.model_copy(
                    update={
                        "engine": "deepspeed",
                        "zero": zero,
                        "parallel": parallel,
                        "schedule": schedule,
                        "fp8": FP8Config(),
                        "fusion": FusionConfig(),
                    }
                )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _get(cfg: TrainConfig, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _text(value: Any) -> str:
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)
