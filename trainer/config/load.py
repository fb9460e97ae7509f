"""Reading a trainer config: YAML, then `--set section.key=value` overrides, then validation (schema.py, and
checks.py's consistency checks), with `auto` resolved or refused. Every error names the dotted key, the bad value
and what would be valid.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from trainer.config.checks import consistency_problems
from trainer.config.schema import ConfigError, TrainConfig

if TYPE_CHECKING:
    from trainer.config.precision import PrecisionChoice

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
    path: str | Path, overrides: Sequence[str] = (), device: Literal["cpu", "cuda"] | None = None
) -> TrainConfig:
    """Read a YAML config, apply `section.key=value` overrides, and validate the result. `precision: auto`
    becomes the precision `device` computes natively (None: this machine's device; cluster tools say cuda)."""
    path = Path(path)
    raw = read_raw(path, overrides)
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
    except ValidationError as e:
        raise ConfigError([_describe(error) for error in e.errors()], str(path)) from None
    problems = consistency_problems(cfg)
    if problems:
        raise ConfigError(problems, str(path))
    cfg._precision_choice = choice
    return cfg


def _resolve_precision(
    raw: dict[str, Any], device: Literal["cpu", "cuda"] | None, path: Path
) -> PrecisionChoice | None:
    """Replace `precision: auto` in `raw` by this machine's native precision; what was chosen and why."""
    from trainer.config.precision import AUTO as AUTO_PRECISION
    from trainer.config.precision import PRECISIONS

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
    from trainer.config.precision import choose_precision, local_device  # imports torch: only for `auto`

    choice = choose_precision(device or local_device())
    raw["precision"] = choice.precision
    return choice


def auto_keys(path: str | Path, overrides: Sequence[str] = ()) -> list[str]:
    """The LAYOUT_KEYS that the config (with overrides) leaves to the planner."""
    return _auto_keys(read_raw(Path(path), overrides))


def read_raw(path: Path, overrides: Sequence[str]) -> dict[str, Any]:
    """The YAML with the overrides applied, before validation: what a derived config file writes out."""
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


def _describe(error: ErrorDetails) -> str:
    loc = error["loc"]
    dotted = ".".join(str(p) for p in loc)
    if error["type"] == "extra_forbidden":
        model: type[BaseModel] = TrainConfig
        for part in loc[:-1]:
            annotation = model.model_fields[str(part)].annotation  # pydantic types loc parts int | str
            if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
                break
            model = annotation
        return _unknown_key(loc, model.model_fields)
    if error["type"] == "missing":
        return f"{dotted} is required but missing"
    message = error["msg"].removeprefix("Value error, ")
    return f"{dotted} = {error['input']!r}: {message}"
