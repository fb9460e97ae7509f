"""`python -m trainer sweep-worker`: one of several workers sharing one study (a stack's array job children,
trainer/jobs/sweep.py). Each asks the shared study for a trial, trains it (a real `trainer train` on its node),
reports it, and repeats until the study holds the sweep's trials or the sweep's one dollar cap is reached; then it
says why it stopped and exits 0.

    python -m trainer sweep-worker --sweep trainer/configs/local-sweep.yaml --name NAME --dir /fsx/.../sweeps/NAME \
        --trials 32 [--max-dollars 500] [--worker N] [--mlflow URI]

The cap is the ledger's (trainer/cost/ledger.py cap_reached): what every trial's ledger.json in the study's
directory says it spent, summed; no trial starts once it is reached, and each trial runs with
`budget.max_dollars` set to what remained when it started (read once: other workers' trials write their ledgers
meanwhile), so its trainer stops itself there; under a cent left, the worker stops as at the cap. Trials that run in
parallel each get that remainder: the sweep can spend up to its workers' count of remainders past the cap's last
check, never a new trial's."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import optuna
from optuna.trial import TrialState
from rich.console import Console
from rich.markup import escape

from trainer.arguments import positive_float, positive_int
from trainer.config import ConfigError
from trainer.config.schema import BudgetConfig
from trainer.contract.container import ARRAY_INDEX_ENV
from trainer.contract.jobset import COMPLETION_INDEX_ENV
from trainer.cost.ledger import LEDGER_FILE, Ledger, cap_reached, read_ledger
from trainer.sweep.heldout import Evaluate
from trainer.sweep.space import load_sweep
from trainer.sweep.study import Command, finished, heldout_evaluator, open_study, trial_objective
from trainer.sweep.tracking import trial_tracker
from trainer.sweep.trial import TrialFailed, train_command


def positive_dollars(text: str) -> float:
    """A dollar cap: a number above 0 (positive_float, which refuses nan too) and finite, since `inf` caps nothing
    and would be handed to each trial as its budget.max_dollars."""
    value = positive_float(text)
    if math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number of US dollars")
    return value


def worker_index(env: Mapping[str, str]) -> int:
    """This worker's index: its child's in a Batch array job, its pod's in an EKS Indexed Job, else 0."""
    return int(env.get(ARRAY_INDEX_ENV) or env.get(COMPLETION_INDEX_ENV) or 0)


def spent(directory: Path) -> float:
    """Dollars the sweep's trials spent: the sum of their ledgers (each trial's run directory's ledger.json)."""
    ledgers = (read_ledger(path) for path in sorted((directory / "trials").glob(f"*/{LEDGER_FILE}")))
    return sum(ledger.dollars for ledger in ledgers if ledger is not None)


# A trial's least meaningful budget: the ledger counts dollars in cents (trainer/cost/ledger.py cost_report), and a
# trial started with less would stop at its first step having learned nothing.
MIN_TRIAL_DOLLARS = 0.01


def stop_reason(study: optuna.Study, trials: int) -> str | None:
    """Why no new trial may start for the sweep's count: the study holds its trials (finished or running)."""
    running = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
    done = finished(study)
    if done + running >= trials:
        return f"{done} of {trials} trials finished" + (f", {running} still running" if running else "")
    return None


def dollars_left(directory: Path, max_dollars: float) -> tuple[float, str | None]:
    """What remains of the cap, read once (other workers' trials write their ledgers meanwhile, so two reads could
    disagree), and why no trial may start on it: the cap is reached, or less than a trial's minimum is left."""
    total = Ledger(dollars=spent(directory))
    left = max_dollars - total.dollars
    if reached := cap_reached(BudgetConfig(max_dollars=max_dollars), total):
        return left, reached
    if left < MIN_TRIAL_DOLLARS:
        return left, (
            f"budget.max_dollars = {max_dollars:g}: ${left:.4f} left (spent ${total.dollars:,.4f}), under a "
            f"trial's minimum of ${MIN_TRIAL_DOLLARS:.2f}"
        )
    return left, None


def work(
    sweep_path: Path,
    name: str,
    directory: Path,
    trials: int,
    console: Console,
    *,
    max_dollars: float | None = None,
    worker: int = 0,
    overrides: tuple[str, ...] = (),
    command: Command = train_command,
    evaluate: Evaluate | None = None,
    timeout_s: float | None = None,
    mlflow: str | None = None,
) -> str:
    """Run trials of the shared study until it holds `trials` or the cap is reached; why it stopped. With `mlflow`
    (a tracking URI), each trial this worker decides is logged there as the local sweep logs its trials."""
    sweep = load_sweep(sweep_path, overrides)
    study = open_study(sweep, name, directory, worker=worker)
    track = trial_tracker(sweep, name, mlflow, console) if mlflow else None
    evaluate = evaluate or heldout_evaluator(sweep, directory)
    while True:
        extra = []
        if (reason := stop_reason(study, trials)) is None and max_dollars is not None:
            left, reason = dollars_left(directory, max_dollars)
            extra = [f"budget.max_dollars={left:.6g}"]
        if reason is not None:
            break
        objective = trial_objective(
            sweep, name, directory, console, evaluate, command, timeout_s, worker=worker, extra=extra
        )
        study.optimize(
            objective,
            n_trials=1,
            catch=(TrialFailed,),
            callbacks=[
                lambda _, t: console.print(f"worker {worker}: trial {t.number} {t.state.name.lower()}"),
                *([lambda _, t: track(t)] if track else []),
            ],
        )
    console.print(f"worker {worker}: sweep {name} stops: {reason}")
    return reason


@contextlib.contextmanager
def stop_on_sigterm(*more: signal.Signals) -> Iterator[None]:
    """While it lasts, SIGTERM (Batch stopping the container, a pod's deletion or a node going away), and `more`
    (the local driver's SIGHUP), end the process at once with SystemExit(128 + signal): the trial it runs is killed
    (trainer/sweep/trial.py run_trial) and runs again when the study is resumed (study.py open_study). The worker is
    often the container's PID 1, for which a signal without a handler does nothing (signal(7), "the init process"
    in kill(2)). The handlers before are put back after, so a caller in the same process (a test) keeps its own: a
    Python handler left behind is inherited by forked children, which then cannot be stopped with SIGTERM while
    blocked in C (multiprocessing's Pool.terminate)."""

    def stop(signum: int, _: object) -> None:
        raise SystemExit(128 + signum)

    signals = (signal.SIGTERM, *more)
    before = {signum: signal.getsignal(signum) for signum in signals}
    for signum in signals:
        signal.signal(signum, stop)
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sweep", required=True, type=Path, help="the sweep YAML (recipe, space, pruner)")
    parser.add_argument("--name", required=True, help="the shared study's name")
    parser.add_argument(
        "--dir", required=True, type=Path, help="the study's directory, shared by every worker"
    )
    parser.add_argument("--trials", required=True, type=positive_int, help="trials the sweep runs in all")
    parser.add_argument(
        "--max-dollars", type=positive_dollars, help="the sweep's one dollar cap across its trials"
    )
    parser.add_argument(
        "--worker",
        type=int,
        help=f"this worker's index (default: ${ARRAY_INDEX_ENV} on Batch, ${COMPLETION_INDEX_ENV} on EKS, else 0)",
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--trial-timeout", type=positive_int, help="seconds a trial may run")
    parser.add_argument("--mlflow", metavar="URI", help="log each trial to this MLflow tracking URI")


def main(args: argparse.Namespace) -> int:
    console = Console(highlight=False, soft_wrap=True, width=160)
    worker = args.worker if args.worker is not None else worker_index(os.environ)
    with stop_on_sigterm():
        return _work(args, console, worker)


def _work(args: argparse.Namespace, console: Console, worker: int) -> int:
    try:
        work(
            args.sweep,
            args.name,
            args.dir,
            args.trials,
            console,
            max_dollars=args.max_dollars,
            worker=worker,
            overrides=tuple(args.overrides),
            timeout_s=args.trial_timeout,
            mlflow=args.mlflow,
        )
    except ConfigError as error:
        Console(stderr=True).print(f"[bold red]sweep-worker:[/] {escape(str(error))}")
        return 2
    sys.stdout.flush()
    return 0
