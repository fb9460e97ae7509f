"""A sweep's declaration, read from a YAML beside its recipe (trainer/configs/local-sweep.yaml): the recipe, how many
trials, the sampler and the pruner, the `--set` overrides every trial shares (its shape), and the search space: one
dimension per config key, a float or int range (log-scaled where asked) or a list of choices.

    recipe: local.yaml             # beside this file
    trials: 16
    sampler: {seed: 0, startup_trials: 5}
    pruner: {kind: successive_halving, min_resource: 10, reduction_factor: 3}
    set: {schedule.train_iters: 60, ...}
    space:
      optimizer.lr: {low: 1.0e-3, high: 3.0e-2, log: true}
      schedule.global_batch_size: {choices: [8, 16]}

Everything is checked before a trial starts: the keys against the trainer's config, the ranges, and the recipe
with the shared overrides and each dimension's ends (a range whose end the trainer refuses is an error here, not a
failed trial later)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import optuna
import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, model_validator

from trainer.config import ConfigError, TrainConfig, layout_problems, load_config
from trainer.config.load import read_raw, read_yaml


class SweepError(ConfigError):
    """A sweep that cannot run: one line per problem, each naming the key, the bad value and what would do."""

    def __init__(self, problems: list[str], source: str | None = None):
        super().__init__(problems, source, what="sweep")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Dimension(_Strict):
    """A range (`low`, `high`; `log`; `step` for integers) or `choices`."""

    low: float | None = None
    high: float | None = None
    log: bool = False
    step: int | None = Field(None, gt=0)  # integers: the range's step (no log scale with a step other than 1)
    choices: list[int | float | str | bool] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Dimension:
        if self.choices is not None:
            if self.low is not None or self.high is not None or self.log or self.step is not None:
                raise ValueError("give either choices or low/high (with log or step), not both")
            if not self.choices:
                raise ValueError("choices is empty: list at least one value")
            return self
        if self.low is None or self.high is None:
            raise ValueError("give low and high (a range) or choices (a list)")
        if self.low >= self.high:
            raise ValueError(f"low = {self.low} is not below high = {self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"log = true needs low > 0, got low = {self.low}")
        if self.step is not None and (self.low != int(self.low) or self.high != int(self.high)):
            raise ValueError("step makes an integer range: low and high must be whole numbers")
        if self.step is not None and self.log and self.step != 1:
            raise ValueError("a log-scaled integer range takes no step (Optuna: IntDistribution)")
        return self

    def distribution(self) -> optuna.distributions.BaseDistribution:
        if self.choices is not None:
            return optuna.distributions.CategoricalDistribution(self.choices)
        assert self.low is not None and self.high is not None  # _one_kind
        if self.step is not None:
            return optuna.distributions.IntDistribution(
                int(self.low), int(self.high), log=self.log, step=self.step
            )
        return optuna.distributions.FloatDistribution(self.low, self.high, log=self.log)

    def ends(self) -> list[Any]:
        """The values a trial may take at the edges of this dimension (all of them for choices)."""
        if self.choices is not None:
            return list(self.choices)
        if self.step is not None:
            assert self.low is not None and self.high is not None
            return [int(self.low), int(self.low) + (int(self.high) - int(self.low)) // self.step * self.step]
        return [self.low, self.high]


class Sampler(_Strict):
    """Optuna's TPE sampler (optuna.samplers.TPESampler), random search (optuna.samplers.RandomSampler: the
    benchmark's baseline), or an exhaustive grid of a space of choices (optuna.samplers.GridSampler: each
    combination once)."""

    kind: Literal["tpe", "random", "grid"] = "tpe"
    seed: int | None = 0
    # TPE: random trials before it models the results (TPESampler n_startup_trials)
    startup_trials: PositiveInt = 5

    def build(self, space: dict[str, Dimension], stored_trials: int) -> optuna.samplers.BaseSampler:
        # A resumed study's sampler starts from a seed moved on by the trials stored, so that it does not draw
        # the first trials' parameters again.
        seed = None if self.seed is None else self.seed + stored_trials
        if self.kind == "grid":
            grid = {key: list(dimension.choices or []) for key, dimension in space.items()}
            return optuna.samplers.GridSampler(grid, seed=seed)
        if self.kind == "random":
            # TPE's startup trials are this sampler's draws from the same seed (TPESampler._random_sampler,
            # optuna/samplers/_tpe/sampler.py, v5.1.0): a random search shares a TPE sweep's first draws.
            return optuna.samplers.RandomSampler(seed=seed)
        return optuna.samplers.TPESampler(n_startup_trials=self.startup_trials, seed=seed)


class Pruner(_Strict):
    """What stops a trial whose validation loss at an evaluation step is behind the others'."""

    kind: Literal["successive_halving", "hyperband", "median", "none"] = "successive_halving"
    min_resource: PositiveInt = 10  # steps a trial trains before it may be stopped
    reduction_factor: int = Field(3, ge=2)  # successive halving and Hyperband: keep 1 in this many per rung
    warmup_steps: int = Field(0, ge=0)  # median: steps before it prunes
    # What a rung's steps count (issue 48 item 2): "step", the trial's own steps; "past_warmup", the steps since its
    # own learning-rate warm-up ended, so that trials are compared at equal progress at their full learning rate.
    progress: Literal["step", "past_warmup"] = "step"

    def offset(self, warmup: int) -> int:
        """The steps a trial with this warm-up has its evaluations moved back by before the pruner sees them."""
        return warmup if self.progress == "past_warmup" else 0

    def build(self, train_iters: int) -> optuna.pruners.BasePruner:
        if self.kind == "successive_halving":
            return optuna.pruners.SuccessiveHalvingPruner(
                min_resource=self.min_resource, reduction_factor=self.reduction_factor
            )
        if self.kind == "hyperband":
            return optuna.pruners.HyperbandPruner(
                min_resource=self.min_resource,
                max_resource=train_iters,
                reduction_factor=self.reduction_factor,
            )
        if self.kind == "median":
            # min_resource as the other kinds read it: no pruning before a trial has trained that many steps
            # (MedianPruner n_warmup_steps, optuna/pruners/_median.py, v5.1.0).
            return optuna.pruners.MedianPruner(n_warmup_steps=max(self.min_resource, self.warmup_steps))
        return optuna.pruners.NopPruner()


class Evaluation(_Strict):
    """How a finished trial is valued and the winner confirmed: its last checkpoint scored on one fixed held-out
    set (the same windows of the validation split for every trial and seed), and the best and the recipe's values
    trained again on `seeds` more seeds before the best is called better."""

    sequences: PositiveInt = 512  # held-out windows of the trials' data.seq_length + 1 tokens
    seeds: int = Field(2, ge=0)  # more seeds for the best and the recipe's values (0: no confirmation)


class SweepSpec(_Strict):
    recipe: str  # the trainer config, relative to this file
    trials: PositiveInt = 16
    sampler: Sampler = Sampler()
    pruner: Pruner = Pruner()
    evaluation: Evaluation = Evaluation()
    set: dict[str, Any] = {}  # --set overrides every trial shares (its shape)
    # Trial 0's values where the recipe's own do not fit the trial shape (a warm-up longer than the trials' runs)
    baseline: dict[str, Any] = {}
    space: dict[str, Dimension]

    @model_validator(mode="after")
    def _space(self) -> SweepSpec:
        if not self.space:
            raise ValueError("space is empty: declare at least one dimension (e.g. optimizer.lr)")
        if shared := sorted(set(self.space) & set(self.set)):
            raise ValueError(f"{', '.join(shared)} in both set and space: a key is either fixed or searched")
        if unknown := sorted(set(self.baseline) - set(self.space)):
            raise ValueError(
                f"baseline names {', '.join(unknown)}, not in space: give values of searched keys"
            )
        if self.sampler.kind == "grid" and (
            ranges := sorted(k for k, d in self.space.items() if d.choices is None)
        ):
            raise ValueError(
                f"sampler.kind = grid needs choices for every dimension; {', '.join(ranges)} is a range"
            )
        return self

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return {key: dimension.distribution() for key, dimension in self.space.items()}


class Sweep:
    """A sweep spec with where it was read from: the recipe path and the overrides of a trial's parameters."""

    def __init__(self, path: Path, spec: SweepSpec, extra: tuple[str, ...] = ()):
        self.path, self.spec = path, spec
        self.recipe = (path.parent / spec.recipe).resolve()
        # --set from the command line over the spec's shared ones (e.g. schedule.train_iters for a quick look)
        self.shared = tuple(f"{key}={_text(value)}" for key, value in spec.set.items()) + extra

    @property
    def fingerprint(self) -> str:
        """What the stored study was made for: a rerun with another space or shape is refused, not mixed in."""
        spec = self.spec.model_dump(mode="json", exclude={"trials"})
        # the rule before pruner.progress existed: studies stored then still resume
        if spec["pruner"]["progress"] == "step":
            del spec["pruner"]["progress"]
        body = json.dumps({"spec": spec, "shared": self.shared}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def overrides(self, params: dict[str, Any]) -> list[str]:
        """A trial's whole --set list: the shared shape, then its parameters."""
        return [*self.shared, *self.param_overrides(params)]

    def param_overrides(self, params: dict[str, Any]) -> list[str]:
        """A trial's parameters as --set lines."""
        return [f"{key}={_text(value)}" for key, value in params.items()]

    def first_ends(self) -> dict[str, Any]:
        """Each dimension at its first end: with the shared shape a config the trainer takes (load_sweep checks
        it), where the recipe alone may not be (its warm-up longer than the trials' runs)."""
        return {key: dimension.ends()[0] for key, dimension in self.spec.space.items()}

    def recipe_params(self) -> dict[str, Any]:
        """Trial 0: the recipe's own value of each searched key (the recipe as it is, before the trial shape),
        or the sweep's `baseline` value where it gives one."""
        cfg = load_config(self.recipe).model_dump(mode="json")
        params = {}
        for key in self.spec.space:
            value: Any = cfg
            for part in key.split("."):
                value = value[part]
            params[key] = self.spec.baseline.get(key, value)
        return params

    def longest_warmup(self) -> int:
        """The most steps any trial's learning rate warms up for: the space's highest schedule.lr_warmup_iters, else
        the trials' fixed one; the recipe's own (trial 0) too."""
        fixed = self.trial_config().schedule.lr_warmup_iters
        dimension = self.spec.space.get(WARMUP)
        if dimension is None:
            return fixed
        ends = [int(end) for end in dimension.ends() if isinstance(end, (int, float))]
        recipe = self.recipe_params().get(WARMUP)
        return max([*ends, *([int(recipe)] if isinstance(recipe, (int, float)) else [])])

    def trial_config(self, more: Sequence[str] = ()) -> TrainConfig:
        """A trial's config: the shared shape at the first ends, then `more` overrides (a trial's parameters)."""
        return load_config(self.recipe, [*self.overrides(self.first_ends()), *more])

    def train_iters(self, more: Sequence[str] = ()) -> int:
        """The trial's train_iters (see trial_config)."""
        return self.trial_config(more).schedule.train_iters

    @property
    def recipe_fingerprint(self) -> str:
        """The recipe's content as the trainer reads it: a rerun after the recipe was edited is refused."""
        body = json.dumps(read_raw(self.recipe, ()), sort_keys=True, default=str)
        return hashlib.sha256(body.encode()).hexdigest()[:16]


def _text(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


WARMUP = "schedule.lr_warmup_iters"

World = tuple[int, Literal["cpu", "cuda"]]  # the processes a trial's `trainer train` starts, and their device


def load_sweep(path: str | Path, extra: tuple[str, ...] = (), world: World | None = None) -> Sweep:
    """Read and check a sweep YAML: every problem named with its key, the bad value and what would be valid.
    `world`: where its trials train (a stack node's GPUs); by default this machine, as a local sweep's do."""
    path = Path(path)
    if not path.is_file():
        raise SweepError([f"sweep file {str(path)!r} not found"])
    try:
        raw = read_yaml(path) or {}
    except ConfigError as error:  # not YAML, or a repeated key
        raise SweepError(error.problems, str(path)) from None
    if not isinstance(raw, dict):
        raise SweepError([f"the top level must be a mapping, got {type(raw).__name__}"], str(path))
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as error:
        raise SweepError(
            [
                f"{'.'.join(str(p) for p in e['loc'])} = {e.get('input')!r}: {e['msg'].removeprefix('Value error, ')}"
                for e in error.errors()
            ],
            str(path),
        ) from None
    recipe = (path.parent / spec.recipe).resolve()
    if not recipe.is_file():
        raise SweepError([f"recipe = {spec.recipe!r}: no such file beside {path}"], str(path))
    problems, integer_space = _integer_ranges(spec.space)
    if problems:
        raise SweepError(problems, str(path))
    sweep = Sweep(path, spec.model_copy(update={"space": integer_space}), extra)
    # The recipe with the shared shape, then each dimension at each of its ends: the trainer's own checks, and
    # its layout checks at the world size a trial runs on.
    base = sweep.first_ends()
    for key, dimension in sweep.spec.space.items():
        for end in dimension.ends():
            try:
                cfg = load_config(sweep.recipe, sweep.overrides({**base, key: end}))
            except ConfigError as error:
                problems += [f"space.{key} = {end!r}: {problem}" for problem in error.problems]
                continue
            world_size, device = world or _trial_world(cfg)
            problems += [
                f"space.{key} = {end!r}: {problem} (a trial's {world_size} {device} process(es))"
                for problem in layout_problems(cfg, world_size, device)
            ]
    if not problems:
        problems = _recipe_problems(sweep, world)
    if not problems:
        problems = _pruner_problems(sweep)
    if problems:
        raise SweepError(sorted(set(problems)), str(path))
    return sweep


def _integer_ranges(space: dict[str, Dimension]) -> tuple[list[str], dict[str, Dimension]]:
    """Ranges over integer config keys made integer ranges (Optuna's IntDistribution, step 1 unless given): a
    float drawn for one would fail every trial at the trainer's validation. Non-whole ends are refused."""
    problems, space = [], dict(space)
    for key, dimension in space.items():
        if dimension.choices is not None or dimension.step is not None or not _integer_key(key):
            continue
        assert dimension.low is not None and dimension.high is not None  # Dimension._one_kind
        for end, value in (("low", dimension.low), ("high", dimension.high)):
            if value != int(value):
                problems.append(
                    f"space.{key}.{end} = {value}: {key} is an integer in the trainer's config; give whole "
                    "numbers for low and high"
                )
        space[key] = dimension.model_copy(update={"step": 1})
    return problems, space


def _integer_key(key: str) -> bool:
    """Whether the trainer's config types `key` as an integer (the pydantic schema, trainer/config/schema.py)."""
    model: Any = TrainConfig
    annotation: Any = None
    for part in key.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return False  # unknown keys are the config loader's to name
        annotation = model = model.model_fields[part].annotation
    kinds = _kinds(annotation)
    return int in kinds and float not in kinds


def _kinds(annotation: Any) -> set[Any]:
    """The plain types an annotation admits: Annotated (PositiveInt) and unions (int | None) unwrapped."""
    if get_origin(annotation) is Annotated:
        return _kinds(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        return set().union(*(_kinds(arg) for arg in get_args(annotation)))
    return {annotation}


def _trial_world(cfg: TrainConfig) -> World:
    """The processes a trial's `trainer train` starts on this machine, and their device (trainer/distributed/
    local.py processes, parallel.py device_type: one per GPU, else the config's TP x PP x DP)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count(), "cuda"
    return cfg.parallel.model_parallel_size * (cfg.parallel.data_parallel_size or 1), "cpu"


def _recipe_problems(sweep: Sweep, world: World | None) -> list[str]:
    """Trial 0 is the recipe's own values: each inside its dimension (Optuna's enqueued parameters must be, a
    category most of all: CategoricalDistribution.to_internal_repr raises), and the recipe with the trial shape
    one the trainer takes."""
    problems = []
    params = sweep.recipe_params()
    for key, value in params.items():
        distribution = sweep.spec.space[key].distribution()
        try:
            inside = distribution._contains(distribution.to_internal_repr(value))
        except (ValueError, TypeError):
            inside = False
        if not inside:
            where = "baseline" if key in sweep.spec.baseline else "the recipe's own value"
            problems.append(
                f"space.{key}: {where} {value!r} is outside the space ({_described(sweep.spec.space[key])}); "
                f"trial 0 is the recipe's values: widen the space to hold it, or give baseline.{key} inside it"
            )
    if problems:
        return problems
    try:
        cfg = load_config(sweep.recipe, sweep.overrides(params))
    except ConfigError as error:
        return [
            f"the recipe's own values at the trial shape (trial 0): {problem}; give baseline values that fit "
            "(e.g. a warm-up shorter than the trials' schedule.train_iters)"
            for problem in error.problems
        ]
    world_size, device = world or _trial_world(cfg)
    return [
        f"the recipe's own values at the trial shape (trial 0): {problem}"
        for problem in layout_problems(cfg, world_size, device)
    ]


def _described(dimension: Dimension) -> str:
    if dimension.choices is not None:
        return f"choices {dimension.choices}"
    return f"low {dimension.low:g}, high {dimension.high:g}" + (
        f", step {dimension.step}" if dimension.step else ""
    )


def _past_warmup_problems(pruner: Pruner, train_iters: int, eval_interval: int, warmup: int) -> list[str]:
    """pruner.progress: past_warmup moves each trial's rungs by its own warm-up; the caller refuses it for every kind
    but successive halving, the only one that compares trials at a rung whatever step they report it at: the median
    pruner compares values reported at the very same step (optuna/pruners/_percentile.py, v5.1.0), which trials of
    different warm-ups never share, and Hyperband's brackets are sized from train_iters. A trial is judged at its first evaluation at or past min_resource steps
    beyond its warm-up, which must come before its run's end."""
    judged, last = _evaluations(pruner.min_resource + warmup, train_iters, eval_interval)
    if judged < train_iters:
        return []
    way = (
        f"give min_resource <= {last - warmup}"
        if last - warmup >= 1
        else "evaluate more often (schedule.eval_interval) or give a shorter warm-up range"
    )
    return [
        f"pruner.min_resource = {pruner.min_resource} steps past the longest warm-up ({WARMUP} up to {warmup}) "
        f"first falls on the evaluation at step {judged}, not before the trials' schedule.train_iters = "
        f"{train_iters}: those trials could never be stopped; {way}"
    ]


def _pruner_problems(sweep: Sweep) -> list[str]:
    """A pruner that could never stop a trial (nothing reported before the run's end), or one that would judge
    trials while a learning-rate warm-up still ramps: at step 10 of a 20-step warm-up a trial has seen half its
    learning rate, and the issue that made this rule found the pruner dropping the configurations that ended best
    there (issue 48: 10 of 12 trials pruned at step 10, the recipe's own among them)."""
    pruner = sweep.spec.pruner
    problems = []
    # refused for every other kind, `none` included (there it would move nothing)
    if pruner.progress == "past_warmup" and pruner.kind != "successive_halving":
        problems.append(
            f"pruner.progress = past_warmup needs pruner.kind: successive_halving (it is {pruner.kind}): only it "
            "compares trials whose evaluations fall at different steps past their warm-ups"
        )
    if pruner.kind == "none":
        return problems
    schedule = sweep.trial_config().schedule
    warmup = sweep.longest_warmup()
    if pruner.progress == "past_warmup":
        if pruner.kind == "successive_halving":
            problems += _past_warmup_problems(pruner, schedule.train_iters, schedule.eval_interval, warmup)
    elif pruner.min_resource < warmup:
        problems.append(
            f"pruner.min_resource = {pruner.min_resource} would judge trials before their warm-up has ended (the "
            f"longest, {WARMUP}, is {warmup} steps): give min_resource >= {warmup}, pruner.progress: past_warmup, "
            "or a shorter warm-up range"
        )
    if pruner.min_resource >= schedule.train_iters:
        problems.append(
            f"pruner.min_resource = {pruner.min_resource} is not below the trials' schedule.train_iters = "
            f"{schedule.train_iters}: no trial could be stopped; lower it (e.g. to schedule.eval_interval = "
            f"{schedule.eval_interval}) or set pruner.kind: none"
        )
    if schedule.eval_interval >= schedule.train_iters:
        problems.append(
            f"schedule.eval_interval = {schedule.eval_interval} is not below the trials' schedule.train_iters = "
            f"{schedule.train_iters}: a trial reports a validation loss only at its end, so pruner.kind = "
            f"{pruner.kind} has nothing to stop on; set schedule.eval_interval below it (in the sweep's set) or "
            "pruner.kind: none"
        )
    elif pruner.progress == "step" and pruner.min_resource < schedule.train_iters:
        problems += _first_rung_problems(pruner, schedule.train_iters, schedule.eval_interval)
    return problems


def _first_rung_problems(pruner: Pruner, train_iters: int, eval_interval: int) -> list[str]:
    """A trial is judged at its first evaluation at or past min_resource steps; a stop at the run's last
    evaluation is ignored (trainer/sweep/study.py judge), so that evaluation must come before the run's end."""
    judged, last = _evaluations(pruner.min_resource, train_iters, eval_interval)
    if judged < train_iters:
        return []
    return [
        f"pruner.min_resource = {pruner.min_resource} first falls on the evaluation at step {judged} "
        f"(schedule.eval_interval = {eval_interval}), not before the trials' schedule.train_iters = {train_iters}: "
        f"no trial could be stopped; give min_resource <= {last} or evaluate more often"
    ]


def _evaluations(steps: int, train_iters: int, eval_interval: int) -> tuple[int, int]:
    """A trial's first evaluation at or past `steps` (the run's end evaluates too), and its last before the end."""
    first = min(-(-steps // eval_interval) * eval_interval, train_iters)
    return first, (train_iters - 1) // eval_interval * eval_interval
