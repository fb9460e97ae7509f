"""Reading a trainer config: YAML, then `--set section.key=value` overrides, then validation (schema.py, and
checks.py's consistency checks), with `auto` resolved or refused. Every error names the dotted key, the bad value
and what would be valid.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from trainer.config.checks import consistency_problems
from trainer.config.schema import ConfigError, TrainConfig
from trainer.device import device_type

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
    from trainer.config.precision import choose_precision  # imports torch: only for `auto`

    choice = choose_precision(device or device_type())
    raw["precision"] = choice.precision
    return choice


def auto_keys(path: str | Path, overrides: Sequence[str] = ()) -> list[str]:
    """The LAYOUT_KEYS that the config (with overrides) leaves to the planner."""
    return _auto_keys(read_raw(Path(path), overrides))


def read_raw(path: Path, overrides: Sequence[str]) -> dict[str, Any]:
    """The YAML with the overrides applied, before validation: what a derived config file writes out."""
    if not path.is_file():
        raise ConfigError([f"config file {str(path)!r} not found"])
    raw = read_yaml(path) or {}
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


def read_yaml(path: Path, what: str = "trainer config") -> Any:
    """The YAML document in `path`, refused (ConfigError) when it is not YAML or a mapping repeats a key. YAML's
    mapping keys are unique (YAML 1.2.2 spec, https://yaml.org/spec/1.2.2/#mapping), but PyYAML keeps the last
    value silently (yaml/pyyaml#165, open: merge keys make a fix in the constructor hard), so repeated keys are
    looked for on the composed nodes, before construction, where each key still has its line."""
    try:
        loader = yaml.SafeLoader(path.read_text())
    except yaml.YAMLError as error:  # characters YAML does not allow
        raise ConfigError([_yaml_problem(error)], str(path), what=what) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if problems := list(_repeated_keys(node, ())):
            raise ConfigError(problems, str(path), what=what)
        return loader.construct_document(node)
    except yaml.YAMLError as error:
        raise ConfigError([_yaml_problem(error)], str(path), what=what) from None
    finally:
        loader.dispose()


def _yaml_problem(error: yaml.YAMLError) -> str:
    if not isinstance(error, yaml.MarkedYAMLError) or error.problem_mark is None:
        return "not valid YAML: " + " ".join(str(error).split())
    mark = error.problem_mark
    what = " ".join(part for part in (error.context, error.problem) if part)
    return f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {what}"


def _repeated_keys(node: yaml.Node, at: tuple[str, ...]) -> Iterator[str]:
    """Each key that a mapping under `node` repeats, by its dotted key and both lines."""
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _repeated_keys(item, (*at, str(index)))
    if not isinstance(node, yaml.MappingNode):
        return
    first: dict[tuple[str, str], int] = {}
    for key, value in node.value:
        if key.tag == "tag:yaml.org,2002:merge" or not isinstance(key, yaml.ScalarNode):
            continue  # `<<: *defaults`: merged keys may be overridden, by design
        line = key.start_mark.line + 1
        dotted = ".".join((*at, key.value))
        if (key.tag, key.value) in first:
            yield (
                f"{dotted} is given twice, on line {first[key.tag, key.value]} and on line {line}: "
                "YAML keys must be unique; keep the one you mean and delete the other"
            )
        else:
            first[key.tag, key.value] = line
        yield from _repeated_keys(value, (*at, key.value))


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
    if error["type"] == "finite_number":  # inf or nan where the schema wants a number: say which numbers
        message = f"must be a finite number{_bounds(loc)}"
    return f"{dotted} = {error['input']!r}: {message}"


def _bounds(loc: tuple[int | str, ...]) -> str:
    """The bounds the schema sets on the number at `loc` (' > 0', ' >= 0 and < 1'), or ''."""
    model: type[BaseModel] = TrainConfig
    field = None
    for part in loc:
        if field is not None:  # inside a list's items: the items' own annotation holds the bounds
            break
        field = model.model_fields.get(str(part))
        if field is None:
            return ""
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model, field = annotation, None
    if field is None:
        return ""
    metadata = [*field.metadata, *_nested_metadata(field.annotation)]
    signs = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    bounds = [
        f"{sign} {getattr(m, name):g}" for m in metadata for name, sign in signs.items() if hasattr(m, name)
    ]
    return " " + " and ".join(bounds) if bounds else ""


def _nested_metadata(annotation: Any) -> list[Any]:
    """The constraints inside an annotation: `PositiveFloat | None` and `list[PositiveFloat]` keep theirs there."""
    found: list[Any] = []
    for arg in get_args(annotation):
        if get_origin(arg) is Annotated:
            found.extend(get_args(arg)[1:])
        else:
            found.extend(_nested_metadata(arg))
    return found
