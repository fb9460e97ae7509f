"""Every layout `train` accepts for a config on N nodes of an instance type, estimated and ranked.

A layout is a value for each of trainer/config.py's LAYOUT_KEYS. The keys the search may change are the free
ones (those the config marks `auto`, or all of them); the others keep the config's value. Each candidate passes
`layout_problems` (the check `train` runs before starting), with TP inside a node; sequence parallelism is on
whenever TP > 1 (less activation memory for the same communication volume). Ranked: layouts that fit first,
then by step time, then by memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from trainer.catalog import InstanceType
from trainer.config import LAYOUT_KEYS, ConfigError, TrainConfig, layout_problems
from trainer.plan.memory import MemoryEstimate, estimate_memory
from trainer.plan.performance import Assumptions, StepTime, estimate_step_time

GIB = 2**30


@dataclass(frozen=True)
class Candidate:
    cfg: TrainConfig  # the config with this layout
    data_parallel_size: int
    memory: MemoryEstimate
    step: StepTime
    fits: bool

    @property
    def layout(self) -> dict[str, Any]:
        return {key: _get(self.cfg, key) for key in LAYOUT_KEYS}

    def overrides(self, keys: Sequence[str] = LAYOUT_KEYS) -> list[str]:
        """`--set` values (key=value) that give a config this layout."""
        return [f"{key}={_text(_get(self.cfg, key))}" for key in keys]

    def describe(self) -> str:
        p, s = self.cfg.parallel, self.cfg.schedule
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
    candidates = []
    for candidate in _layouts(cfg, instance, world, set(free_keys)):
        if layout_problems(candidate, world, "cuda"):
            continue
        dp = world // candidate.parallel.model_parallel_size
        memory = estimate_memory(candidate, world, padded_vocab, "transformer_engine")
        step = estimate_step_time(candidate, instance, nodes, padded_vocab, memory.parameters, assumptions)
        candidates.append(Candidate(candidate, dp, memory, step, memory.total <= capacity))
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


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _get(cfg: TrainConfig, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
