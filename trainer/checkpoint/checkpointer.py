"""The run's checkpoints as the training loop sees them: `load()` once, then `save(progress, ...)` after each step.

The checkpointer owns everything between the loop and an engine's checkpoint format: which checkpoint a run starts
from (rank 0 picks, every rank loads the same), the save interval, background saves (trainer/checkpoint/writer.py)
and publishing them at a step boundary once every rank's write is done, the stop save, each published
checkpoint's model version record (trainer/checkpoint/version.py, rank 0), and retention (the newest `keep_last`, the
`keep_best` by validation loss, never the newest intact one). The engine only writes and reads its format
(`save`, `load`): the checkpointer sees it as a `Checkpointable`, the five members it uses, declared here (as
torchtitan's checkpoint manager declares the storage it needs) so that this package knows nothing of the engines
above it; every `trainer.engines.Engine` is one.

Every method is a collective: every rank calls it at the same point of the loop with the same arguments (the
ranks agree on a write's failure and on publishing; rank 0 alone renames, points `latest` and prunes).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
from rich.console import Console

from trainer.checkpoint import formats
from trainer.checkpoint.start import Start, starting_checkpoint
from trainer.checkpoint.store import MANIFEST, CheckpointError, Progress, latest_checkpoint, prune, verify
from trainer.checkpoint.version import Lineage, RecordError, write_record
from trainer.checkpoint.writer import Write, Writer
from trainer.contract import metrics as registry
from trainer.cost.ledger import MANIFEST_KEY, Ledger
from trainer.monitoring import exporters

if TYPE_CHECKING:
    from trainer.checkpoint.record import ModelRecord
    from trainer.config import TrainConfig

# The format a synchronous save of the distributed optimizer uses under checkpoint.optimizer_format auto.
_ANY_LAYOUT = "fully_reshardable"


class Checkpointable(Protocol):
    """What the checkpointer uses of an engine: its config, its model's record, and its format's save and load."""

    cfg: TrainConfig
    model_record: ModelRecord  # what each checkpoint records about the model
    saves_in_background: bool  # whether `save` takes a Writer

    def save(self, progress: Progress, *, writer: Writer | None = None) -> Write:
        """Write this step's checkpoint into the store's staging directory, on every rank; with a writer, in
        the background."""

    def load(self, path: Path, *, weights_only: bool = False) -> Progress:
        """Restore a checkpoint (any format: the weights alone from another engine's); where training stands."""


class Checkpointer:
    """Loads, saves, publishes and prunes one run's checkpoints for the training loop."""

    def __init__(self, engine: Checkpointable, console: Console) -> None:
        self.engine = engine
        self.cfg = engine.cfg.checkpoint
        self.directory = engine.cfg.checkpoint_dir
        self.console = console
        # The background writer's process starts now, so that it has imported torch by the first interval save.
        self.writer = Writer() if engine.saves_in_background and self.cfg.async_save else None
        self.in_flight: Write | None = None  # a background save not yet published
        # The step of the newest save started or loaded, and its optimizer format (None: nothing to choose).
        self.saved_step: int | None = None
        self.saved_format: str | None = None
        # The run's cost ledger (rank 0's), stored in each save's manifest; and the one the resumed save stored.
        self.ledger: Ledger | None = None
        self.stored_ledger: Ledger | None = None
        self.lineage: Lineage | None = (
            None  # what the run's model version records share, at the first publish
        )

    def load(self) -> Progress:
        """Load the run's newest intact checkpoint, else checkpoint.load, if either; where training stands. Rank 0
        picks it (warning about damaged ones) and tells the others, so that every rank loads the same one; every
        byte of it is checked first (the ranks share the files), and a damaged one of the run's own gives way to
        the one before it. A run whose checkpoints are all damaged stops here (CheckpointError on every rank)."""
        start = self._verified_start()
        self.saved_step = 0  # a stop before the first step saves nothing
        if start is None:
            return Progress()
        with exporters.timed(registry.CHECKPOINT_LOAD):
            progress = self.engine.load(start.path, weights_only=start.weights_only)
        if start.resumed:  # this run's own checkpoint: what was spent up to it
            self.stored_ledger = _stored_ledger(start.path)
        source = formats.read_record(start.path)
        if source is not None and source.hf_config:  # carried along, so that an export writes it back
            self.engine.model_record = replace(self.engine.model_record, hf_config=source.hf_config)
        if not start.resumed and progress.step == 0:
            self.console.print(
                f"started from the weights in {start.path} (checkpoint.load): new optimizer and LR schedule"
            )
        else:
            what = "resumed from" if start.resumed else "continued from checkpoint.load"
            self.console.print(
                f"{what} {start.path} (step {progress.step}, {progress.consumed_samples:,} samples seen)"
            )
        self.saved_step = progress.step  # a stop before the next step need not save it again
        return progress

    def _verified_start(self) -> Start | None:
        damaged: dict[Path, str] = {}
        while True:
            picked: list[Start | CheckpointError | None] = [None]
            if torch.distributed.get_rank() == 0:
                try:
                    picked[0] = starting_checkpoint(self.engine.cfg, damaged=damaged)
                except CheckpointError as error:
                    picked[0] = error
            torch.distributed.broadcast_object_list(picked, src=0)
            start = picked[0]
            if isinstance(start, CheckpointError):
                raise start
            if start is None:
                return None
            problem = verify(start.path)
            if problem is None:
                return start
            if not start.resumed:
                raise CheckpointError(f"checkpoint.load = {start.path}: {problem}")
            self.console.print(f"[yellow]warning:[/] skipping checkpoint {start.path}: {problem}")
            damaged[start.path] = problem

    def due(self, step: int, *, last_step: bool) -> bool:
        """Whether the loop saves after `step`: on checkpoint.save_interval, and after the last step."""
        return last_step or bool(self.cfg.save_interval and step % self.cfg.save_interval == 0)

    def save(self, progress: Progress, *, last_step: bool = False, val_loss: float | None = None) -> None:
        """After a step: save when due (in the background on the interval where the engine can, synchronously
        after the last step) and publish any background save whose write every rank has finished."""
        self.publish(wait=False)
        if self.due(progress.step, last_step=last_step):
            background = self.cfg.async_save and not last_step
            self._save(progress, background=background, val_loss=val_loss)

    def stop(self, progress: Progress) -> None:
        """The save before a stop (SIGTERM): publish the one in flight, then save synchronously unless this step's
        save already is (a background one at this step is saved again: synchronous saves load at any layout)."""
        self.publish(wait=True)
        if self.saved_step != progress.step or self.saved_format not in (None, _ANY_LAYOUT):
            self._save(progress, background=False)

    def publish(self, *, wait: bool) -> Path | None:
        """Publish the background save once every rank's write is done (wait: until it is), then prune."""
        write = self.in_flight
        if write is None or not (wait or write.done()):
            return None
        self.in_flight = None
        published = write.finish()
        self.console.print(f"saved {published}")
        self._register(published, write)
        self._prune()
        return published

    def newest(self) -> Path | None:
        """The newest intact checkpoint, once a save still in flight is published."""
        self.publish(wait=True)
        return latest_checkpoint(self.directory, warn=lambda _: None)

    def _save(self, progress: Progress, *, background: bool, val_loss: float | None = None) -> None:
        self.publish(wait=True)  # one save in flight at most; it is published before the next is staged
        writer = self.writer if background else None
        if writer is not None:
            writer.ready()
        with exporters.timed(registry.CHECKPOINT_SAVE):
            write = self.engine.save(progress, writer=writer)
        if val_loss is not None:
            write.metrics["val_loss"] = val_loss
        if self.ledger is not None:
            write.metrics[MANIFEST_KEY] = self.ledger.to_dict()
        self.saved_step, self.saved_format = progress.step, write.optimizer_format
        if write.queue is not None:
            self.in_flight = write
            self.console.print(
                f"step {progress.step}: saving in the background (published when every rank has written)"
            )
            return
        published = write.finish()
        self.console.print(f"step {progress.step}: saved {published}")
        self._register(published, write)
        self._prune()

    def _register(self, published: Path, write: Write) -> None:
        """Rank 0 writes the published checkpoint's model version record beside it (trainer/checkpoint/version.py);
        a record that cannot be written costs the lineage, not the run: a warning."""
        if torch.distributed.get_rank() != 0:
            return
        try:
            self.lineage = self.lineage or Lineage(self.engine.cfg.model_dump(mode="json"))
            write_record(published, self.lineage.record(published, write.step, write.metrics))
        except (RecordError, OSError) as error:
            self.console.print(f"[yellow]warning:[/] {published} has no model version record: {error}")

    def _prune(self) -> None:
        if torch.distributed.get_rank() == 0:
            prune(self.directory, self.cfg.keep_last, self.cfg.keep_best)


def _stored_ledger(checkpoint: Path) -> Ledger | None:
    """The cost ledger a checkpoint's manifest stored (None: saved before the ledger, or unreadable)."""
    try:
        values = json.loads((checkpoint / MANIFEST).read_text()).get(MANIFEST_KEY)
        return Ledger.from_dict(values) if isinstance(values, dict) else None
    except (OSError, ValueError, TypeError):
        return None
