"""The study: Optuna's, kept in a journal file under runs/sweeps/<name>/ (no server), sampled by TPE and pruned on the
validation loss each trial's trainer logs at its evaluation steps.

A rerun with the same name resumes: trials already finished (complete, pruned or failed) count towards --trials, a
trial an interrupted driver left (running, after a kill; failed as interrupted, after Ctrl-C, SIGTERM or SIGHUP) is
marked failed and its parameters queued to run again, and the sampler's seed moves on by the trials already stored
(space.Sampler.build). A study made for another space, trial shape or recipe is refused rather than mixed in. One
local driver at a time holds the study's directory (`hold`).

Trial 0 is the recipe's own values (enqueued: Optuna's `enqueue_trial`), so the sweep always measures what the user
already has. A trial that runs to its end is valued on the study's one held-out set (heldout.py), not on the
trainer's own validation samples; the pruner sees the trainer's validation losses as they come."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.storages.journal import JournalFileBackend, JournalStorage
from optuna.trial import TrialState
from rich.console import Console

from trainer import lock_file
from trainer.sweep.heldout import Evaluate, HeldOut, ScoreFailed, score_trial, write_heldout
from trainer.sweep.space import Sweep, SweepError
from trainer.sweep.trial import TrialFailed, run_trial, train_command

SWEEPS = Path("runs/sweeps")
JOURNAL = "study.journal"
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
# User attributes each trial carries (the table, the report and the benchmark read them).
RUN_DIR, STEPS, ERROR, LOG, WORKER = "run_dir", "steps", "error", "log", "worker"
STOPPED = "stopped"  # a trial its trainer's budget cap stopped early: why (recorded pruned at its last step)
RERUN_OF = "rerun_of"  # an interrupted trial's parameters queued again: the number of the trial it runs again
WORKER_SEEDS = 100_003  # a worker's sampler seed is moved on by this many per worker index
INTERRUPTED = "interrupted: the sweep's driver stopped"  # such a trial runs again and is not counted
RECIPE = "recipe"  # trial 0: the recipe's own values (True)
# A complete trial's in-training validation loss, its held-out loss's standard error, each held-out window's loss
VAL_LOSS, HELDOUT_SE, SEQUENCE_LOSSES = "val_loss", "heldout_se", "sequence_losses"
DRIVER_LOCK = "driver.lock"  # held by the one local driver of a study (`hold`)


Command = Callable[[Path, Sequence[str], Path], list[str]]

optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep prints its own progress


class _OwnFailureLines(logging.Filter):
    """Optuna logs each failed trial with the exception's traceback, then its value ("Trial N failed with
    parameters ... because of the following error", "Trial N failed with value None": optuna/study/_optimize.py
    _log_failed_trial, v5.1.0), Ctrl-C's KeyboardInterrupt included. The sweep prints one line of its own for a
    failed or interrupted trial (trial_objective), and an error it does not expect propagates with its traceback
    anyway, so these are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not (message.startswith("Trial ") and " failed with " in message)


logging.getLogger("optuna.study._optimize").addFilter(_OwnFailureLines())


def storage(directory: Path) -> JournalStorage:
    """The study's journal, an append-only file; Optuna's own lock (a symlink beside it) orders its writers
    (optuna/storages/journal/_file.py, JournalFileBackend, v5.1.0).

    On a stack the directory is on FSx for Lustre, shared by every node's worker (trainer/sweep/worker.py). The
    journal needs no fcntl() lock (the reason Optuna made it: SQLite's fcntl locking is broken on many NFS, Optuna
    docs, JournalFileBackend); its JournalFileSymlinkLock takes the lock by creating a symlink, an exclusive create
    that works "for NFSv2 or later" (Optuna docs, JournalFileSymlinkLock), and on Lustre, a POSIX file system whose
    namespace is kept coherent across clients by its metadata server, a create of a name that exists fails on every
    node alike. The nodes also mount with `flock` (infra/node_bootstrap.py, infra/cluster_software.py: flock/fcntl
    locks coherent across clients, mount.lustre(8)), which the symlink lock does not need but SQLite would."""
    directory.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(directory / JOURNAL)))


def open_study(sweep: Sweep, name: str, directory: Path, worker: int | None = None) -> optuna.Study:
    """The study, made or resumed. A driver alone on it (`worker` None) takes every trial left running as its own
    interrupted one; a worker sharing it with others (trainer/sweep/worker.py) only those it ran itself, and draws
    from a seed of its own so that workers starting together do not draw the same parameters."""
    store = storage(directory)
    stored = {s.study_name: s._study_id for s in store.get_all_studies()}
    seed_stream = 0 if worker is None else WORKER_SEEDS * (worker + 1)
    sampler = sweep.spec.sampler.build(sweep.spec.space, _stored_trials(store, stored, name) + seed_stream)
    study = optuna.create_study(
        study_name=name,
        storage=store,
        sampler=sampler,
        pruner=sweep.spec.pruner.build(sweep.train_iters()),
        direction="minimize",
        load_if_exists=True,
    )
    made_for = study.user_attrs.get("fingerprint")
    if made_for is None:
        study.set_user_attr("fingerprint", sweep.fingerprint)
        study.set_user_attr("sweep", str(sweep.path))
    elif made_for != sweep.fingerprint:
        raise SweepError(
            [
                f"--name {name}: the study in {directory} was made from {study.user_attrs.get('sweep')} with "
                f"another space, sampler, pruner or trial shape; give another --name, or remove {directory} to "
                "start over"
            ]
        )
    recipe = study.user_attrs.get("recipe_fingerprint")
    if recipe is None:  # a new study, or one stored before the recipe was fingerprinted: from now on
        study.set_user_attr("recipe_fingerprint", sweep.recipe_fingerprint)
    elif recipe != sweep.recipe_fingerprint:
        raise SweepError(
            [
                f"--name {name}: the recipe {sweep.recipe} has changed since the study in {directory} was made "
                "from it, so its trials would not be comparable with the stored ones; restore the recipe to "
                f"resume, give another --name to start a study of the changed recipe, or remove {directory} to "
                "start over"
            ]
        )
    if not any(trial.user_attrs.get(RECIPE) for trial in study.get_trials(deepcopy=False)):
        # skip_if_exists: of workers starting together on a new study, one queues it
        study.enqueue_trial(sweep.recipe_params(), user_attrs={RECIPE: True}, skip_if_exists=True)
    _queue_interrupted(study, store, worker)
    return study


HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP held back while a trial writes to the journal, delivered just after: one that
    lands inside Optuna's lock release makes it unlink the lock file twice and raise FileNotFoundError in place of
    the interruption, with a traceback (optuna/storages/journal/_file.py JournalFileSymlinkLock.release, v5.1.0;
    seen in tests/sweep/test_driver.py). Held by Python handlers that only note the signal, not by the thread's
    signal mask: the driver runs a second thread, and the kernel gives a process's signal to any thread that does
    not block it, whose C handler then has the main thread run the Python one at once (signal module docs,
    "Signals and threads"). Call from the main thread (signal.signal)."""
    caught: list[int] = []
    before = {
        signum: signal.signal(signum, lambda signum, _: caught.append(signum)) for signum in HELD_SIGNALS
    }
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        if caught:  # to the handler that was in place: KeyboardInterrupt, SystemExit, or the default action
            signal.raise_signal(caught[0])


def heldout_evaluator(sweep: Sweep, directory: Path) -> Evaluate:
    """The study's evaluation: its held-out windows written once (at the first trial that finishes), each finished
    trial's checkpoint scored on them."""

    def evaluate(run_dir: Path) -> HeldOut:
        config = sweep.trial_config()
        try:
            heldout = write_heldout(config, directory, sweep.spec.evaluation.sequences)
        except ValueError as error:
            raise SweepError([str(error)]) from None
        return score_trial(run_dir, heldout)

    return evaluate


def _queue_interrupted(study: optuna.Study, store: JournalStorage, worker: int | None) -> None:
    """Fail the trials a stopped driver (or this worker) left running, and queue again the parameters of every
    interrupted trial not queued yet: those left running (a SIGKILLed driver) and those its interruption failed
    (Ctrl-C: Optuna's optimize fails the trial on a KeyboardInterrupt and re-raises it, optuna/study/_optimize.py
    _run_trial, v5.1.0)."""

    def ours(trial: optuna.trial.FrozenTrial) -> bool:
        # another worker's: it may be running it now, and that worker queues its own again
        return worker is None or trial.user_attrs.get(WORKER) == worker

    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if ours(trial):  # nothing is running it now
            store.set_trial_user_attr(trial._trial_id, ERROR, INTERRUPTED)
            store.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    trials = study.get_trials(deepcopy=False)
    queued = {trial.user_attrs.get(RERUN_OF) for trial in trials}
    for trial in trials:
        if (
            trial.state == TrialState.FAIL
            and trial.user_attrs.get(ERROR) == INTERRUPTED
            and trial.number not in queued
            and trial.params
            and ours(trial)
        ):
            study.enqueue_trial(
                trial.params,
                user_attrs={
                    RERUN_OF: trial.number,
                    **({WORKER: worker} if worker is not None else {}),
                    **(
                        {RECIPE: True} if trial.user_attrs.get(RECIPE) else {}
                    ),  # trial 0 run again is still it
                },
                skip_if_exists=False,
            )


class DriverHeld(SweepError):
    """Another local driver runs this study."""


@contextlib.contextmanager
def hold(directory: Path) -> Iterator[None]:
    """One local driver per study: an exclusive flock(2) on <directory>/driver.lock while it runs, dropped by the
    kernel at the holder's end however it ends, so no crash leaves a stale lock (trainer/lock_file.py, as the
    trainer's run lock). A second driver is refused at once, told who holds the study and how to stop it; a
    directory that cannot hold the lock, told which path and why."""
    path = directory / DRIVER_LOCK
    try:
        fd = lock_file.open_locked(path)
    except lock_file.LockBusy:
        raise DriverHeld([_held_message(directory, path)]) from None
    except lock_file.LockUnusable as error:
        problem = f"the study's directory cannot be used: {error}"
        raise DriverHeld(
            [f"{problem}. Give this sweep another --name, or --runs a writable directory"]
        ) from None
    try:
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "argv": sys.argv}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        yield
    finally:
        os.close(fd)  # drops the lock


def _held_message(directory: Path, path: Path) -> str:
    holder: dict[str, Any] = {}
    for _ in range(10):  # the holder writes who it is just after it takes the lock
        with contextlib.suppress(OSError, ValueError):
            holder = json.loads(path.read_text())
            break
        time.sleep(0.05)
    pid, host = holder.get("pid", "?"), holder.get("host", "?")
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if started else "at an unknown time"
    here = host == socket.gethostname()
    return (
        f"the study in {directory} is being run by another sweep driver: pid {pid} on {host}, started {when}. "
        f"Wait for it to end, stop it with kill -TERM {pid}{'' if here else ' on ' + str(host)} (its running trial "
        "is stopped and runs again when the study is resumed), or give this sweep another --name"
    )


def _stored_trials(store: JournalStorage, stored: dict[str, int], name: str) -> int:
    return len(store.get_all_trials(stored[name], deepcopy=False)) if name in stored else 0


def finished(study: optuna.Study) -> int:
    """Trials that count towards --trials: complete, pruned or failed, but not those an interruption ended."""
    trials = study.get_trials(deepcopy=False, states=FINISHED)
    return sum(trial.user_attrs.get(ERROR) != INTERRUPTED for trial in trials)


def suggest(trial: optuna.Trial, sweep: Sweep) -> dict[str, Any]:
    """The trial's parameters, one per dimension of the space, drawn by the study's sampler."""
    params: dict[str, Any] = {}
    for key, distribution in sweep.spec.distributions().items():
        if isinstance(distribution, optuna.distributions.CategoricalDistribution):
            params[key] = trial.suggest_categorical(key, distribution.choices)
        elif isinstance(distribution, optuna.distributions.IntDistribution):
            params[key] = trial.suggest_int(
                key, distribution.low, distribution.high, step=distribution.step, log=distribution.log
            )
        else:
            assert isinstance(distribution, optuna.distributions.FloatDistribution)
            params[key] = trial.suggest_float(key, distribution.low, distribution.high, log=distribution.log)
    return params


def run_sweep(
    sweep: Sweep,
    name: str,
    directory: Path,
    trials: int,
    console: Console,
    *,
    command: Command = train_command,
    evaluate: Evaluate | None = None,
    timeout_s: float | None = None,
    on_trial: Callable[[optuna.trial.FrozenTrial], None] | None = None,
    stop_when: Callable[[optuna.Study], bool] | None = None,
) -> optuna.Study:
    """Run trials until the study holds `trials` finished ones, or `stop_when(study)` says so after a trial; each
    trial is a trainer run under <directory>/trials/<number>, valued by `evaluate` (default: the held-out set,
    heldout_evaluator). Only one driver runs a study at a time (`hold`)."""
    evaluate = evaluate or heldout_evaluator(sweep, directory)
    with hold(directory):
        return _run_sweep(
            sweep, name, directory, trials, console, command, evaluate, timeout_s, on_trial, stop_when
        )


def _run_sweep(
    sweep: Sweep,
    name: str,
    directory: Path,
    trials: int,
    console: Console,
    command: Command,
    evaluate: Evaluate,
    timeout_s: float | None,
    on_trial: Callable[[optuna.trial.FrozenTrial], None] | None,
    stop_when: Callable[[optuna.Study], bool] | None,
) -> optuna.Study:
    study = open_study(sweep, name, directory)
    done = finished(study)
    if done >= trials:
        console.print(f"sweep {name}: {done} of {trials} trials already finished")
        return study
    console.print(f"sweep {name}: {done} of {trials} trials finished, running {trials - done} ({directory})")

    objective = trial_objective(sweep, name, directory, console, evaluate, command, timeout_s)

    def progress(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        best = _best_value(study)
        value = f"{trial.value:.4f}" if trial.value is not None else "-"
        console.print(
            f"trial {trial.number} {trial.state.name.lower()} ({value}); {finished(study)}/{trials} finished, "
            f"best {best:.4f}"
            if best is not None
            else f"trial {trial.number} {trial.state.name.lower()}"
        )

    def stop(study: optuna.Study, _: optuna.trial.FrozenTrial) -> None:
        if stop_when is not None and stop_when(study):
            study.stop()

    callbacks = [progress, *([lambda _, trial: on_trial(trial)] if on_trial else []), stop]
    study.optimize(objective, n_trials=trials - done, catch=(TrialFailed,), callbacks=callbacks)
    return study


def trial_objective(
    sweep: Sweep,
    name: str,
    directory: Path,
    console: Console,
    evaluate: Evaluate,
    command: Command = train_command,
    timeout_s: float | None = None,
    *,
    worker: int | None = None,
    extra: Sequence[str] = (),
) -> Callable[[optuna.Trial], float]:
    """The objective: the trial's parameters drawn, its trainer run under <directory>/trials/<number> (with the
    `extra` overrides too), pruned on its validation losses, valued by `evaluate` if it runs to its end; raises
    TrialFailed for a crashed trial (or one whose checkpoint cannot be scored)."""

    def objective(trial: optuna.Trial) -> float:
        with signals_held():
            if worker is not None:
                trial.set_user_attr(WORKER, worker)
            params = suggest(trial, sweep)
            run_dir = directory / "trials" / f"{trial.number:04d}"
            trial.set_user_attr(RUN_DIR, str(run_dir))
            trial.set_user_attr(LOG, str(run_dir / "train.log"))
        shown = ", ".join(f"{key.split('.')[-1]}={_short(value)}" for key, value in params.items())
        console.print(f"trial {trial.number}: {shown}")

        schedule = sweep.trial_config([*sweep.param_overrides(params), *extra]).schedule
        offset, train_iters = sweep.spec.pruner.offset(schedule.lr_warmup_iters), schedule.train_iters

        def report(step: int, val_loss: float) -> bool:
            with signals_held():
                trial.set_user_attr(STEPS, step)
                stop = judge(trial, val_loss, step, offset, train_iters)
            console.print(
                f"  trial {trial.number} step {step}: validation loss {val_loss:.4f}"
                + (" -> pruned" if stop else "")
            )
            return stop

        overrides = [*sweep.overrides(params), *extra, f"name={name}-t{trial.number:04d}"]
        try:
            outcome = run_trial(
                command(sweep.recipe, overrides, run_dir),
                run_dir,
                report,
                timeout_s=timeout_s,
                train_iters=train_iters,
            )
        except TrialFailed as error:
            trial.set_user_attr(ERROR, str(error))
            console.print(f"  trial {trial.number} [red]failed[/]: {error}")
            raise
        except (KeyboardInterrupt, SystemExit):
            # Ctrl-C, or SIGTERM/SIGHUP made SystemExit (command.py): run_trial killed the trainer's process
            # group; the trial runs again when the study is resumed (open_study), and does not count.
            trial.set_user_attr(ERROR, INTERRUPTED)
            console.print(f"  trial {trial.number} interrupted: it runs again when the sweep is resumed")
            raise
        trial.set_user_attr(STEPS, outcome.steps)
        if outcome.stopped is not None:
            # Not a result to rank or model as complete: pruned, valued (if it reported any) at its last report
            # like any pruned trial (optuna/study/_tell.py _tell_with_warning, v5.1.0).
            trial.set_user_attr(STOPPED, outcome.stopped)
            console.print(f"  trial {trial.number} {outcome.stopped}")
            raise optuna.TrialPruned(outcome.stopped)
        if outcome.pruned:
            raise optuna.TrialPruned(f"validation loss {outcome.val_loss:.4f} at step {outcome.steps}")
        assert outcome.val_loss is not None  # run_trial raises when a finished run logged none
        try:
            held = evaluate(run_dir)
        except ScoreFailed as error:
            trial.set_user_attr(ERROR, str(error))
            console.print(f"  trial {trial.number} [red]failed[/]: {error}")
            raise TrialFailed(str(error), run_dir / LOG) from None
        trial.set_user_attr(VAL_LOSS, outcome.val_loss)
        trial.set_user_attr(HELDOUT_SE, held.standard_error)
        trial.set_user_attr(SEQUENCE_LOSSES, list(held.sequence_losses))
        console.print(
            f"  trial {trial.number} held-out loss {held.loss:.4f} (standard error {held.standard_error:.4f}, "
            f"{len(held.sequence_losses)} windows)"
        )
        return held.loss

    return objective


def judge(trial: optuna.Trial, val_loss: float, step: int, offset: int, train_iters: int) -> bool:
    """Report a trial's validation loss at `step` to the pruner; whether it stops the trial there. The pruner sees
    the step less `offset` (pruner.progress: its own warm-up, or 0); an evaluation before that is not its to judge.
    A stop at the run's last evaluation is none: the trial has trained its whole run and is scored (a rung there,
    successive halving's second from a first at a third of the run, threw it away). trainer/bench/pruning.py
    replays trials through this too."""
    if step < offset:
        return False
    trial.report(val_loss, step - offset)
    return trial.should_prune() and step < train_iters


def _best_value(study: optuna.Study) -> float | None:
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return min((t.value for t in complete if t.value is not None), default=None)


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
