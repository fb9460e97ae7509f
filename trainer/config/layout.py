"""`ParallelDims`: the (TP, PP, CP, DP) layout of a world of processes, validated once against the world size.

As torchtitan's `distributed/parallel_dims.py`: world = TP x PP x CP x DP, checked where the layout is made, and
every user (the config checks, the planner, the job submitter, the process groups, checkpoints) reads tp, pp, vp,
cp and dp from here instead of deriving them. No torch: the planner and the cluster tools use it too.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from trainer.config.schema import ConfigError, ParallelConfig


@dataclass(frozen=True)
class ParallelDims:
    tp: int
    pp: int
    dp: int
    vp: int = 1  # model chunks per pipeline rank; 1: plain 1F1B
    cp: int = 1  # context parallel: GPUs that split each sequence

    def __post_init__(self) -> None:
        bad = [
            f"{f.name} = {getattr(self, f.name)!r}"
            for f in fields(self)
            if not _positive(getattr(self, f.name))
        ]
        if bad:
            raise ValueError(f"parallel dimensions must be whole numbers >= 1: {', '.join(bad)}")

    @classmethod
    def from_config(cls, parallel: ParallelConfig, world_size: int) -> ParallelDims:
        """The layout `parallel` gives a world of `world_size` processes; ConfigError when it does not fit."""
        problems = cls.world_problems(parallel, world_size)
        if problems:
            raise ConfigError(problems)
        return cls(
            tp=parallel.tensor_model_parallel_size,
            pp=parallel.pipeline_model_parallel_size,
            dp=world_size // parallel.model_parallel_size,
            vp=parallel.virtual_pipeline_model_parallel_size,
            cp=parallel.context_parallel_size,
        )

    @staticmethod
    def world_problems(parallel: ParallelConfig, world_size: int) -> list[str]:
        """Why `parallel` cannot split `world_size` processes: not a multiple of TP x PP x CP, or another DP."""
        p = parallel
        tp, pp, cp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size
        names = "parallel.tensor_model_parallel_size x parallel.pipeline_model_parallel_size"
        short = "parallel.tensor_model_parallel_size x pipeline_model_parallel_size"
        sizes = f"{tp} x {pp}"
        if cp > 1:
            names, short, sizes = (
                f"{names} x context_parallel_size",
                f"{short} x context_parallel_size",
                f"{sizes} x {cp}",
            )
        mp = p.model_parallel_size
        if world_size % mp:
            return [f"world size {world_size} is not divisible by {names} = {sizes} = {mp}"]
        if p.data_parallel_size is not None and world_size != mp * p.data_parallel_size:
            return [
                f"world size {world_size} != {short} x data_parallel_size = {sizes} x {p.data_parallel_size} = "
                f"{mp * p.data_parallel_size}; launch {mp * p.data_parallel_size} processes or set "
                f"parallel.data_parallel_size to {world_size // mp} (or null to derive it)"
            ]
        return []

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def model_parallel_size(self) -> int:
        """Processes that share one data-parallel replica: TP x PP x CP."""
        return self.tp * self.pp * self.cp

    def micro_batches(self, global_batch_size: int, micro_batch_size: int) -> int:
        """Micro-batches each data-parallel replica runs per step."""
        return global_batch_size // (micro_batch_size * self.dp)

    def __str__(self) -> str:
        interleave = f" (x{self.vp} virtual stages)" if self.vp > 1 else ""
        context = f" x CP={self.cp}" if self.cp > 1 else ""
        return f"TP={self.tp} x PP={self.pp}{interleave}{context} x DP={self.dp}"


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
