"""The checkpoint directory protocol, whatever the engine's format inside each checkpoint:

    iter_0000200/   one checkpoint, written by the engine into iter_0000200.tmp, then sealed with manifest.json
                    (every file's size and XXH3-128 digest, trainer/checkpoint/digest.py; the validation loss at
                    its step, where known) and renamed into place when every rank has finished
    latest          the name of the newest complete checkpoint, rewritten last
Which checkpoints stay is `retained`'s rule (the checkpointer applies it after each publish): the newest
`keep_last`, the `keep_best` of lowest validation loss, and always the newest intact one; damaged ones are never
deleted. A crash never leaves a half-written `iter_*` directory; old ones are renamed away before they are deleted. A
directory that does not match its manifest (a copy cut short, a truncated file, garbage) is skipped with a
warning, never loaded: finding the newest checks every size and the small files' digests (`damage`), and the
checkpoint a run loads has every byte's digest checked first, the files shared out over the ranks (`verify`). A
save that fails on any rank fails on every rank, and `latest` keeps naming the previous checkpoint.

Only the collectives (`verify`, `stage`, `publish`, `agree_or_raise`) import torch: the `train` command reads the
directory (`latest_checkpoint`, `damage`) before any process group exists, and without torch (trainer/train.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.checkpoint import digest

LATEST = "latest"
MANIFEST = "manifest.json"
# Finding the newest checkpoint re-reads files up to this size (the metadata and common state) to check their
# digests; the tensor files' digests are checked by `verify` before a load.
_QUICK_CHECK_MAX_BYTES = 16 * 2**20


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, or holds another model than the one asked for."""


class CheckpointSaveError(RuntimeError):
    """A save that did not complete on every rank; nothing was published and the previous checkpoint stands."""


@dataclass
class Progress:
    """Where training stands: what a resumed run continues from."""

    step: int = 0
    consumed_samples: int = 0
    skipped_steps: int = 0  # steps skipped for a non-finite loss or gradient norm, in all


def checkpoint_name(step: int) -> str:
    return f"iter_{step:07d}"


def checkpoint_dirs(directory: Path) -> list[Path]:
    """Directories named as checkpoints, oldest first (an unfinished save still carries its .tmp suffix)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_dir() and re.fullmatch(r"iter_\d{7}", p.name))


def write_manifest(checkpoint: Path, step: int, metrics: dict[str, Any] | None = None) -> None:
    """Seal a written checkpoint: every file's size and digest (streamed by its writer, else read now), then the
    writers' side files go."""
    every = [p for p in checkpoint.rglob("*") if p.is_file() and p.name != MANIFEST]
    sides = digest.side_files(every)
    files = sorted(set(every) - set(sides))
    manifest = {"step": step, "files": {str(p.relative_to(checkpoint)): digest.record(p) for p in files}}
    manifest.update(metrics or {})
    write_atomically(checkpoint / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    for side in sides:
        side.unlink()


def _digest_of(path: Path, expected: dict) -> tuple[str, str, str] | None:
    """(the algorithm, the manifest's digest, the file's) under the algorithm the manifest used; None if it
    recorded none."""
    if digest.ALGORITHM in expected:
        return "XXH3-128", expected[digest.ALGORITHM], digest.file_digest(path)
    if "sha256" in expected:  # manifests written before every byte was hashed
        return "SHA-256", expected["sha256"], hashlib.sha256(path.read_bytes()).hexdigest()
    return None


def manifest_value(checkpoint: Path, key: str) -> float | None:
    """A value a checkpoint's manifest recorded beside its files (e.g. val_loss), if any."""
    try:
        value = json.loads((checkpoint / MANIFEST).read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) else None


def damage(checkpoint: Path, *, every_byte: bool = False) -> str | None:
    """What is wrong with a checkpoint directory, measured against the manifest its save wrote last; None when
    every file it lists is there with its size and, for small files (every file with every_byte), its digest."""
    try:
        files = json.loads((checkpoint / MANIFEST).read_text())["files"]
        if not all(isinstance(record, dict) and "bytes" in record for record in files.values()):
            raise ValueError("a file without its size")
    except FileNotFoundError:
        return f"no {MANIFEST} (a save or a copy that did not finish, or not a trainer checkpoint)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return f"unreadable {MANIFEST} ({type(error).__name__}: {error})"
    for name, expected in files.items():
        problem = _file_damage(checkpoint, name, expected, every_byte=every_byte)
        if problem is not None:
            return problem
    return None


def _file_damage(checkpoint: Path, name: str, expected: dict, *, every_byte: bool) -> str | None:
    path = checkpoint / name
    if not path.is_file():
        return f"{name} is missing"
    size = path.stat().st_size
    if size != expected["bytes"]:
        return f"{name} is {size} bytes, the save wrote {expected['bytes']}"
    if every_byte or size <= _QUICK_CHECK_MAX_BYTES:
        digests = _digest_of(path, expected)
        if digests is not None and digests[1] != digests[2]:
            return f"{name} does not hold what the save wrote ({digests[0]} differs)"
    return None


def verify(checkpoint: Path) -> str | None:
    """Every byte of a checkpoint against its manifest, the files shared out over the ranks (each reads about
    1/world of the bytes); what is wrong, the same on every rank, or None. A collective."""
    import torch

    problem = damage(checkpoint)  # the manifest, every size, the small files
    if problem is None:
        files = json.loads((checkpoint / MANIFEST).read_text())["files"]
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        by_size = sorted(files, key=lambda name: -files[name]["bytes"])  # large files spread first
        for name in by_size[rank::world]:
            if (problem := _file_damage(checkpoint, name, files[name], every_byte=True)) is not None:
                break
    found: list[str | None] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(found, problem)
    return next((p for p in found if p is not None), None)


_warned: set[str] = set()


def _warn_on_rank0(message: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0 and message not in _warned:  # once per process
        _warned.add(message)
        print(f"warning: {message}", file=sys.stderr, flush=True)


def latest_checkpoint(
    directory: Path, warn: Callable[[str], None] = _warn_on_rank0, exclude: Collection[Path] = ()
) -> Path | None:
    """The intact checkpoint `latest` names, else the newest intact one; damaged ones are skipped with a warning,
    and those in `exclude` (found damaged already) without one."""
    found = [path for path in checkpoint_dirs(directory) if path not in exclude]
    pointer = directory / LATEST
    named = directory / pointer.read_text().strip() if pointer.is_file() else None
    for candidate in sorted(found, key=lambda path: (path == named, path.name), reverse=True):
        problem = damage(candidate)
        if problem is None:
            return candidate
        warn(f"skipping checkpoint {candidate}: {problem}")
    return None


def damaged_checkpoints(directory: Path, known: Mapping[Path, str] | None = None) -> dict[Path, str]:
    """Every checkpoint directory with what is wrong with it, when none is intact (empty when one is, or none is
    there): the run would otherwise start over silently over its own history. `known`: problems found already."""
    known = known or {}
    problems = {path: known.get(path) or damage(path) for path in checkpoint_dirs(directory)}
    if any(problem is None for problem in problems.values()):
        return {}
    return {path: problem for path, problem in problems.items() if problem is not None}


def stage(directory: Path, step: int) -> Path:
    """The empty `iter_NNNNNNN.tmp` directory every rank writes step's checkpoint into (any engine's format)."""
    import torch

    staging = directory / (checkpoint_name(step) + ".tmp")
    if torch.distributed.get_rank() == 0:
        for unfinished in directory.glob("iter_*.tmp"):  # left by a crash mid-save
            shutil.rmtree(unfinished)
        staging.mkdir(parents=True)
    torch.distributed.barrier()
    return staging


def publish(staging: Path, step: int, metrics: dict[str, Any] | None = None) -> Path:
    """Once every rank has written `staging` (and agreed so): rank 0 seals it (its manifest, with `metrics`),
    renames it and points `latest` at it; every rank learns whether that worked."""
    import torch

    final = staging.with_suffix("")
    failure = None
    if torch.distributed.get_rank() == 0:
        try:
            _publish(staging, final, step, metrics)
        except OSError as error:
            failure = error
    agree_or_raise(failure, f"publishing {final}", staging)
    return final


def _publish(staging: Path, final: Path, step: int, metrics: dict[str, Any] | None) -> None:
    """Seal the staging directory with its manifest, rename it into place, point `latest` at it."""
    directory = final.parent
    write_manifest(staging, step, metrics)
    # The same step saved again (resumed from an older `latest`): swap it in, then drop the old one.
    replaced = final.with_name(final.name + ".replaced.tmp")
    if final.exists():
        final.rename(replaced)
    staging.rename(final)
    write_atomically(directory / LATEST, final.name + "\n")
    shutil.rmtree(replaced, ignore_errors=True)


def retained(directory: Path, keep_last: int, keep_best: int = 0) -> set[Path]:
    """The intact checkpoints retention keeps: the newest `keep_last`, the `keep_best` with the lowest validation
    loss their manifests recorded, and always the newest (keep_last >= 1)."""
    intact = [path for path in checkpoint_dirs(directory) if damage(path) is None]
    scored = [(loss, path) for path in intact if (loss := manifest_value(path, "val_loss")) is not None]
    best = [path for _, path in sorted(scored)[:keep_best]]
    return {*intact[-max(keep_last, 1) :], *best}


def prune(directory: Path, keep_last: int, keep_best: int = 0) -> list[Path]:
    """Delete the intact checkpoints `retained` does not keep (rank 0); what was deleted. Only intact checkpoints
    go: a damaged one may be someone's copy in progress, or the evidence of what went wrong."""
    keep = retained(directory, keep_last, keep_best)
    doomed = [path for path in checkpoint_dirs(directory) if path not in keep and damage(path) is None]
    for old in doomed:
        # Renamed first, so that a crash mid-delete leaves a .tmp directory, not a damaged checkpoint.
        shutil.rmtree(old.rename(old.with_name(old.name + ".pruned.tmp")))
    return doomed


def agree_or_raise(failure: BaseException | None, doing: str, staging: Path) -> None:
    """Every rank learns whether any rank failed; if one did, all raise, after rank 0 clears the staging
    directory (freeing the space a full disk needs back). The previous checkpoint and `latest` stay as they were."""
    import torch

    # One integer all-reduce when no rank failed (every save, twice); the ranks' messages only when one did.
    failing = torch.tensor([int(failure is not None)], device="cuda" if torch.cuda.is_available() else "cpu")
    torch.distributed.all_reduce(failing, op=torch.distributed.ReduceOp.MAX)
    if not failing.item():
        return
    reports: list[dict[int, str]] = [{}] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(reports, _failures(failure) if failure is not None else {})
    failed = {rank: cause for report in reports for rank, cause in report.items()}
    if not failed:
        return
    if torch.distributed.get_rank() == 0:
        shutil.rmtree(staging, ignore_errors=True)
    # An OS error (ENOSPC, EIO, ...) says what to fix; the other ranks' errors only echo it.
    rank = next((r for r in sorted(failed) if "[Errno" in failed[r]), min(failed))
    previous = latest_checkpoint(staging.parent, warn=lambda _: None)
    kept = f"{previous.name} is intact and `latest` still names it" if previous else "no earlier checkpoint"
    if any(marker in failed[rank] for marker in _WRITER_STOPPED):
        raise CheckpointSaveError(
            f"{doing} was abandoned: the checkpoint writer process was killed (SIGKILL to the process group, "
            f"or the kernel's out-of-memory killer). Nothing was published: {kept}. To stop a run "
            "with a save, signal the supervising process (`train` outside torchrun, or `launch`) instead; run "
            "again to resume"
        )
    raise CheckpointSaveError(
        f"{doing} failed on rank {rank}: {failed[rank]}. Nothing was published: {kept}. Fix that (free space "
        "on that file system, or set checkpoint.dir to another) and run again to resume"
    )


# What a rank reads when its background writer (trainer/checkpoint/writer.py) was killed under it: the writer's
# pipe is gone (multiprocessing/connection.py raises EOFError, or EPIPE on a send).
WRITER_ENDED = "the checkpoint writer process ended"
_WRITER_STOPPED = (
    WRITER_ENDED,
    "[Errno 32] Broken pipe",
    "EOFError",
    "[Errno 104] Connection reset by peer",
    "[Errno 111] Connection refused",
)


def _failures(error: BaseException) -> dict[int, str]:
    """The failing ranks and their errors in one line each (dist_checkpointing gathers every rank's failures
    into a CheckpointException keyed by rank)."""
    import torch
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(error, CheckpointException) and error.failures:
        return {
            rank: str(exc).removeprefix("Worker failure: ").splitlines()[0] or type(exc).__name__
            for rank, (exc, _) in error.failures.items()
        }
    return {torch.distributed.get_rank(): str(error).splitlines()[0] if str(error) else type(error).__name__}


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
