"""`python -m trainer sweep` (`make sweep`): a hyperparameter sweep on this machine, each trial a real trainer run.

    python -m trainer sweep --sweep trainer/configs/local-sweep.yaml [--trials N] [--name NAME] [--register TAG]

The study is kept under runs/sweeps/<name>/ (study.journal; trials/<number>/ each trial's run directory and
train.log); the same command again resumes it. At the end: the table of trials, the plots (*.png), best.set and
best.yaml beside them; with --register, the best trial's newest checkpoint (a model version, trainer/models/) gets
the tag. See docs/automl.md."""

from __future__ import annotations

import argparse
import re
import signal
import sys
from pathlib import Path

import optuna
from rich.console import Console
from rich.markup import escape

from trainer.arguments import positive_int
from trainer.config import ConfigError
from trainer.models.registry import LocalStore, Registry, RegistryError
from trainer.sweep.confirm import Verdict, confirm
from trainer.sweep.report import failures, trials_table, write_best, write_plots
from trainer.sweep.space import load_sweep
from trainer.sweep.study import RUN_DIR, SWEEPS, heldout_evaluator, run_sweep
from trainer.sweep.tracking import trial_tracker
from trainer.sweep.trial import TrialFailed
from trainer.sweep.worker import stop_on_sigterm
from trainer.tracking.mlflow_runs import DEFAULT_URI

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sweep", required=True, type=Path, help="the sweep YAML (recipe, space, pruner)")
    parser.add_argument("--trials", type=positive_int, help="finished trials to reach (default: the YAML's)")
    parser.add_argument(
        "--name", help="the study's name, its directory runs/sweeps/<name> (default: the YAML's stem)"
    )
    # --set: a config value every trial shares, over the YAML's set (repeatable)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument(
        "--register", metavar="TAG", help="point this model tag at the best trial's checkpoint"
    )
    parser.add_argument(
        "--runs", type=Path, default=Path("runs"), help="where runs and tags live (default runs/)"
    )
    parser.add_argument(
        "--mlflow",
        nargs="?",
        const=DEFAULT_URI,
        metavar="URI",
        help=f"log each trial to MLflow (default store {DEFAULT_URI}; or a tracking server's URI)",
    )
    parser.add_argument(
        "--trial-timeout", type=positive_int, help="seconds a trial may run before it is stopped and failed"
    )


def main(args: argparse.Namespace) -> int:
    console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    errors = Console(stderr=True, highlight=False, soft_wrap=True)
    name = args.name or args.sweep.stem
    if not NAME.match(name):
        errors.print(
            f"[bold red]sweep:[/] --name {name!r}: use letters, digits, '.', '-' and '_' (at most 64, starting "
            "with a letter or digit)"
        )
        return 2
    # SIGTERM and SIGHUP (a closed terminal) end the driver as Ctrl-C does: the running trial's trainer, in a
    # session of its own that no terminal signal reaches, is killed (trial.py run_trial) and the trial runs again
    # when the sweep is resumed. The worker's handler: SystemExit(128 + signal).
    with stop_on_sigterm(signal.SIGHUP):
        return _sweep(args, name, console, errors)


def _sweep(args: argparse.Namespace, name: str, console: Console, errors: Console) -> int:
    try:
        sweep = load_sweep(args.sweep, tuple(args.overrides))
        directory = args.runs / SWEEPS.relative_to("runs") / name
        track = trial_tracker(sweep, name, args.mlflow, console) if args.mlflow else None
        evaluate = heldout_evaluator(sweep, directory)
        study = run_sweep(
            sweep,
            name,
            directory,
            args.trials or sweep.spec.trials,
            console,
            evaluate=evaluate,
            timeout_s=args.trial_timeout,
            on_trial=track,
        )
        console.print(trials_table(study, sweep))
        for line in failures(study):
            console.print(f"[red]failed[/] {escape(line)}")
        verdict = confirm(study, sweep, directory, console, evaluate)
    except ConfigError as error:  # SweepError too
        errors.print(f"[bold red]sweep:[/] {escape(str(error))}")
        return 2
    except TrialFailed as error:  # a confirming run
        errors.print(f"[bold red]sweep:[/] {escape(str(error))}")
        return 1
    except KeyboardInterrupt:
        errors.print(f"[bold red]sweep:[/] interrupted; run the same command again to resume {name}")
        return 130
    plots, left_out = write_plots(study, directory, sweep.spec.pruner.progress)
    for line in left_out:
        console.print(line)
    if verdict is None:
        errors.print(f"[bold red]sweep:[/] no trial of {name} finished; see the failures above")
        return 1
    console.print(verdict.summary)
    best = write_best(study, sweep, directory, verdict)
    console.print(f"best --set lines: {best[0]}\n" + best[0].read_text().rstrip())
    console.print(f"best config: {best[1]}; plots: {', '.join(str(p) for p in plots)}")
    if args.register:
        try:
            console.print(register(study, verdict, args.runs, args.register))
        except RegistryError as error:
            errors.print(f"[bold red]sweep:[/] {escape(str(error))}")
            return 2
    return 0


def register(study: optuna.Study, verdict: Verdict, runs: Path, tag: str) -> str:
    """Point `tag` at the returned configuration's trial's newest model version (its last published checkpoint):
    the best trial's if it beat the recipe, else the recipe's own trial's."""
    number = verdict.best_trial if verdict.beat else verdict.recipe_trial
    if number is None:
        raise RegistryError(
            "the recipe's own trial did not finish: no checkpoint of the returned values to register"
        )
    best = study.trials[number]
    trial_dir = Path(best.user_attrs[RUN_DIR])
    versions = LocalStore(trial_dir).versions() if trial_dir.is_dir() else []
    if not versions:
        raise RegistryError(
            f"trial {best.number} published no checkpoint under {trial_dir}: nothing to register"
        )
    newest = max(versions, key=lambda found: found.record.step)
    event, where = Registry(LocalStore(runs)).promote(newest.record.version, tag)
    if where is None:
        return f"tag {tag} already names {event.version}"
    return f"tag {tag} -> {event.version} (trial {best.number}; {where})"
