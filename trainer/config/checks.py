"""The trainer config's checks beyond one section: across sections, and against the world size, the device and
the accelerator (the prepared data's: `data_problems` in trainer/data/datasets.py, where that knowledge lives).
Each returns one line per problem (the key, the bad value, what would be valid); an empty list means the config
can run there.
"""

from __future__ import annotations

from typing import Any, Literal

from trainer.config.layout import ParallelDims
from trainer.config.schema import TrainConfig


def consistency_problems(cfg: TrainConfig) -> list[str]:
    """Every check that needs no world size or device: each section's own (schema.py), then across sections (the
    planner runs them on the configs it derives)."""
    problems = [
        *cfg.model.problems(),
        *cfg.data.problems(),
        *cfg.schedule.problems(),
        *cfg.optimizer.problems(),
        *cfg.checkpoint.problems(),
        *cfg.parallel.problems(),
        *cfg.fp8.problems(),
    ]
    timeout_s = cfg.parallel.distributed_timeout_minutes * 60
    if cfg.health.watchdog and cfg.health.hang_min_seconds >= timeout_s:
        problems.append(
            f"health.hang_min_seconds = {cfg.health.hang_min_seconds:g} is not below "
            f"parallel.distributed_timeout_minutes = {cfg.parallel.distributed_timeout_minutes:g} ({timeout_s:g} s): "
            "a stuck collective would time out before the watchdog dumps the stacks; lower "
            "health.hang_min_seconds, raise parallel.distributed_timeout_minutes, or set health.watchdog = false"
        )
    if cfg.fp8.format is not None and cfg.precision != "bf16":
        problems.append(
            f"fp8.format = {cfg.fp8.format!r} needs precision: bf16 (got {cfg.precision!r}): FP8 GEMMs run inside "
            "bf16 training, whose weights and gradients stay bf16/fp32"
        )
    return (
        problems
        + _chat_problems(cfg)
        + (_deepspeed_problems(cfg) if cfg.engine == "deepspeed" else _megatron_problems(cfg))
    )


def _chat_problems(cfg: TrainConfig) -> list[str]:
    """Packed chat samples go to megatron-core's thd attention one sequence per micro-batch, as in
    Megatron-Bridge (src/megatron/bridge/training/utils/packed_seq_utils.py squeezes the batch dimension)."""
    if cfg.data.format != "chat":
        return []
    wanted = {
        "engine": (cfg.engine, "megatron"),
        "schedule.micro_batch_size": (cfg.schedule.micro_batch_size, 1),
        "parallel.context_parallel_size": (cfg.parallel.context_parallel_size, 1),
    }
    return [
        f"data.format = 'chat' needs {key} = {valid!r} (got {value!r}): a packed sample is one micro-batch of "
        "one sequence through megatron-core's packed (thd) attention; raise data.seq_length to pack more"
        for key, (value, valid) in wanted.items()
        if value != valid
    ]


def _megatron_problems(cfg: TrainConfig) -> list[str]:
    """The DeepSpeed-only sections, set while the megatron engine would ignore them."""
    return [
        f"{section} is set but engine is megatron; set engine: deepspeed to use it ({why})"
        for section, why in (
            ("zero", "megatron shards optimizer state with parallel.use_distributed_optimizer"),
            ("deepspeed", "raw DeepSpeed config keys"),
        )
        if section in cfg.model_fields_set
    ]


def _deepspeed_problems(cfg: TrainConfig) -> list[str]:
    """What the DeepSpeed engine cannot do: it trains the model whole on every rank group (TP = PP = 1)."""
    p, z = cfg.parallel, cfg.zero
    problems = [
        f"parallel.{key} = {value} needs engine: megatron; engine: deepspeed (ZeRO stage {z.stage}) runs data "
        "parallelism only (TP = PP = 1): set it to 1, or use engine: megatron for tensor/pipeline parallelism"
        for key, value in (
            ("tensor_model_parallel_size", p.tensor_model_parallel_size),
            ("pipeline_model_parallel_size", p.pipeline_model_parallel_size),
            ("virtual_pipeline_model_parallel_size", p.virtual_pipeline_model_parallel_size),
        )
        if value != 1
    ]
    if p.sequence_parallel:
        problems.append("parallel.sequence_parallel = true needs engine: megatron with TP > 1")
    problems += [
        f"{key} = {value} needs engine: megatron ({what}, wired through megatron-core's DDP, schedule and "
        "parallel state, which engine: deepspeed replaces): remove it, or use engine: megatron"
        for key, value, what in _gpu_fast_path(cfg)
    ]
    problems += [
        f"parallel.{key} is megatron's ({why}); with engine: deepspeed remove it ({instead})"
        for key, why, instead in (
            ("use_distributed_optimizer", "its ZeRO-1", "zero.stage says what ZeRO shards"),
            ("overlap_grad_reduce", "its DDP", "deepspeed.zero_optimization.overlap_comm does this"),
            ("overlap_param_gather", "its distributed optimizer's", "ZeRO gathers weights itself"),
        )
        if key in p.model_fields_set and getattr(p, key)
    ]
    if z.offload_optimizer != "none" and z.stage == 1:
        problems.append(
            f"zero.offload_optimizer = {z.offload_optimizer!r} needs zero.stage 2 or 3 (got 1): ZeRO-Offload "
            "steps the optimizer on the host from sharded gradients"
        )
    if z.offload_param != "none" and z.stage != 3:
        problems.append(
            f"zero.offload_param = {z.offload_param!r} needs zero.stage 3 (got {z.stage}): only stage 3 "
            "partitions the weights"
        )
    return problems


def layout_problems(cfg: TrainConfig, world_size: int, device: Literal["cpu", "cuda"]) -> list[str]:
    """What stops `cfg` from running on `world_size` processes of `device`; empty when it can."""
    m, p, s = cfg.model, cfg.parallel, cfg.schedule
    tp, pp, vp = (
        p.tensor_model_parallel_size,
        p.pipeline_model_parallel_size,
        p.virtual_pipeline_model_parallel_size,
    )
    problems = []
    for key, value, why in (
        ("model.num_attention_heads", m.num_attention_heads, "use a TP size that divides it"),
        ("model.num_query_groups", m.query_groups, "each TP rank needs whole query groups"),
        ("model.ffn_hidden_size", m.ffn_hidden_size, "each TP rank holds an equal slice of the MLP"),
        (
            "model.make_vocab_size_divisible_by",
            m.make_vocab_size_divisible_by,
            "the embedding is split over TP",
        ),
    ):
        if value % tp:
            problems.append(
                f"{key} = {value} is not divisible by parallel.tensor_model_parallel_size = {tp}; {why}"
            )
    if m.num_layers % (pp * vp):
        problems.append(
            f"model.num_layers = {m.num_layers} is not divisible by parallel.pipeline_model_parallel_size x "
            f"parallel.virtual_pipeline_model_parallel_size = {pp} x {vp} = {pp * vp}"
        )
    if vp > 1 and pp == 1:
        problems.append(
            f"parallel.virtual_pipeline_model_parallel_size = {vp} needs "
            "parallel.pipeline_model_parallel_size > 1 (it interleaves pipeline stages)"
        )
    world = ParallelDims.world_problems(p, world_size)
    problems += world
    if not world:
        dims = ParallelDims.from_config(p, world_size)
        if s.global_batch_size % (s.micro_batch_size * dims.dp):
            problems.append(
                f"schedule.global_batch_size = {s.global_batch_size} is not divisible by "
                f"schedule.micro_batch_size x data parallel size = {s.micro_batch_size} x {dims.dp}"
            )
        elif vp > 1 and dims.micro_batches(s.global_batch_size, s.micro_batch_size) % pp:
            micro_batches = dims.micro_batches(s.global_batch_size, s.micro_batch_size)
            problems.append(
                f"the interleaved schedule needs the {micro_batches} micro-batches per step (schedule.global_batch_size"
                f" / (micro_batch_size x DP)) to be a multiple of parallel.pipeline_model_parallel_size = {pp}"
            )
    if p.sequence_parallel and device == "cpu":
        problems.append(
            "parallel.sequence_parallel = true cannot run on CPU: megatron-core's local layer spec "
            "refuses it without TransformerEngine; set it to false here (it works on GPUs)"
        )
    elif p.sequence_parallel and tp == 1:
        problems.append("parallel.sequence_parallel = true needs parallel.tensor_model_parallel_size > 1")
    return problems + _fast_path_layout_problems(cfg, device)


def _gpu_fast_path(cfg: TrainConfig) -> list[tuple[str, Any, str]]:
    """The fast-path keys this config turns on: (key, value, the megatron-core feature that needs a GPU)."""
    p, f, fusion = cfg.parallel, cfg.fp8, cfg.fusion
    knobs = [
        (
            "parallel.context_parallel_size",
            p.context_parallel_size,
            "context parallelism (only TEDotProductAttention implements it)",
            p.context_parallel_size > 1,
        ),
        (
            "parallel.tp_comm_overlap",
            "true",
            "TP communication overlap (TransformerEngine userbuffers)",
            p.tp_comm_overlap,
        ),
        ("fp8.format", repr(f.format), "FP8 GEMMs (TransformerEngine recipes)", f.format is not None),
        (
            "fusion.gradient_accumulation_fusion",
            "true",
            "gradient accumulation fusion (in TransformerEngine's linear layers)",
            fusion.gradient_accumulation_fusion,
        ),
        (
            "fusion.cross_entropy_loss_fusion",
            "true",
            "fused cross entropy (TransformerEngine's parallel_cross_entropy)",
            fusion.cross_entropy_loss_fusion,
        ),
    ]
    return [(key, value, what) for key, value, what, on in knobs if on]


def _fast_path_layout_problems(cfg: TrainConfig, device: Literal["cpu", "cuda"]) -> list[str]:
    p, m = cfg.parallel, cfg.model
    cp = p.context_parallel_size
    problems = []
    # megatron.core.utils.get_batch_on_this_cp_rank cuts each sequence into 2 x CP chunks (rank r takes chunks
    # r and 2 CP - 1 - r, which balances causal attention).
    if cp > 1 and cfg.data.seq_length % (2 * cp):
        problems.append(
            f"data.seq_length = {cfg.data.seq_length} is not divisible by 2 x parallel.context_parallel_size "
            f"= {2 * cp}: context parallelism gives each rank two of 2 x CP equal chunks of every sequence"
        )
    layers_per_chunk = m.num_layers // (
        p.pipeline_model_parallel_size * p.virtual_pipeline_model_parallel_size
    )
    if p.recompute == "full" and layers_per_chunk and p.recompute_num_layers > layers_per_chunk:
        problems.append(
            f"parallel.recompute_num_layers = {p.recompute_num_layers} is above the {layers_per_chunk} layers of "
            "a model chunk (model.num_layers / (pipeline x virtual pipeline size)); give 1 to "
            f"{layers_per_chunk}"
        )
    if device == "cpu":
        problems += [
            f"{key} = {value} cannot run on CPU: {what} needs a GPU with TransformerEngine; remove it here "
            "(the GPU recipes set it; CPU runs train with megatron-core's local layers)"
            for key, value, what in _gpu_fast_path(cfg)
        ]
    return problems


def accelerator_problems(
    cfg: TrainConfig, transformer_engine: bool, compute_capability: tuple[int, int]
) -> list[str]:
    """What this GPU and image cannot run of the config's fast path: TransformerEngine's features without it,
    FP8 below Hopper/Ada (SM 8.9), MXFP8 below Blackwell (SM 10.0)."""
    problems = []
    if not transformer_engine:
        problems += [
            f"{key} = {value}: {what} needs TransformerEngine, which this Python environment lacks (the "
            "cluster image ships it); remove the key to train with megatron-core's local layers"
            for key, value, what in _gpu_fast_path(cfg)
        ]
    capability = ".".join(map(str, compute_capability))
    # TransformerEngine docs, features/low_precision_training: FP8 needs SM 8.9+; MXFP8 "first appeared in the
    # Blackwell GPU" (SM 10.0).
    if cfg.fp8.format is not None and compute_capability < (8, 9):
        problems.append(
            f"fp8.format = {cfg.fp8.format!r}: this GPU (compute capability {capability}) has no FP8 tensor "
            "cores (Hopper/Ada, 8.9, and later do); set fp8.format: null"
        )
    elif cfg.fp8.format is not None and cfg.fp8.recipe == "mxfp8" and compute_capability < (10, 0):
        problems.append(
            f"fp8.recipe = 'mxfp8' needs a Blackwell GPU (compute capability 10.0); this one is {capability}: "
            "use fp8.recipe: tensorwise or delayed"
        )
    return problems
