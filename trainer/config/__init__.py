"""The trainer's configuration: one typed tree, loaded from YAML with `--set section.key=value` overrides.

    schema      the sections and TrainConfig (pydantic, unknown keys refused), each section with its own checks
    checks      checks across sections and against a world size, a device and the accelerator (the prepared
                data's live with the data: trainer/data/datasets.py)
    precision   `precision: auto`: what this machine computes natively (torch imported only to look)
    layout      ParallelDims: the (TP, PP, CP, DP) layout of a world, validated once, torch-free
    load        YAML and --set overrides into a validated TrainConfig; `auto` keys resolved or refused

Nothing here imports torch or megatron-core at its top, nor any trainer package but the contract and monitoring's
section: the cluster-job tool and the planner use it to check a layout against
a node count before anything starts.
"""

from trainer.config.checks import accelerator_problems, consistency_problems, layout_problems
from trainer.config.layout import ParallelDims
from trainer.config.load import AUTO, LAYOUT_KEYS, auto_keys, load_config
from trainer.config.schema import (
    BudgetConfig,
    CheckpointConfig,
    ConfigError,
    DataConfig,
    FP8Config,
    FusionConfig,
    HealthConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    ScheduleConfig,
    TrackingConfig,
    TrainConfig,
    ZeroConfig,
)

__all__ = [
    "AUTO",
    "LAYOUT_KEYS",
    "BudgetConfig",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "FP8Config",
    "FusionConfig",
    "HealthConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ParallelConfig",
    "ParallelDims",
    "ScheduleConfig",
    "TrackingConfig",
    "TrainConfig",
    "ZeroConfig",
    "accelerator_problems",
    "auto_keys",
    "consistency_problems",
    "layout_problems",
    "load_config",
]
