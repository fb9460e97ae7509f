"""The training fixtures every test folder may use (a pytest plugin, tests/conftest.py): a tiny prepared corpus,
the tiny config (tiny.yaml beside this file), and multi-process runs of worker.py.

A launch costs 10-20 s on 2 cores, so each layout runs once per pytest run, whichever xdist worker asks first
(tests/support/shared.py), and tests compare the results; they read them only.
"""

from __future__ import annotations

import email
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from tests.conftest import ROOT
from tests.support.shared import build_once, run_root

TIMEOUT_S = 300


def torchrun(nproc: int, worker: str, *args: str) -> list[str]:
    """torchrun running a test worker as a module (`tests.support.worker`) in every process: run from the
    repository root (cwd=ROOT), each imports `trainer` and `tests` as packages, with no path of its own."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [*command, "-m", worker, *args]


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> str:
    """The email package's sources, tokenized with a 512-token BPE; returns the dataset prefix."""
    from trainer.data.prepare import prepare_dataset

    def prepare(directory: Path) -> None:
        prefix = str(directory / "email")
        prepare_dataset([str(Path(email.__file__).parent)], prefix, vocab_size=512, globs=["*.py"], workers=1)

    return str(build_once(tmp_path_factory, "corpus", prepare) / "email")


@pytest.fixture(scope="session")
def tiny_config(tmp_path_factory, tiny_corpus) -> Path:
    def write(directory: Path) -> None:
        text = Path(__file__).with_name("tiny.yaml").read_text().replace("PREFIX", tiny_corpus)
        (directory / "tiny.yaml").write_text(text)

    return build_once(tmp_path_factory, "config", write) / "tiny.yaml"


@pytest.fixture
def single_process_group(tmp_path):
    """torch.distributed over gloo in this process alone (world size 1), for the store's collectives."""
    import torch

    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


def sealed_checkpoint(path: Path, val_loss: float | None = None) -> Path:
    """A directory as a finished save leaves it: a data file, then the manifest that lists it (with the validation
    loss at its step, where given)."""
    from trainer.checkpoint.store import write_manifest

    path.mkdir(parents=True)
    (path / "common.pt").write_bytes(b"weights")
    metrics = {"val_loss": val_loss} if val_loss is not None else None
    write_manifest(path, int(path.name.removeprefix("iter_")), metrics)
    return path


@dataclass
class Result:
    """What one launch left behind."""

    run_dir: Path
    out: Path

    @property
    def records(self) -> list[dict]:
        return [json.loads(line) for line in (self.run_dir / "metrics.jsonl").read_text().splitlines()]

    def losses(self) -> dict[int, float]:
        return {r["step"]: r["loss"] for r in self.records if r["loss"] is not None}

    def gradients(self) -> list[dict[str, Any]]:
        """Per recorded step, every parameter's full gradient, merged over pipeline stages."""
        import torch

        steps: list[dict[str, torch.Tensor]] = []
        for path in sorted(self.out.glob("grads_pp*.pt")):
            for i, gradients in enumerate(torch.load(path)):
                if i == len(steps):
                    steps.append({})
                steps[i].update(gradients)
        return steps

    @property
    def val_loss(self) -> float:
        return json.loads((self.out / "val_loss.json").read_text())


class Launcher:
    def __init__(self, base: Path, config: Path):
        self.base, self.config = base, config
        self.results: dict[str, Result] = {}

    def run_dir(self, name: str) -> Path:
        return self.base / name / "run"

    def launch(
        self, name: str, nproc: int, *overrides: str, mode: str = "train", checkpoint: Path | None = None
    ):
        """Run the worker once per pytest run under this name (in whichever worker asks first; the others wait for
        it and read what it left); later calls return the first result."""
        if name in self.results:
            return self.results[name]
        with FileLock(str(self.base / f"{name}.lock")):
            if not (self.base / f"{name}.done").exists():
                self._launch(name, nproc, overrides, mode, checkpoint)
                (self.base / f"{name}.done").touch()
        self.results[name] = Result(self.run_dir(name), self.base / name / "out")
        return self.results[name]

    def _launch(
        self, name: str, nproc: int, overrides: tuple[str, ...], mode: str, checkpoint: Path | None
    ) -> None:
        out = self.base / name / "out"
        out.mkdir(parents=True, exist_ok=True)
        command = torchrun(
            nproc,
            "tests.support.worker",
            mode,
            str(self.config),
            str(out),
            *([str(checkpoint)] if checkpoint else []),
        )
        for override in (f"logging.run_dir={self.run_dir(name)}", *overrides):
            command += ["--set", override]
        self.run(name, command)

    def run_once(self, name: str, command: list[str]) -> str:
        """`run` once per pytest run, for a session fixture more than one file (so more than one worker) asks for."""
        with FileLock(str(self.base / f"{name}.lock")):
            if not (self.base / f"{name}.done").exists():
                self.run(name, command)
                (self.base / f"{name}.done").touch()
        return (self.base / name / "log.txt").read_text()

    def run(self, name: str, command: list[str]) -> str:
        """Run a command (a torchrun launch, or a verb that starts one) to success; returns its output."""
        log = self.base / name / "log.txt"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as output:
            # Its own session, so that a timeout takes down torchrun's workers too.
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                stdout=output,
                stderr=subprocess.STDOUT,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
                start_new_session=True,
            )
            try:
                process.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        assert process.returncode == 0, f"{name} failed ({process.returncode}):\n" + log.read_text()[-6000:]
        return log.read_text()


@pytest.fixture(scope="session")
def launcher(tmp_path_factory, tiny_config) -> Launcher:
    """Launches shared by every worker of the run (`launch`); `run` logs under the same directory."""
    base = run_root(tmp_path_factory) / "runs"
    base.mkdir(exist_ok=True)
    return Launcher(base, tiny_config)


@pytest.fixture(scope="session")
def single(launcher) -> Result:
    """The reference: 20 steps in one process (TP=1, PP=1, DP=1), checkpoints every 5, keeping 3."""
    return launcher.launch("single", 1)


@pytest.fixture(scope="session")
def tp2_pp2(launcher) -> Result:
    """3 steps at TP=2 x PP=2 (4 processes), ending with a checkpoint and a validation loss."""
    return launcher.launch(
        "tp2_pp2",
        4,
        "parallel.tensor_model_parallel_size=2",
        "parallel.pipeline_model_parallel_size=2",
        "schedule.train_iters=3",
    )
