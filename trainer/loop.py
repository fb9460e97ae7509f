"""The training loop every engine runs under, one torchrun process's whole run (`python -m trainer train` under
torchrun: trainer/train.py checks the config, then calls `work`).

`work` starts the process groups and runs `train()`: build the engine, resume from the newest checkpoint, then
loop: one optimizer step over a global batch (skipped when its loss or gradient norm is not finite), log, evaluate,
save, and stop at a step boundary when any rank got SIGTERM (trainer/faults.py). The engine (trainer/engines/) does
the step, the evaluation and the checkpoint format; this loop does the rest.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

import torch
from rich.console import Console
from rich.markup import escape

from trainer import engines, faults
from trainer.checkpoint.checkpointer import Checkpointer
from trainer.checkpoint.store import CheckpointError, CheckpointSaveError, Progress
from trainer.config import ParallelDims, TrainConfig
from trainer.config.precision import precision_note
from trainer.cost.ledger import LEDGER_FILE, Meter
from trainer.device import device_type
from trainer.distributed import local, parallel
from trainer.engines import Engine
from trainer.evaluation.during_training import IntervalEvaluation
from trainer.health import report as health_report
from trainer.health.monitor import HealthMonitor, prepare_flight_recorder
from trainer.launch import run_lock
from trainer.metrics import MetricsLogger, peak_memory_gib, peak_tflops_per_device
from trainer.model import llama
from trainer.model.flops import model_flops_per_sequence
from trainer.monitoring import exporters
from trainer.plan.fit import DeviceMemoryError, check_device_memory
from trainer.plan.search import vocab_size


def work(
    cfg: TrainConfig, dims: ParallelDims, console: Console, *, fresh: bool, stop: faults.StopRequest
) -> int:
    """One torchrun process: start the process groups, train, and turn the ways a run ends into exit codes."""
    prepare_flight_recorder(cfg)  # health: before the process group starts
    parallel.initialize(cfg, dims)
    try:
        train(cfg, dims, console, fresh=fresh, stop=stop)
        if cfg.tracking.mlflow and torch.distributed.get_rank() == 0:
            _track(cfg, console)
    except (faults.TrainingStopped, CheckpointError, CheckpointSaveError, DeviceMemoryError) as error:
        console.print(f"[bold red]train:[/] {escape(str(error))}")  # every rank raised it; rank 0 says so
        return 1
    except RuntimeError as error:
        message = faults.collective_failure(error, cfg.parallel.distributed_timeout_minutes)
        if message is None:
            raise
        print(f"train: rank {os.environ.get('RANK', '0')}: {message}", file=sys.stderr, flush=True)
        return 1
    finally:
        parallel.shutdown()
    return 0


def _track(cfg: TrainConfig, console: Console) -> None:
    """Rank 0, once the run ends: its config, metrics and model version to MLflow (trainer/tracking/). A store
    that cannot be reached is reported, not a failed run: the checkpoints and metrics.jsonl are already written."""
    from trainer.tracking.mlflow_runs import experiment_for, flatten, log_run, tracking_uri

    uri = tracking_uri(cfg.tracking)
    try:
        run_id = log_run(
            cfg.run_dir,
            uri=uri,
            experiment=experiment_for(cfg.tracking, cfg.name, cfg.run_dir),  # a sweep trial's: the sweep's
            run_name=cfg.name,
            params=flatten(cfg.model_dump(mode="json")),
        )
    except Exception as error:  # any failure of the store or its client
        console.print(f"[yellow]tracking:[/] not logged to {uri}: {escape(str(error))}")
        return
    console.print(f"tracking: MLflow run {run_id} in {uri}")


def train(
    cfg: TrainConfig,
    dims: ParallelDims,
    console: Console,
    *,
    fresh: bool = False,
    stop: faults.StopRequest | None = None,
) -> None:
    """The whole run on this rank: build, resume, then step, log, evaluate and save until train_iters, or until
    a rank got SIGTERM (then save and return)."""
    s = cfg.schedule
    if fresh and torch.distributed.get_rank() == 0:
        _remove_run_outputs(cfg)
    torch.distributed.barrier()
    console.print(f"[bold]{cfg.name}[/]: {dims} on {device_type()}, run directory {cfg.run_dir}")
    console.print(precision_note(cfg, device_type()))
    console.print(llama.attention_note(device_type()))
    # The planner's peak against the GPUs' free memory: a clear refusal instead of an out-of-memory traceback.
    kernels = llama.planner_kernels(device_type())
    check_device_memory(cfg, torch.distributed.get_world_size(), vocab_size(cfg), kernels)
    exporters.start(cfg.monitoring, cfg.name, device_type=device_type())
    engine = engines.build(cfg, dims)
    checkpointer = Checkpointer(engine, console)
    progress = checkpointer.load()
    # The cost ledger (rank 0's): every second of this attempt charged to what it bought; stored with each save.
    meter = _meter(cfg, progress, checkpointer) if torch.distributed.get_rank() == 0 else None
    checkpointer.ledger = meter.ledger if meter is not None else None
    if progress.step >= s.train_iters:
        console.print(
            f"already trained to step {progress.step} of {s.train_iters}; nothing to do "
            "(make train FRESH=1, or --fresh, starts over)"
        )
        exporters.stop(completed=True)  # a clean end: the alert rules must not wait for a first step
        if meter is not None:  # this start-up was paid for too
            _charge(meter, "startup")
            meter.save()
        return
    logger = _metrics_logger(engine, progress, console) if torch.distributed.get_rank() == 0 else None
    _charge(meter, "startup")
    if progress.step == 0:
        val_loss: float | None = engine.evaluate()  # the untrained model: where the loss starts
        _charge(meter, "evaluation")
        if logger is not None:
            logger.log(0, val_loss=val_loss, cost=meter.ledger if meter is not None else None)
    batches = engine.train_batches(progress.consumed_samples)
    skips = faults.SkipCounter(cfg.optimizer.max_consecutive_skips, total=progress.skipped_steps)
    health = HealthMonitor(cfg, console)  # health: straggler windows, hang watchdog
    evaluation = IntervalEvaluation(cfg)  # evaluation.suite on the newest checkpoint, in its own process
    try:
        if reason := _cap_reached(cfg, meter):  # spent already (a resumed run): train nothing
            console.print(f"step {progress.step}: {reason} before this run's first step; {_CAP_HINT}")
            return
        while progress.step < s.train_iters:
            if stop is not None and stop.agreed():
                saved = _saved(checkpointer)
                checkpointer.stop(progress)
                _charge_save(meter, checkpointer, saved)
                console.print(f"step {progress.step}: stopped on SIGTERM; resume by running the same command")
                return
            started = time.perf_counter()
            exporters.begin_step()
            try:
                result = engine.train_step(batches, step=progress.step + 1)
            except RuntimeError as error:
                error.add_note(f"in step {progress.step + 1}")
                raise
            step_time = time.perf_counter() - started
            exporters.end_step(step_time)
            progress.step += 1
            progress.consumed_samples += s.global_batch_size
            step, last = progress.step, progress.step == s.train_iters
            # A skipped step bought nothing: lost work, like a step run again after a restart.
            _charge(meter, "restart" if result.skipped else "productive", step=True)
            if meter is not None:
                meter.step_done(step, trained=not result.skipped)
            stragglers = health.step_done(step, step_time)  # health: the same list on every rank
            skips.record(step, result.skipped, newest_checkpoint=checkpointer.newest)
            progress.skipped_steps = skips.total
            if result.skipped:
                console.print(
                    f"step {step}: skipped, no update (loss {result.loss:.4g}, gradient norm {result.grad_norm:.4g}); "
                    f"{skips.in_a_row} in a row (the run stops at {skips.limit}), {skips.total} in all"
                )
            val_loss = engine.evaluate() if step % s.eval_interval == 0 or last else None
            if val_loss is not None:
                _charge(meter, "evaluation")
            capped = _cap_reached(cfg, meter)  # what this step's line records is what the cap saw
            if step % cfg.logging.log_interval == 0 or val_loss is not None or stragglers or capped:
                memory = _max_over_ranks(peak_memory_gib())
                if logger is not None:  # rank 0's
                    logger.log(
                        step,
                        result,
                        step_time_s=step_time,
                        skipped_steps=skips.total,
                        val_loss=val_loss,
                        peak_memory=memory,
                        stragglers=stragglers,
                        cost=meter.ledger if meter is not None else None,
                        evaluation=evaluation.take(),
                    )
                if meter is not None:
                    meter.save()
            _charge(meter, "productive")  # the step's bookkeeping and logging
            saved = _saved(checkpointer)
            checkpointer.save(progress, last_step=last, val_loss=val_loss)
            _charge_save(meter, checkpointer, saved)
            evaluation.after_step(step, checkpointer, last=last)
            if capped and not last:
                saved = _saved(checkpointer)
                checkpointer.stop(progress)  # saves this step unless its save is already a synchronous one
                _charge_save(meter, checkpointer, saved)
                console.print(f"step {step}: {capped}; saved and stopped. {_CAP_HINT}")
                break  # the evaluations already started still report below
        while logger is not None and (evaluated := evaluation.finish()) is not None:
            logger.log(progress.step, evaluation=evaluated)
        _charge(meter, "evaluation")  # waiting for the last evaluations
    finally:
        health.close()
        exporters.stop(completed=sys.exc_info()[0] is None)
        if logger is not None:
            logger.close()
        if meter is not None:  # the money is spent whatever the ending: keep the record, then report it
            _charge(meter, "productive" if sys.exc_info()[0] is None else "restart")
            meter.save()
            console.print(meter.report())


_CAP_HINT = "to go on, resume with a higher budget.max_dollars / budget.max_hours (it counts what was spent)"


def _meter(cfg: TrainConfig, progress: Progress, checkpointer: Checkpointer) -> Meter:
    """Rank 0's cost meter for this attempt, from this process's start (psutil: the OS's record of it)."""
    import psutil

    return Meter.start(
        cfg.budget,
        cfg.run_dir,
        stored=checkpointer.stored_ledger,
        step=progress.step,
        tokens_per_step=cfg.schedule.global_batch_size * cfg.data.seq_length,
        started_at=psutil.Process().create_time(),
        retry=not local.first_attempt(),
        save_interval=cfg.checkpoint.save_interval,
    )


def _charge(meter: Meter | None, category: str, *, step: bool = False) -> None:
    """The paid time since the last charge to `category` (`step`: a step's). On TRAINSTACK_FAULT's clock (tests) a
    step costs the clock's seconds and nothing else costs any time."""
    if meter is None:
        return
    if (clock := faults.clock_seconds()) is None:
        meter.charge(category)
    else:
        meter.charge(category, now=(meter.ledger.marked_at or 0.0) + (clock if step else 0.0))


def _saved(checkpointer: Checkpointer) -> tuple[int | None, str | None]:
    """What the checkpointer saved last (step, optimizer format): a save writes a new step, or the same step again
    in another format (a stop's synchronous save after a background one)."""
    return checkpointer.saved_step, checkpointer.saved_format


def _charge_save(
    meter: Meter | None, checkpointer: Checkpointer, before: tuple[int | None, str | None]
) -> None:
    """A save call's blocking time to checkpoint_stall, and one save to the ledger's count when it wrote one."""
    if meter is not None:
        _charge(meter, "checkpoint_stall")
        if _saved(checkpointer) != before:
            meter.save_done()


def _cap_reached(cfg: TrainConfig, meter: Meter | None) -> str | None:
    """Rank 0's ledger against budget.max_dollars / max_hours, agreed by every rank (a collective when a cap is
    set): the reason to stop, or None (on ranks other than 0 a generic one: rank 0 tells)."""
    if cfg.budget.max_dollars is None and cfg.budget.max_hours is None:
        return None
    reason = meter.cap_reached() if meter is not None else None
    if _max_over_ranks(1.0 if reason else 0.0) == 0:
        return None
    return reason or "the budget cap was reached"


def _max_over_ranks(value: float) -> float:
    tensor = torch.tensor([value], device=device_type())
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return tensor.item()


def _remove_run_outputs(cfg: TrainConfig) -> None:
    """--fresh, with this run's locks held: its checkpoints, metrics, TensorBoard events, ledger and health go; the
    locks stay (checkpoint.dir may be the run directory itself, whose run.lock this run holds)."""
    for entry in cfg.checkpoint_dir.iterdir() if cfg.checkpoint_dir.is_dir() else ():
        if entry.name == run_lock.LOCK_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    shutil.rmtree(cfg.run_dir / "tensorboard", ignore_errors=True)
    (cfg.run_dir / "metrics.jsonl").unlink(missing_ok=True)
    (cfg.run_dir / LEDGER_FILE).unlink(missing_ok=True)
    health_report.remove(cfg.run_dir)


def _metrics_logger(engine: Engine, progress: Progress, console: Console) -> MetricsLogger:
    cfg, s = engine.cfg, engine.cfg.schedule
    flops_per_sequence = model_flops_per_sequence(cfg.model, cfg.data.seq_length, engine.padded_vocab_size)
    return MetricsLogger(
        cfg.run_dir,
        train_iters=s.train_iters,
        start_step=progress.step,
        skipped_steps=progress.skipped_steps,  # the exporters count only this process's skips
        flops_per_step=flops_per_sequence * s.global_batch_size,
        tokens_per_step=s.global_batch_size * cfg.data.seq_length,
        world_size=engine.dims.world_size,
        peak_tflops=peak_tflops_per_device(cfg.logging.peak_tflops_per_device),
        tensorboard=cfg.logging.tensorboard,
        console=console,
    )
