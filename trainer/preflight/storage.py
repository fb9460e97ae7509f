"""Is the checkpoint root the cluster's shared Lustre file system, mounted so that a run's lock holds on it?

`os.path.ismount` is not enough: when the host's FSx mount fails, Docker still bind-mounts the host's empty /fsx
directory (on the root volume) into the container, where it is a mount point of the root volume's file system.
The file system type in /proc/self/mountinfo tells them apart (proc(5): mount ID, parent ID, major:minor, root,
mount point, options, optional fields, "-", file system type, source, super options; spaces in paths are written
as \\040), and only a file one node writes and every other node reads proves the storage is shared.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class Mount:
    mount_point: str
    root: str  # the path inside the source file system that is mounted here ("/" unless a bind mount)
    fstype: str
    source: str
    super_options: tuple[str, ...] = ()  # the file system's own options, the field after the source


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape") if "\\" in field else field


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        separator = fields.index("-", 6)
        options = tuple(fields[separator + 3].split(",")) if len(fields) > separator + 3 else ()
        mounts.append(
            Mount(
                _unescape(fields[4]),
                _unescape(fields[3]),
                fields[separator + 1],
                fields[separator + 2],
                options,
            )
        )
    return mounts


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount `path` lives on: the longest mount point containing it, the later one of equal length (a mount
    over another hides it)."""
    best = None
    for mount in mounts:
        prefix = mount.mount_point.rstrip("/") + "/"
        if (path + "/").startswith(prefix) and (
            best is None or len(mount.mount_point) >= len(best.mount_point)
        ):
            best = mount
    return best


def lustre_problem(path: str, mountinfo_text: str) -> str | None:
    """Why `path` is not on Lustre, or None when it is."""
    mount = mount_of(path, parse_mountinfo(mountinfo_text))
    if mount is None:
        return f"{path} is on no mount in /proc/self/mountinfo"
    if mount.fstype != "lustre":
        origin = f"{mount.source}:{mount.root}" if mount.root != "/" else mount.source
        return (
            f"{path} is on {mount.fstype} ({origin} mounted at {mount.mount_point}), not Lustre: the host's FSx "
            "mount failed and checkpoints would go to a disk deleted with the instance"
        )
    # A run's lock (trainer/launch/run_lock.py) holds across nodes only with `flock` ("coherent across all client
    # nodes"; `localflock`: this node only; `noflock`: flock fails), mount.lustre(8).
    if "flock" not in mount.super_options:
        return (
            f"{path} is Lustre mounted without flock ({','.join(mount.super_options) or 'no options'}): a run's "
            "lock on its directory would not hold across nodes; mount it with -o flock (infra/node_bootstrap.py)"
        )
    return None


def write_token(directory: Path, node: int, token: str) -> None:
    """This node's token file, synced so that the other nodes can read it once the barrier has passed."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"node-{node}.token"
    with open(path, "w") as file:
        file.write(token)
        file.flush()
        os.fsync(file.fileno())


def unseen_tokens(directory: Path, tokens: dict[int, str], node: int) -> list[str]:
    """The other nodes whose token this node does not read back, each with what it found."""
    problems = []
    for other, token in sorted(tokens.items()):
        if other == node:
            continue
        path = directory / f"node-{other}.token"
        try:
            found = path.read_text()
        except OSError as error:
            problems.append(f"node {other}'s {path.name}: {error.strerror or error}")
            continue
        if found != token:
            problems.append(f"node {other}'s {path.name} holds {found!r}, not the token node {other} wrote")
    return problems
