"""The trainer config's schema: one typed tree of sections, each with the checks that need only its own keys.

Names follow megatron-core (`tensor_model_parallel_size`, `micro_batch_size`, ...). Checks across sections, and
against a world size, a device or the data, are trainer/config/checks.py's; reading YAML and `--set` is load.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    PrivateAttr,
)

from trainer.contract.catalog import FP8Recipe
from trainer.monitoring.config import MonitoringConfig

if TYPE_CHECKING:
    from trainer.config.precision import PrecisionChoice


class ConfigError(Exception):
    """A trainer config that cannot run; one line per problem."""

    def __init__(self, problems: list[str], source: str | None = None, *, what: str = "trainer config"):
        self.problems = problems
        where = f" ({source})" if source else ""
        super().__init__(f"invalid {what}{where}:\n" + "\n".join(f"  - {p}" for p in problems))


class _Section(BaseModel):
    # Every number finite: no setting gives infinity a meaning, and an lr of inf trained until five non-finite
    # steps in a row stopped the run.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


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

    def problems(self) -> list[str]:
        problems = []
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            problems.append(
                f"model.hidden_size = {self.hidden_size} is not divisible by model.num_attention_heads = "
                f"{self.num_attention_heads}; change either, or set model.kv_channels (the head dimension)"
            )
        if self.num_attention_heads % self.query_groups:
            problems.append(
                f"model.num_attention_heads = {self.num_attention_heads} is not divisible by "
                f"model.num_query_groups = {self.query_groups}; each query group must hold the same number of heads"
            )
        return problems


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
    # The distributed optimizer's weight all-gather during the next forward.
    overlap_param_gather: bool = False
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

    def problems(self) -> list[str]:
        """The GPU fast path's parallel keys against each other (docs/trainer.md, "GPU fast path")."""
        problems = [
            f"parallel.{key} = {getattr(self, key)!r} is set but parallel.recompute = {self.recompute!r}; it "
            "chooses the layers of full recompute only: set parallel.recompute: full, or remove it"
            for key, default in (("recompute_method", "uniform"), ("recompute_num_layers", 1))
            if getattr(self, key) != default and self.recompute != "full"
        ]
        if self.overlap_param_gather and not self.use_distributed_optimizer:
            problems.append(
                "parallel.overlap_param_gather = true needs parallel.use_distributed_optimizer = true: only the "
                "distributed optimizer all-gathers the updated weights"
            )
        # megatron/training/arguments.py (core_r0.16.1): "Tensor parallel communication/GEMM overlap can happen
        # only when sequence parallelism is enabled".
        if self.tp_comm_overlap and not self.sequence_parallel:
            problems.append(
                "parallel.tp_comm_overlap = true needs parallel.sequence_parallel = true (and TP > 1): "
                "TransformerEngine overlaps the sequence-parallel all-gather and reduce-scatter with the GEMMs"
            )
        return problems


class FP8Config(_Section):
    """FP8 GEMMs through TransformerEngine (megatron-core TransformerConfig.fp8 / fp8_recipe); weights, master
    weights, gradients and checkpoints stay bf16/fp32, so an FP8-trained checkpoint loads in bf16."""

    format: Literal["e4m3", "hybrid"] | None = None  # None: no FP8; hybrid: e4m3 forward, e5m2 gradients
    # delayed: per-tensor scale from an amax history; tensorwise: per-tensor current scaling (Hopper and later);
    # mxfp8: one scale per 32 values, Blackwell (SM 10.0) only.
    recipe: FP8Recipe = "delayed"

    def problems(self) -> list[str]:
        if self.format is None and self.recipe != "delayed":
            return [
                f"fp8.recipe = {self.recipe!r} is set but fp8.format is null (FP8 off); set fp8.format: hybrid "
                "(or e4m3), or remove fp8.recipe"
            ]
        return []


class FusionConfig(_Section):
    """Fused kernels megatron-core takes from TransformerEngine (GPUs with TE only)."""

    gradient_accumulation_fusion: bool = False  # weight-gradient GEMMs accumulate into DDP's fp32 main_grad
    cross_entropy_loss_fusion: bool = False  # TE's fused vocab-parallel cross entropy


class ZeroConfig(_Section):
    """DeepSpeed ZeRO (engine: deepspeed): what is sharded over the data-parallel ranks, and what lives in host memory.

    Stage 1 shards the fp32 master weights and Adam moments, 2 also the gradients, 3 also the weights."""

    stage: Literal[1, 2, 3] = 2
    # Master weights + Adam moments in host memory (stage 2/3).
    offload_optimizer: Literal["none", "cpu"] = "none"
    offload_param: Literal["none", "cpu"] = "none"  # weights in host memory, fetched layer by layer (stage 3)


class DataConfig(_Section):
    prefixes: list[str] = Field(min_length=1)  # prepared datasets: PREFIX.bin / PREFIX.idx
    weights: list[PositiveFloat] | None = None  # blend weights, one per prefix; None: by size
    split: str = Field("969,30,1", pattern=r"^\d+(\.\d+)?,\d+(\.\d+)?,\d+(\.\d+)?$")  # train,valid,test
    seq_length: PositiveInt
    tokenizer_path: str
    cache_dir: str | None = None  # None: beside the run
    # chat: fine-tuning samples packed from `prepare --format chat` conversations (trainer/data/packing.py)
    format: Literal["text", "chat"] = "text"

    def problems(self) -> list[str]:
        problems = []
        if self.format == "chat" and (len(self.prefixes) > 1 or self.weights is not None):
            problems.append(
                f"data.format = 'chat' packs one chat dataset; data.prefixes has {len(self.prefixes)} "
                "(prepare the conversations together into one, and give no data.weights)"
            )
        if self.weights is not None and len(self.weights) != len(self.prefixes):
            problems.append(
                f"data.weights = {self.weights} has {len(self.weights)} entries but data.prefixes has "
                f"{len(self.prefixes)}; give one weight per prefix, or none"
            )
        train_weight, valid_weight = (float(weight) for weight in self.split.split(",")[:2])
        if not (train_weight and valid_weight):
            problems.append(
                f"data.split = {self.split!r}: the train and validation weights must be above 0 (training "
                "evaluates the validation split at the start and every schedule.eval_interval steps), e.g. "
                "'969,30,1'"
            )
        return problems


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

    def problems(self) -> list[str]:
        return (
            [f"optimizer.min_lr = {self.min_lr} is above optimizer.lr = {self.lr}"]
            if self.min_lr > self.lr
            else []
        )


class ScheduleConfig(_Section):
    train_iters: PositiveInt
    micro_batch_size: PositiveInt
    global_batch_size: PositiveInt
    lr_warmup_iters: NonNegativeInt = 0
    lr_decay_style: Literal["cosine", "linear", "constant"] = "cosine"
    lr_decay_iters: PositiveInt | None = None  # None: train_iters
    eval_interval: PositiveInt = 100
    eval_iters: PositiveInt = 10

    def problems(self) -> list[str]:
        decay_iters = self.lr_decay_iters or self.train_iters
        if self.lr_warmup_iters >= decay_iters:
            return [
                f"schedule.lr_warmup_iters = {self.lr_warmup_iters} must be below the decay length "
                f"(schedule.lr_decay_iters, default schedule.train_iters) = {decay_iters}"
            ]
        return []


class CheckpointConfig(_Section):
    save_interval: PositiveInt | None = None  # None: only at the end
    # Retention (trainer/checkpoint/store.py retained): the newest keep_last, plus the keep_best of lowest
    # validation loss among those saved at an evaluation step; the newest intact one is never deleted.
    keep_last: PositiveInt = 2
    keep_best: NonNegativeInt = 0
    dir: str | None = None  # None: <run_dir>/checkpoints
    resume: bool = True  # continue from the newest complete checkpoint when there is one
    # Start from another checkpoint (a checkpoint directory, or a directory with `latest`, e.g. from `convert`)
    # until this run has saved its own, which take precedence.
    load: str | None = None
    # From `load`: the weights only (step, samples, optimizer and LR schedule start afresh).
    finetune: bool = False
    # Checkpoint speed and resume checks (trainer/checkpoint/checkpointer.py, writer.py, settings.py):
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

    def problems(self) -> list[str]:
        if self.finetune and not self.load:
            return [
                "checkpoint.finetune = true needs checkpoint.load: the checkpoint whose weights to start from"
            ]
        return []


class LoggingConfig(_Section):
    run_dir: str | None = None  # None: runs/<name>
    log_interval: PositiveInt = 1
    tensorboard: bool = True
    peak_tflops_per_device: PositiveFloat | None = None  # None: the instance catalog's, by GPU model


class EvaluationConfig(_Section):
    """Evaluation during training: the suite (docs/evaluate.md) run on the newest checkpoint in a process of its
    own, every `interval` steps and after the last; results in metrics.jsonl, TensorBoard, Prometheus, CloudWatch."""

    suite: str | None = None  # None: no evaluation during training
    interval: PositiveInt | None = None  # None: at every checkpoint save; else a multiple of save_interval


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


class BudgetConfig(_Section):
    """The run's hard cap (trainer/cost/ledger.py): at a step boundary where the ledger reaches either cap the run
    saves and exits 0. A resumed run counts what was already spent (the ledger is stored with the checkpoints)."""

    max_dollars: PositiveFloat | None = None  # US dollars over every attempt; None: no dollar cap
    max_hours: PositiveFloat | None = None  # paid wall-clock hours over every attempt; None: no time cap
    # US dollars per node-hour; overrides the price list. On a local run it is the only price.
    price_per_hour: PositiveFloat | None = None


class TrackingConfig(_Section):
    """MLflow tracking (trainer/tracking/): the run's config, metrics and model version, logged when it ends."""

    mlflow: bool = False
    # None: the local store sqlite:///runs/mlflow.db; on a stack a tracking server's URI (docs/automl.md)
    uri: str | None = None
    experiment: str | None = None  # None: the run's name


class TrainConfig(_Section):
    name: str = Field(min_length=1)  # defaults to the config file's stem
    seed: NonNegativeInt = 1234
    # bf16: bf16 weights and compute, fp32 master weights; fp32. In a YAML file or --set, `auto` picks what this
    # machine computes natively (trainer/config/precision.py), and load_config resolves it to one of these.
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
    evaluation: EvaluationConfig = EvaluationConfig()
    health: HealthConfig = HealthConfig()
    budget: BudgetConfig = BudgetConfig()  # cost cap and price: docs/cost.md
    tracking: TrackingConfig = TrackingConfig()  # MLflow: docs/automl.md

    _precision_choice: PrecisionChoice | None = PrivateAttr(None)  # set when `precision: auto` chose

    @property
    def precision_choice(self) -> PrecisionChoice | None:
        """What `precision: auto` chose on this machine and why; None when the config named the precision."""
        return self._precision_choice

    @property
    def run_dir(self) -> Path:
        return Path(self.logging.run_dir or Path("runs") / self.name)

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else self.run_dir / "checkpoints"
