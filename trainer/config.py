"""The trainer's configuration: one typed tree, loaded from YAML with `--set section.key=value` overrides.

Names follow megatron-core (`tensor_model_parallel_size`, `micro_batch_size`, ...). This module imports neither
torch nor megatron-core: the cluster-job tool and the planner use it to check a layout against a node count
before anything starts. Every error names the dotted key, the bad value and what would be valid.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from trainer.monitoring.config import MonitoringConfig

if TYPE_CHECKING:
    from trainer.model.precision import PrecisionChoice


class ConfigError(Exception):
    """A trainer config that cannot run; one line per problem."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = problems
        where = f" ({source})" if source else ""
        super().__init__(f"invalid trainer config{where}:\n" + "\n".join(f"  - {p}" for p in problems))


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(_Section):
    """A Llama-style decoder: RMSNorm, SwiGLU, rotary embeddings, grouped-query attention, no biases."""

    num_layers: PositiveInt
    hidden_size: PositiveInt
    ffn_hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    num_query_groups: PositiveInt | None = None  # None: one per head (plain multi-head attention)
    kv_channels: PositiveInt | None = None  # head dimension; None: hidden_size / num_attention_heads
    vocab_size: PositiveInt | None = None  # None: the tokenizer's
    # The embedding is padded to a multiple of this, independent of TP so that checkpoints reshard.
    make_vocab_size_divisible_by: PositiveInt = 128
    rotary_base: PositiveInt = 500_000
    # Llama 3.1's rope scaling by this factor (low/high frequency factors 1 and 4, 8192 original positions).
    rope_scaling_factor: PositiveFloat | None = None
    norm_epsilon: PositiveFloat = 1e-5
    init_method_std: PositiveFloat = 0.02
    share_embeddings_and_output_weights: bool = False

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    def padded_vocab_size(self, vocab_size: int) -> int:
        multiple = self.make_vocab_size_divisible_by
        return -(-vocab_size // multiple) * multiple


class ParallelConfig(_Section):
    tensor_model_parallel_size: PositiveInt = 1
    pipeline_model_parallel_size: PositiveInt = 1
    # Model chunks per pipeline rank; > 1 runs the interleaved 1F1B schedule.
    virtual_pipeline_model_parallel_size: PositiveInt = 1
    data_parallel_size: PositiveInt | None = None  # None: world size / (TP x PP)
    sequence_parallel: bool = False
    # Each sequence split over this many GPUs (megatron-core context parallelism: TransformerEngine's attention
    # exchanges keys and values in a ring); for long sequences.
    context_parallel_size: PositiveInt = 1
    use_distributed_optimizer: bool = True
    overlap_grad_reduce: bool = False  # DP gradient reduce-scatter during backward
    overlap_param_gather: bool = (
        False  # the distributed optimizer's weight all-gather during the next forward
    )
    tp_comm_overlap: bool = False  # TP collectives pipelined with the GEMMs (TransformerEngine userbuffers)
    recompute: Literal["none", "selective", "full"] = "none"
    # Full recompute only: `uniform` checkpoints the input of every group of recompute_num_layers layers and
    # recomputes them all; `block` recomputes the first recompute_num_layers layers of each model chunk and keeps
    # the other layers' activations (partial recompute: the memory lever between none and full).
    recompute_method: Literal["uniform", "block"] = "uniform"
    recompute_num_layers: PositiveInt = 1
    # How long a collective waits for the other ranks before it fails (a fraction for tests: 0.1 = 6 s).
    distributed_timeout_minutes: PositiveFloat = 10

    @property
    def model_parallel_size(self) -> int:
        """GPUs that share one data-parallel replica: TP x PP x CP."""
        return (
            self.tensor_model_parallel_size * self.pipeline_model_parallel_size * self.context_parallel_size
        )


class FP8Config(_Section):
    """FP8 GEMMs through TransformerEngine (megatron-core TransformerConfig.fp8 / fp8_recipe); weights, master
    weights, gradients and checkpoints stay bf16/fp32, so an FP8-trained checkpoint loads in bf16."""

    format: Literal["e4m3", "hybrid"] | None = None  # None: no FP8; hybrid: e4m3 forward, e5m2 gradients
    # delayed: per-tensor scale from an amax history; tensorwise: per-tensor current scaling (Hopper and later);
    # mxfp8: one scale per 32 values, Blackwell (SM 10.0) only.
    recipe: Literal["delayed", "tensorwise", "mxfp8"] = "delayed"


class FusionConfig(_Section):
    """Fused kernels megatron-core takes from TransformerEngine (GPUs with TE only)."""

    gradient_accumulation_fusion: bool = False  # weight-gradient GEMMs accumulate into DDP's fp32 main_grad
    cross_entropy_loss_fusion: bool = False  # TE's fused vocab-parallel cross entropy


class ZeroConfig(_Section):
    """DeepSpeed ZeRO (engine: deepspeed): what is sharded over the data-parallel ranks, and what lives in host memory.

    Stage 1 shards the fp32 master weights and Adam moments, 2 also the gradients, 3 also the weights."""

    stage: Literal[1, 2, 3] = 2
    offload_optimizer: Literal["none", "cpu"] = (
        "none"  # master weights + Adam moments in host memory (stage 2/3)
    )
    offload_param: Literal["none", "cpu"] = "none"  # weights in host memory, fetched layer by layer (stage 3)


class DataConfig(_Section):
    prefixes: list[str] = Field(min_length=1)  # prepared datasets: PREFIX.bin / PREFIX.idx
    weights: list[PositiveFloat] | None = None  # blend weights, one per prefix; None: by size
    split: str = Field("969,30,1", pattern=r"^\d+(\.\d+)?,\d+(\.\d+)?,\d+(\.\d+)?$")  # train,valid,test
    seq_length: PositiveInt
    tokenizer_path: str
    cache_dir: str | None = None  # None: beside the run


class OptimizerConfig(_Section):
    """AdamW with decoupled weight decay, fp32 master weights."""

    lr: PositiveFloat
    min_lr: NonNegativeFloat = 0.0
    weight_decay: NonNegativeFloat = 0.1
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.95, ge=0, lt=1)
    adam_eps: PositiveFloat = 1e-8
    clip_grad: NonNegativeFloat = 1.0  # 0: no clipping
    # A step with a non-finite loss or gradient norm is skipped (no update); this many in a row stop the run.
    max_consecutive_skips: PositiveInt = 5


class ScheduleConfig(_Section):
    train_iters: PositiveInt
    micro_batch_size: PositiveInt
    global_batch_size: PositiveInt
    lr_warmup_iters: NonNegativeInt = 0
    lr_decay_style: Literal["cosine", "linear", "constant"] = "cosine"
    lr_decay_iters: PositiveInt | None = None  # None: train_iters
    eval_interval: PositiveInt = 100
    eval_iters: PositiveInt = 10


class CheckpointConfig(_Section):
    save_interval: PositiveInt | None = None  # None: only at the end
    keep_last: PositiveInt = 2
    dir: str | None = None  # None: <run_dir>/checkpoints
    resume: bool = True  # continue from the newest complete checkpoint when there is one
    # Start from another checkpoint (a checkpoint directory, or a directory with `latest`, e.g. from `convert`)
    # until this run has saved its own, which take precedence.
    load: str | None = None
    finetune: bool = (
        False  # from `load`: the weights only (step, samples, optimizer and LR schedule start afresh)
    )
    # --- checkpoint speed and resume checks (issue 15; trainer/checkpoint/megatron.py, settings.py) ---
    # Saves on the interval write in the background while training goes on (megatron); the last and the
    # SIGTERM save are synchronous.
    async_save: bool = True
    # Optimizer state format (megatron, distributed optimizer): dp_reshardable (each DP rank writes its own
    # shard, no gather; its moments load at the same TP x PP x VP, any DP) or fully_reshardable (any layout).
    # auto: the saves written in the background on the interval, which resume the same job, dp_reshardable; the
    # synchronous ones (the run's last, the SIGTERM save, every save with async_save off) fully_reshardable.
    optimizer_format: Literal["auto", "dp_reshardable", "fully_reshardable"] = "auto"
    # Resume although the config changes the LR schedule or data settings the checkpoint was trained under
    # (trainer/checkpoint/settings.py): the config's values take effect. Without it such a resume is refused.
    allow_schedule_change: bool = False
    # --- end issue 15 ---


class LoggingConfig(_Section):
    run_dir: str | None = None  # None: runs/<name>
    log_interval: PositiveInt = 1
    tensorboard: bool = True
    peak_tflops_per_device: PositiveFloat | None = None  # None: the instance catalog's, by GPU model


class HealthConfig(_Section):
    """Straggler windows and the hang watchdog (trainer/health/)."""

    # Steps per window; each window ends in one all-gather of every rank's mean step compute time.
    straggler_interval: PositiveInt = 20
    # A rank above this x the median rank's compute time for straggler_windows windows in a row is reported.
    straggler_factor: float = Field(1.5, gt=1)
    straggler_windows: PositiveInt = 3
    watchdog: bool = True
    # With no step or collective completing for max(hang_min_seconds, hang_step_multiple x the median step
    # time), capped at the process-group timeout, every rank dumps its stacks and the run exits for a retry.
    hang_min_seconds: PositiveFloat = 300
    hang_step_multiple: PositiveFloat = 20


class TrainConfig(_Section):
    name: str = Field(min_length=1)  # defaults to the config file's stem
    seed: NonNegativeInt = 1234
    # bf16: bf16 weights and compute, fp32 master weights; fp32. In a YAML file or --set, `auto` picks what this
    # machine computes natively (trainer/model/precision.py), and load_config resolves it to one of these.
    precision: Literal["bf16", "fp32"] = "bf16"
    fp8: FP8Config = FP8Config()
    fusion: FusionConfig = FusionConfig()
    # megatron: tensor + pipeline + data parallel (megatron-core); deepspeed: ZeRO data parallel (TP = PP = 1).
    engine: Literal["megatron", "deepspeed"] = "megatron"
    model: ModelConfig
    parallel: ParallelConfig = ParallelConfig()
    zero: ZeroConfig = ZeroConfig()
    # Raw DeepSpeed config keys merged over the ones derived from this tree (trainer/engines/deepspeed_config.py).
    deepspeed: dict[str, Any] = {}
    data: DataConfig
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    checkpoint: CheckpointConfig = CheckpointConfig()
    logging: LoggingConfig = LoggingConfig()
    # metrics endpoints and CloudWatch lines: docs/monitoring.md
    monitoring: MonitoringConfig = MonitoringConfig()
    health: HealthConfig = HealthConfig()

    _precision_choice: PrecisionChoice | None = PrivateAttr(None)  # set when `precision: auto` chose

    @property
    def precision_choice(self) -> PrecisionChoice | None:
        """What `precision: auto` chose on this machine and why; None when the config named the precision."""
        return self._precision_choice

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        problems = consistency_problems(self)
        if problems:
            raise ConfigError(problems)
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.logging.run_dir or Path("runs") / self.name)

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else self.run_dir / "checkpoints"


def consistency_problems(cfg: TrainConfig) -> list[str]:
    """Cross-field checks that need no world size or device (the planner runs them on configs it derives)."""
    m, d, s, o = cfg.model, cfg.data, cfg.schedule, cfg.optimizer
    problems = []
    if m.kv_channels is None and m.hidden_size % m.num_attention_heads:
        problems.append(
            f"model.hidden_size = {m.hidden_size} is not divisible by model.num_attention_heads = "
            f"{m.num_attention_heads}; change either, or set model.kv_channels (the head dimension)"
        )
    if m.num_attention_heads % m.query_groups:
        problems.append(
            f"model.num_attention_heads = {m.num_attention_heads} is not divisible by model.num_query_groups = "
            f"{m.query_groups}; each query group must hold the same number of heads"
        )
    if d.weights is not None and len(d.weights) != len(d.prefixes):
        problems.append(
            f"data.weights = {d.weights} has {len(d.weights)} entries but data.prefixes has {len(d.prefixes)}; "
            "give one weight per prefix, or none"
        )
    decay_iters = s.lr_decay_iters or s.train_iters
    if s.lr_warmup_iters >= decay_iters:
        problems.append(
            f"schedule.lr_warmup_iters = {s.lr_warmup_iters} must be below the decay length "
            f"(schedule.lr_decay_iters, default schedule.train_iters) = {decay_iters}"
        )
    train_weight, valid_weight = (float(weight) for weight in d.split.split(",")[:2])
    if not (train_weight and valid_weight):
        problems.append(
            f"data.split = {d.split!r}: the train and validation weights must be above 0 (training evaluates "
            "the validation split at the start and every schedule.eval_interval steps), e.g. '969,30,1'"
        )
    if o.min_lr > o.lr:
        problems.append(f"optimizer.min_lr = {o.min_lr} is above optimizer.lr = {o.lr}")
    timeout_s = cfg.parallel.distributed_timeout_minutes * 60
    if cfg.health.watchdog and cfg.health.hang_min_seconds >= timeout_s:
        problems.append(
            f"health.hang_min_seconds = {cfg.health.hang_min_seconds:g} is not below "
            f"parallel.distributed_timeout_minutes = {cfg.parallel.distributed_timeout_minutes:g} ({timeout_s:g} s): "
            "a stuck collective would time out before the watchdog dumps the stacks; lower "
            "health.hang_min_seconds, raise parallel.distributed_timeout_minutes, or set health.watchdog = false"
        )
    if cfg.checkpoint.finetune and not cfg.checkpoint.load:
        problems.append(
            "checkpoint.finetune = true needs checkpoint.load: the checkpoint whose weights to start from"
        )
    problems += _fast_path_consistency(cfg)
    return problems + (_deepspeed_problems(cfg) if cfg.engine == "deepspeed" else _megatron_problems(cfg))


def _fast_path_consistency(cfg: TrainConfig) -> list[str]:
    """The GPU fast path's keys against each other (docs/trainer.md, "GPU fast path")."""
    p, f = cfg.parallel, cfg.fp8
    problems = [
        f"parallel.{key} = {getattr(p, key)!r} is set but parallel.recompute = {p.recompute!r}; it chooses the "
        "layers of full recompute only: set parallel.recompute: full, or remove it"
        for key, default in (("recompute_method", "uniform"), ("recompute_num_layers", 1))
        if getattr(p, key) != default and p.recompute != "full"
    ]
    if f.format is not None and cfg.precision != "bf16":
        problems.append(
            f"fp8.format = {f.format!r} needs precision: bf16 (got {cfg.precision!r}): FP8 GEMMs run inside "
            "bf16 training, whose weights and gradients stay bf16/fp32"
        )
    if f.format is None and f.recipe != "delayed":
        problems.append(
            f"fp8.recipe = {f.recipe!r} is set but fp8.format is null (FP8 off); set fp8.format: hybrid "
            "(or e4m3), or remove fp8.recipe"
        )
    if p.overlap_param_gather and not p.use_distributed_optimizer:
        problems.append(
            "parallel.overlap_param_gather = true needs parallel.use_distributed_optimizer = true: only the "
            "distributed optimizer all-gathers the updated weights"
        )
    # megatron/training/arguments.py (core_r0.16.1): "Tensor parallel communication/GEMM overlap can happen
    # only when sequence parallelism is enabled".
    if p.tp_comm_overlap and not p.sequence_parallel:
        problems.append(
            "parallel.tp_comm_overlap = true needs parallel.sequence_parallel = true (and TP > 1): "
            "TransformerEngine overlaps the sequence-parallel all-gather and reduce-scatter with the GEMMs"
        )
    return problems


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
    cp = p.context_parallel_size
    names = "parallel.tensor_model_parallel_size x parallel.pipeline_model_parallel_size"
    short = "parallel.tensor_model_parallel_size x pipeline_model_parallel_size"
    sizes = f"{tp} x {pp}"
    if cp > 1:
        names, short, sizes = (
            f"{names} x context_parallel_size",
            f"{short} x context_parallel_size",
            f"{sizes} x {cp}",
        )
    mp = tp * pp * cp
    if world_size % mp:
        problems.append(f"world size {world_size} is not divisible by {names} = {sizes} = {mp}")
    elif p.data_parallel_size is not None and world_size != mp * p.data_parallel_size:
        problems.append(
            f"world size {world_size} != {short} x data_parallel_size = {sizes} x {p.data_parallel_size} = "
            f"{mp * p.data_parallel_size}; launch {mp * p.data_parallel_size} processes or set "
            f"parallel.data_parallel_size to {world_size // mp} (or null to derive it)"
        )
    else:
        dp = world_size // mp
        if s.global_batch_size % (s.micro_batch_size * dp):
            problems.append(
                f"schedule.global_batch_size = {s.global_batch_size} is not divisible by "
                f"schedule.micro_batch_size x data parallel size = {s.micro_batch_size} x {dp}"
            )
        elif vp > 1 and (s.global_batch_size // (s.micro_batch_size * dp)) % pp:
            micro_batches = s.global_batch_size // (s.micro_batch_size * dp)
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


def data_problems(cfg: TrainConfig) -> list[str]:
    """Prepared datasets and tokenizer: present, made for each other, and fitting the model's vocabulary."""
    from trainer.data import DataError  # tokenizers only; still no torch
    from trainer.data.datasets import check_every_split_has_documents, check_tokenizer_matches_dataset
    from trainer.data.tokenizer import load_tokenizer

    try:
        tokenizer = load_tokenizer(cfg.data.tokenizer_path)
    except DataError as error:
        return [f"data.tokenizer_path = {cfg.data.tokenizer_path!r}: {error}"]
    problems = []
    for i, prefix in enumerate(cfg.data.prefixes):
        try:
            check_tokenizer_matches_dataset(prefix, tokenizer)
        except DataError as error:
            problems.append(f"data.prefixes[{i}] = {prefix!r}: {error}")
    if not problems:  # megatron-core would wait forever for samples from a split without documents
        try:
            check_every_split_has_documents(cfg.data.prefixes, cfg.data.split)
        except DataError as error:
            problems.append(f"data.split = {cfg.data.split!r}: {error}")
    if cfg.model.vocab_size is not None and cfg.model.vocab_size < tokenizer.vocab_size:
        problems.append(
            f"model.vocab_size = {cfg.model.vocab_size} is below the tokenizer's vocabulary "
            f"({tokenizer.vocab_size}, {cfg.data.tokenizer_path}); raise it or leave it unset to use the tokenizer's"
        )
    return problems


def validate_layout(
    cfg: TrainConfig,
    world_size: int,
    device: Literal["cpu", "cuda"],
    accelerator: tuple[bool, tuple[int, int]] | None = None,
) -> None:
    """Raise a ConfigError unless `cfg` can run on `world_size` processes of `device`; on GPUs `accelerator`
    (TransformerEngine installed, compute capability) checks the fast path too."""
    problems = layout_problems(cfg, world_size, device)
    if accelerator is not None:
        problems += accelerator_problems(cfg, *accelerator)
    if problems:
        raise ConfigError(problems)


AUTO = "auto"
LAYOUT_KEYS = (
    "parallel.tensor_model_parallel_size",
    "parallel.pipeline_model_parallel_size",
    "parallel.virtual_pipeline_model_parallel_size",
    "parallel.sequence_parallel",
    "parallel.use_distributed_optimizer",
    "parallel.recompute",
    "schedule.micro_batch_size",
    # The GPU fast path (docs/trainer.md): context parallelism, partial recompute, overlap, FP8.
    "parallel.context_parallel_size",
    "parallel.recompute_method",
    "parallel.recompute_num_layers",
    "parallel.overlap_grad_reduce",
    "parallel.overlap_param_gather",
    "parallel.tp_comm_overlap",
    "fp8.format",
    "fp8.recipe",
)


def load_config(
    path: str | Path, overrides: list[str] = (), device: Literal["cpu", "cuda"] | None = None
) -> TrainConfig:
    """Read a YAML config, apply `section.key=value` overrides, and validate the result. `precision: auto`
    becomes the precision `device` computes natively (None: this machine's device; cluster tools say cuda)."""
    path = Path(path)
    raw = _read_raw(path, overrides)
    choice = _resolve_precision(raw, device, path)
    if planned := _auto_keys(raw):
        raise ConfigError(
            [
                f"{key} = {AUTO}: the planner chooses it when submitting (make train STACK=<env>), or run "
                f"`python -m trainer plan --config {path} ... --out FILE` and train FILE; give a value to run here"
                for key in planned
            ],
            str(path),
        )
    try:
        cfg = TrainConfig.model_validate(raw)
        cfg._precision_choice = choice
        return cfg
    except ConfigError as e:
        raise ConfigError(e.problems, str(path)) from None
    except ValidationError as e:
        raise ConfigError([_describe(error) for error in e.errors()], str(path)) from None


def _resolve_precision(
    raw: dict[str, Any], device: Literal["cpu", "cuda"] | None, path: Path
) -> PrecisionChoice | None:
    """Replace `precision: auto` in `raw` by this machine's native precision; what was chosen and why."""
    from trainer.model.precision import AUTO as AUTO_PRECISION
    from trainer.model.precision import PRECISIONS

    value = raw.get("precision")
    if value != AUTO_PRECISION:
        if value is not None and value not in PRECISIONS:
            raise ConfigError(
                [
                    f"precision = {value!r}: use bf16 (bf16 weights and compute, fp32 master weights), fp32, or "
                    f"{AUTO_PRECISION} (bf16 where this machine computes it natively, else fp32)"
                ],
                str(path),
            )
        return None
    from trainer.model.precision import choose_precision, local_device  # imports torch: only for `auto`

    choice = choose_precision(device or local_device())
    raw["precision"] = choice.precision
    return choice


def auto_keys(path: str | Path, overrides: list[str] = ()) -> list[str]:
    """The LAYOUT_KEYS that the config (with overrides) leaves to the planner."""
    return _auto_keys(_read_raw(Path(path), overrides))


def _read_raw(path: Path, overrides: list[str]) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError([f"config file {str(path)!r} not found"])
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigError(
            [f"the top level must be a mapping of sections, got {type(raw).__name__}"], str(path)
        )
    raw.setdefault("name", path.stem)
    try:
        for override in overrides:
            _apply_override(raw, override)
    except ConfigError as e:
        raise ConfigError(e.problems, str(path)) from None
    return raw


def _auto_keys(raw: dict[str, Any]) -> list[str]:
    def value(key: str) -> Any:
        section, name = key.split(".")
        node = raw.get(section)
        return node.get(name) if isinstance(node, dict) else None

    return [key for key in LAYOUT_KEYS if value(key) == AUTO]


def _apply_override(raw: dict[str, Any], override: str) -> None:
    key, sep, text = override.partition("=")
    if not sep:
        raise ConfigError([f"--set {override!r} is not of the form section.key=value"])
    model: type[BaseModel] = TrainConfig
    node = raw
    parts = key.split(".")
    for depth, part in enumerate(parts):
        fields = model.model_fields
        if part not in fields:
            raise ConfigError([f"--set {override!r}: {_unknown_key(parts[: depth + 1], fields)}"])
        annotation = fields[part].annotation
        if depth == len(parts) - 1:
            node[part] = _typed_value(annotation, text)
        elif getattr(annotation, "__origin__", None) is dict:  # free-form keys (deepspeed:), any depth
            node = node.setdefault(part, {})
            for key in parts[depth + 1 : -1]:
                node = node.setdefault(key, {})
            node[parts[-1]] = yaml.safe_load(text)
            return
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
            node = node.setdefault(part, {})
        else:
            raise ConfigError([f"--set {override!r}: {'.'.join(parts[: depth + 1])} has no sub-keys"])


def _typed_value(annotation: Any, text: str) -> Any:
    """The value's YAML reading (numbers, null, lists, booleans), or the raw text where the field wants a string."""
    parsed = yaml.safe_load(text)
    for candidate in (parsed, text):
        try:
            TypeAdapter(annotation).validate_python(candidate)
            return candidate
        except ValidationError:
            pass
    return parsed  # invalid either way: validation reports it


def _unknown_key(parts: list[str] | tuple, valid: dict[str, Any]) -> str:
    dotted = ".".join(str(p) for p in parts)
    close = difflib.get_close_matches(str(parts[-1]), list(valid), n=1)
    hint = f"did you mean {'.'.join([*map(str, parts[:-1]), close[0]])!r}?" if close else ""
    return f"unknown key {dotted!r}; {hint or 'valid keys here: ' + ', '.join(valid)}"


def _describe(error: dict[str, Any]) -> str:
    loc = error["loc"]
    dotted = ".".join(str(p) for p in loc)
    if error["type"] == "extra_forbidden":
        model: type[BaseModel] = TrainConfig
        for part in loc[:-1]:
            annotation = model.model_fields[part].annotation
            if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
                break
            model = annotation
        return _unknown_key(loc, model.model_fields)
    if error["type"] == "missing":
        return f"{dotted} is required but missing"
    message = error["msg"].removeprefix("Value error, ")
    return f"{dotted} = {error['input']!r}: {message}"
