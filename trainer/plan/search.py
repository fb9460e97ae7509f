"""Every layout `train` accepts for a config on N nodes of an instance type, estimated and ranked.

A layout is a value for each of trainer/config.py's LAYOUT_KEYS. The keys the search may change are the free
ones (those the config marks `auto`, or all of them); the others keep the config's value. Each candidate passes
`layout_problems` (the check `train` runs before starting), with TP inside a node; sequence parallelism is on
whenever TP > 1 (less activation memory for the same communication volume). When both TP and PP are free, the
search also tries `engine: deepspeed` (data parallel only): ZeRO stage 1, 2 and 3, with the optimizer states
offloaded to the host (stage 2 and 3) and the weights too (stage 3), at each micro-batch size and recompute; its
layout adds the keys `engine` and `zero.*` (ZERO_KEYS). Ranked: layouts that fit first, then by step time, then by
memory, so DeepSpeed wins where megatron's layouts do not fit, or fit only slower.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from trainer.config import LAYOUT_KEYS, ConfigError, ParallelConfig, TrainConfig, ZeroConfig, layout_problems
from trainer.contract.catalog import InstanceType
from trainer.plan.memory import MemoryEstimate, estimate_memory
from trainer.plan.performance import Assumptions, StepTime, estimate_step_time

GIB = 2**30
# What a DeepSpeed layout sets: the engine and ZeRO keys, and megatron's own keys at values DeepSpeed accepts.
ZERO_KEYS = ("engine", "zero.stage", "zero.offload_optimizer", "zero.offload_param")
DEEPSPEED_KEYS = (*LAYOUT_KEYS, "parallel.overlap_grad_reduce", *ZERO_KEYS)
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
            f"DP={self.data_parallel_size}, micro-batch {s.micro_batch_size}, recompute {p.recompute}"
        )


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
        if layout_problems(candidate, world, "cuda"):
            continue
        dp = world // candidate.parallel.model_parallel_size
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

    for tp in values("parallel.tensor_model_parallel_size", _divisors(instance.gpus)):
        pipeline_choices = [pp for pp in _divisors(m.num_layers) if (world // tp) % pp == 0]
        for pp in values("parallel.pipeline_model_parallel_size", pipeline_choices):
            if world % (tp * pp):
                continue
            dp = world // (tp * pp)
            virtual_choices = [1] + ([v for v in _divisors(m.num_layers // pp) if v > 1] if pp > 1 else [])
            micro_choices = _divisors(s.global_batch_size // dp) if s.global_batch_size % dp == 0 else []
            for vp in values("parallel.virtual_pipeline_model_parallel_size", virtual_choices):
                for micro_batch in values("schedule.micro_batch_size", micro_choices):
                    for recompute in values("parallel.recompute", ("none", "selective", "full")):
                        for distributed in values("parallel.use_distributed_optimizer", (True, False)):
                            parallel = p.model_copy(
                                update={
                                    "tensor_model_parallel_size": tp,
                                    "pipeline_model_parallel_size": pp,
                                    "virtual_pipeline_model_parallel_size": vp,
                                    "sequence_parallel": tp > 1
                                    if "parallel.sequence_parallel" in free
                                    else p.sequence_parallel,
                                    "use_distributed_optimizer": distributed,
                                    "recompute": recompute,
                                }
                            )
                            schedule = s.model_copy(update={"micro_batch_size": micro_batch})
                            yield cfg.model_copy(update={"parallel": parallel, "schedule": schedule})


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
                    update={"engine": "deepspeed", "zero": zero, "parallel": parallel, "schedule": schedule}
                )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _get(cfg: TrainConfig, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
