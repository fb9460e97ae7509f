"""The sweep against the recipe's own values and against random search without pruning, at the same budget of
trial-steps, over several sampler seeds, on the built-in data (trainer/configs/local-sweep.yaml: its whole space,
its trial shape, real trainer runs, every finished trial scored on the study's one held-out set).

For each sampler seed:
- the sweep: the YAML's sampler (TPE) and pruner, trial 0 the recipe's values, starting trials while a whole one
  still fits in what is left of the budget (what pruning saves buys more trials: Li et al., "Hyperband", JMLR 2018,
  section 1); then its verdict (trainer/sweep/confirm.py): the best and the recipe's values trained again on 2 more
  trainer seeds, the best called better only beyond the seed spread;
- random search: Optuna's RandomSampler from the same seed (TPE's startup draws are its draws), trial 0 the recipe's
  values too, no pruning, as many whole trials as the budget buys;
- the recipe's values: trial 0, the same run in every study (trained once, added to each: `_recipe_trial`);
- each pruning rule of trainer/bench/pruning.py replayed on random search's trials (run to their ends): which it
  would have stopped, and whether the one that ended best among them.

Rows: per seed, the sweep's best (mean over its 3 trainer seeds) against the recipe's (the same); the sweep's best
against random search's best; the sweep's trial-steps against the same trials unpruned. The goals (issue 48): the
sweep's best beats the recipe's values on every seed, by more than the seed spread on average, with at least 40 %
fewer trial-steps than the same trials unpruned. And per pruning rule, over the seeds: the trial-steps it would have
cost random search's trials against their whole runs, and on how many seeds it kept the one that ended best (of
those where a drawn trial ended best: trial 0 is judged by no rule here)."""

from __future__ import annotations

import shutil
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState
from rich.console import Console

from trainer.bench.pruning import RULES, replay
from trainer.bench.report import add_result
from trainer.sweep.confirm import CONFIRM, RESULT, confirm
from trainer.sweep.heldout import Evaluate
from trainer.sweep.space import Pruner, load_sweep
from trainer.sweep.study import STEPS, Command, heldout_evaluator, run_sweep, storage
from trainer.sweep.trial import train_command

SWEEP = Path("trainer/configs/local-sweep.yaml")
SEEDS = (0, 1, 2)  # sampler seeds: at least 3 (issue 48)
BUDGET_TRIALS = 6  # the budget: this many whole trials' steps (the 2 shared cores bound it)


def bench_sweep(
    report: dict,
    out: Path,
    sweep_path: Path = SWEEP,
    command: Command = train_command,
    evaluate: Evaluate | None = None,
    seeds: tuple[int, ...] = SEEDS,
) -> None:
    """Run every side, from scratch, under <out>/sweeps; add their rows and details to the report. `evaluate`:
    how a finished trial is scored (default: each study's held-out set)."""
    root = out / "sweeps"
    shutil.rmtree(root, ignore_errors=True)  # a benchmark measures, it does not resume
    root.mkdir(parents=True)
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    spec: dict[str, Any] = yaml.safe_load(sweep_path.read_text())
    spec["recipe"] = str((sweep_path.parent / spec["recipe"]).resolve())
    steps = load_sweep(sweep_path).train_iters()
    budget = BUDGET_TRIALS * steps
    recipe = _recipe_trial(spec, root, console, command, evaluate)
    per_seed: list[dict[str, Any]] = []
    for seed in seeds:
        sampler = spec.get("sampler", {})
        bodies = {
            "sweep": {**spec, "sampler": {**sampler, "seed": seed}},
            "random": {**spec, "sampler": {"kind": "random", "seed": seed}, "pruner": {"kind": "none"}},
        }
        sides: dict[str, dict[str, Any]] = {}
        for side, body in bodies.items():
            path = root / f"{side}-{seed}.yaml"
            path.write_text(yaml.safe_dump(body, sort_keys=False))
            directory = root / f"{side}-{seed}"
            if side == "sweep" and seed != seeds[0]:
                _reuse_recipe_runs(root / f"sweep-{seeds[0]}", directory)
            sides[side] = _run(path, f"bench-{side}-{seed}", directory, budget, steps, console,
                               command, evaluate, recipe, confirmed=side == "sweep",
                               replayed=RULES if side == "random" else ())  # fmt: skip
        per_seed.append({"seed": seed, **sides})
    report["details"]["sweep"] = {"budget_trial_steps": budget, "seeds": per_seed}
    for row in per_seed:
        tpe, rnd = row["sweep"], row["random"]
        verdict = tpe["verdict"]
        add_result(
            report,
            f"sampler seed {row['seed']}: sweep best held-out loss (mean of {len(verdict['seeds'])} trainer seeds; "
            f"{'beat' if verdict['beat'] else 'did not beat'} the recipe beyond the seed spread "
            f"{verdict['spread']:.4f})",
            "loss",
            statistics.mean(verdict["best_losses"]),
            "the recipe's values (the same seeds)",
            statistics.mean(verdict["recipe_losses"]),
        )
        add_result(
            report,
            f"sampler seed {row['seed']}: sweep best held-out loss (its trial's seed)",
            "loss",
            tpe["best_value"],
            f"random search, no pruning ({sum(rnd['trials'].values())} trials, same budget)",
            rnd["best_value"],
        )
        add_result(
            report,
            f"sampler seed {row['seed']}: sweep trial-steps ({sum(tpe['trials'].values())} trials)",
            "steps",
            tpe["trial_steps"],
            "the same trials without pruning",
            tpe["unpruned_steps"],
        )
    for index, rule in enumerate(per_seed[0]["random"]["pruning"]):
        replays = [row["random"]["pruning"][index] for row in per_seed]
        kept = sum(r["kept_best"] is True for r in replays)
        judged = sum(r["kept_best"] is not None for r in replays)
        add_result(
            report,
            f"pruning replayed on random search's trials: {rule['rule']} (kept the trial that ended best on "
            f"{kept} of the {judged} sampler seeds where a drawn trial, not the recipe's, ended best)",
            "steps",
            sum(r["trial_steps"] for r in replays),
            "the same trials unpruned",
            sum(r["unpruned_steps"] for r in replays),
        )


def _recipe_trial(
    spec: dict[str, Any], root: Path, console: Console, command: Command, evaluate: Evaluate | None
) -> optuna.trial.FrozenTrial:
    """Trial 0 of every study here: the recipe's values at the trial shape, one run whatever the sampler or its
    seed (the trainer's seed is the same), trained once and added to each study before it runs, so that every
    study's sampler starts after one stored trial (space.Sampler.build) and TPE's and random search's first draws
    stay the same."""
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump({**spec, "pruner": {"kind": "none"}}, sort_keys=False))
    sweep = load_sweep(path)
    directory = root / "recipe"
    study = run_sweep(
        sweep, "bench-recipe", directory, 1, console, command=command,
        evaluate=evaluate or heldout_evaluator(sweep, directory),
    )  # fmt: skip
    return study.trials[0]


def _reuse_recipe_runs(first: Path, directory: Path) -> None:
    """The recipe's values on the extra trainer seeds are the same runs whatever the sampler's seed: the first
    sampler seed's results (confirm.py remembers each in its result.json, keyed by its parameters) serve the rest."""
    for result in sorted((first / CONFIRM).glob(f"recipe-seed*/{RESULT}")):
        target = directory / CONFIRM / result.parent.name / RESULT
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(result, target)


def _run(
    path: Path,
    name: str,
    directory: Path,
    budget: int,
    trial_steps: int,
    console: Console,
    command: Command,
    evaluate: Evaluate | None,
    recipe: optuna.trial.FrozenTrial,
    *,
    confirmed: bool,
    replayed: tuple[Pruner, ...] = (),
) -> dict[str, Any]:
    """Trials start while one of `trial_steps` still fits in `budget` trial-steps; trial 0 is `recipe`; each of
    `replayed` replayed on the trials (trainer/bench/pruning.py)."""
    started = time.monotonic()

    def spent_up(study: optuna.Study) -> bool:
        return _steps(study.get_trials(deepcopy=False)) + trial_steps > budget

    sweep = load_sweep(path)
    evaluate = evaluate or heldout_evaluator(sweep, directory)
    # before open_study, which would queue the recipe's values to run again
    optuna.create_study(study_name=name, storage=storage(directory), direction="minimize").add_trial(recipe)
    # The most trials the budget buys: every one stopped at the pruner's first rung.
    cap = budget // min(sweep.spec.pruner.min_resource, trial_steps)
    study = run_sweep(
        sweep, name, directory, cap, console, command=command, evaluate=evaluate, stop_when=spent_up
    )
    searched = time.monotonic() - started
    verdict = confirm(study, sweep, directory, console, evaluate, command) if confirmed else None
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    best = min(complete, key=lambda t: float(t.value or 0)) if complete else None
    return {
        "best_value": best.value if best else None,
        "best_params": best.params if best else None,
        "trial_steps": _steps(trials),
        "unpruned_steps": trial_steps * len(trials),
        "trials": {state.name.lower(): sum(t.state == state for t in trials) for state in TrialState},
        "values": [t.value for t in trials],
        "verdict": None if verdict is None else asdict(verdict),
        "pruning": [asdict(replay(complete, rule, sweep)) for rule in replayed],
        "search_seconds": searched,
        "seconds": time.monotonic() - started,
    }


def _steps(trials: list[optuna.trial.FrozenTrial]) -> int:
    return sum(int(t.user_attrs.get(STEPS, 0)) for t in trials)
