"""The study: Optuna's, kept in a journal file under runs/sweeps/<name>/ (no server), sampled by TPE and pruned on the
validation loss each trial's trainer logs at its evaluation steps.

A rerun with the same name resumes: trials already finished (complete, pruned or failed) count towards --trials, a
trial left running by an interrupted driver is marked failed and its parameters queued to run again, and the
sampler's seed moves on by the trials already stored (space.Sampler.build). A study made for another space or trial shape is refused rather than mixed in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.storages.journal import JournalFileBackend, JournalStorage
from optuna.trial import TrialState
from rich.console import Console

from trainer.sweep.space import Sweep, SweepError
from trainer.sweep.trial import TrialFailed, run_trial, train_command

SWEEPS = Path("runs/sweeps")
JOURNAL = "study.journal"
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
# User attributes each trial carries (the table, the report and the benchmark read them).
RUN_DIR, STEPS, ERROR, LOG, WORKER = "run_dir", "steps", "error", "log", "worker"
WORKER_SEEDS = 100_003  # a worker's sampler seed is moved on by this many per worker index
INTERRUPTED = "interrupted: the sweep's driver stopped"  # such a trial runs again and is not counted


Command = Callable[[Path, Sequence[str], Path], list[str]]

optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep prints its own progress


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
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if worker is not None and trial.user_attrs.get(WORKER) != worker:
            continue  # another worker's: it may be running it now
        # Left running by a driver (or this worker) that was stopped: nothing is running it now.
        store.set_trial_user_attr(trial._trial_id, ERROR, INTERRUPTED)
        store.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        study.enqueue_trial(trial.params, skip_if_exists=False)
    return study


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
    timeout_s: float | None = None,
    on_trial: Callable[[optuna.trial.FrozenTrial], None] | None = None,
    stop_when: Callable[[optuna.Study], bool] | None = None,
) -> optuna.Study:
    """Run trials until the study holds `trials` finished ones, or `stop_when(study)` says so after a trial; each
    trial is a trainer run under <directory>/trials/<number>."""
    study = open_study(sweep, name, directory)
    done = finished(study)
    if done >= trials:
        console.print(f"sweep {name}: {done} of {trials} trials already finished")
        return study
    console.print(f"sweep {name}: {done} of {trials} trials finished, running {trials - done} ({directory})")

    objective = trial_objective(sweep, name, directory, console, command, timeout_s)

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
    command: Command = train_command,
    timeout_s: float | None = None,
    *,
    worker: int | None = None,
    extra: Sequence[str] = (),
) -> Callable[[optuna.Trial], float]:
    """The objective: the trial's parameters drawn, its trainer run under <directory>/trials/<number> (with the
    `extra` overrides too), pruned on its validation losses; raises TrialFailed for a crashed trial."""

    def objective(trial: optuna.Trial) -> float:
        if worker is not None:
            trial.set_user_attr(WORKER, worker)
        params = suggest(trial, sweep)
        run_dir = directory / "trials" / f"{trial.number:04d}"
        trial.set_user_attr(RUN_DIR, str(run_dir))
        trial.set_user_attr(LOG, str(run_dir / "train.log"))
        shown = ", ".join(f"{key.split('.')[-1]}={_short(value)}" for key, value in params.items())
        console.print(f"trial {trial.number}: {shown}")

        def report(step: int, val_loss: float) -> bool:
            trial.report(val_loss, step)
            trial.set_user_attr(STEPS, step)
            stop = trial.should_prune()
            console.print(
                f"  trial {trial.number} step {step}: validation loss {val_loss:.4f}"
                + (" -> pruned" if stop else "")
            )
            return stop

        overrides = [*sweep.overrides(params), *extra, f"name={name}-t{trial.number:04d}"]
        try:
            outcome = run_trial(
                command(sweep.recipe, overrides, run_dir), run_dir, report, timeout_s=timeout_s
            )
        except TrialFailed as error:
            trial.set_user_attr(ERROR, str(error))
            console.print(f"  trial {trial.number} [red]failed[/]: {error}")
            raise
        trial.set_user_attr(STEPS, outcome.steps)
        if outcome.pruned:
            raise optuna.TrialPruned(f"validation loss {outcome.val_loss:.4f} at step {outcome.steps}")
        assert outcome.val_loss is not None  # run_trial raises when a finished run logged none
        return outcome.val_loss

    return objective


def _best_value(study: optuna.Study) -> float | None:
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return min((t.value for t in complete if t.value is not None), default=None)


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
