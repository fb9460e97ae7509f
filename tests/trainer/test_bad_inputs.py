"""Bad input catalogue, training half (docs/bad-inputs.md): each row runs `python -m trainer <verb>` in this process
(its main(argv), the code `make train` runs) on a bad config, dataset, tokenizer, checkpoint or argument, and pins
one message naming the key, the bad value and what is valid; exit 2; no traceback; no torchrun started; and every
file that existed (the corpus, the checkpoints, the test's own directory) byte-identical afterwards."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from trainer.__main__ import main as trainer_main

# Path placeholders in a row: {config} the tiny config, {corpus} its prepared dataset (PREFIX), {checkpoints} a
# finished run's checkpoint directory, {tmp} the test's own directory (bad copies live there).
Paths = dict[str, str]


@dataclass(frozen=True)
class Row:
    argv: str  # the verb's command line, with placeholders
    says: tuple[str, ...]  # fragments of the one message, with placeholders
    setup: Callable[[Paths], None] | None = None  # writes the bad file(s) under {tmp}
    exit_status: int = 2


def copy_dataset(paths: Paths, name: str, *, manifest: bool = True) -> str:
    """The corpus's files copied to {tmp}/<name>.*; returns the new prefix."""
    prefix = f"{paths['tmp']}/{name}"
    for suffix in (".bin", ".idx", ".tokenizer.json", *([".manifest.json"] if manifest else [])):
        shutil.copyfile(paths["corpus"] + suffix, prefix + suffix)
    if manifest:
        manifest_path = Path(prefix + ".manifest.json")
        manifest_path.write_text(manifest_path.read_text().replace(Path(paths["corpus"]).name, name))
    return prefix


def damaged(name: str, *, manifest: bool = True, **edits: Callable[[Path], None]) -> Callable[[Paths], None]:
    """A setup that copies the corpus as <name> and applies `edits` (suffix without the dot -> edit)."""

    def setup(paths: Paths) -> None:
        prefix = copy_dataset(paths, name, manifest=manifest)
        for suffix, edit in edits.items():
            edit(Path(f"{prefix}.{suffix.replace('_', '.')}"))

    return setup


def chat_lines(*lines: str) -> Callable[[Paths], None]:
    """A setup that writes {tmp}/chat.jsonl with these lines."""

    def setup(paths: Paths) -> None:
        Path(paths["tmp"], "chat.jsonl").write_text("".join(line + "\n" for line in lines))

    return setup


def sweep_file(space: str) -> Callable[[Paths], None]:
    """A setup that writes {tmp}/s.yaml: a sweep over the tiny config with this space line."""

    def setup(paths: Paths) -> None:
        Path(paths["tmp"], "s.yaml").write_text(f"recipe: {paths['config']}\n" + space.format() + "\n")

    return setup


def cpu_run_ledger(paths: Paths) -> None:
    """{tmp}/run/ledger.json of a 4-layer run paid as 'local' (this machine), its model version record beside it."""
    run = Path(paths["tmp"], "run")
    (run / "checkpoints" / "iter_0000060").mkdir(parents=True)
    (run / "ledger.json").write_text(
        json.dumps({"step": 60, "attempts": 1, "saves": 1, "node_hours": {"local": 0.01}})
    )
    model = {"num_layers": 4, "hidden_size": 128, "ffn_hidden_size": 352, "num_attention_heads": 4}
    (run / "checkpoints" / "iter_0000060" / "model_version.json").write_text(
        json.dumps({"config": {"model": model}})
    )


_HELD: list[int] = []  # the locks a setup holds, open while the row's command runs


def sweep_driver_running(paths: Paths) -> None:
    """A valid sweep {tmp}/s.yaml whose study runs/sweeps/s/ another driver holds (its lock, taken here)."""
    sweep_file("pruner: {{kind: none}}\nspace: {{optimizer.lr: {{low: 0.001, high: 0.01}}}}")(paths)
    study = Path(paths["tmp"], "runs", "sweeps", "s")
    study.mkdir(parents=True)
    fd = os.open(study / "driver.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"pid": 4242, "host": "elsewhere", "started": 86400}).encode())
    _HELD.append(fd)


def empty(path: Path) -> None:
    path.write_bytes(b"")


def garbage(path: Path) -> None:
    """Bytes of the same length as before, so only the contents give it away."""
    path.write_bytes(bytes(i % 251 for i in range(path.stat().st_size)))


def random_bytes(path: Path) -> None:
    """40 random bytes written inside the index's arrays: header intact, size unchanged (the reported case)."""
    data = bytearray(path.read_bytes())
    data[60:100] = random.Random(40).randbytes(40)
    path.write_bytes(bytes(data))


def bit_flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:1000])


def deleted(path: Path) -> None:
    path.unlink()


def other_tokenizer(paths: Paths) -> None:
    from trainer.data.tokenizer import train_bpe

    train_bpe(["a different corpus, a different vocabulary"] * 20, 300).save(f"{paths['tmp']}/other.json")


def other_tool_dataset_and_small_tokenizer(paths: Paths) -> None:
    copy_dataset(paths, "foreign", manifest=False)
    other_tokenizer(paths)


def garbage_checkpoint(paths: Paths) -> None:
    checkpoint = Path(paths["tmp"]) / "torn" / "iter_0000003"
    checkpoint.mkdir(parents=True)
    (checkpoint / "metadata.json").write_text('{"sharded_backend": ')
    (checkpoint.parent / "latest").write_text("iter_0000003\n")


def truncated_checkpoint(paths: Paths) -> None:
    """A finished checkpoint copied, and its metadata cut short (a copy that did not finish)."""
    checkpoint = Path(paths["tmp"]) / "cut" / "iter_0000020"
    shutil.copytree(Path(paths["checkpoints"]) / "iter_0000020", checkpoint)
    metadata = checkpoint / "metadata.json"
    metadata.write_bytes(metadata.read_bytes()[:10])


def run_with_own_checkpoint(paths: Paths) -> None:
    checkpoints = Path(paths["tmp"]) / "run" / "checkpoints"
    shutil.copytree(Path(paths["checkpoints"]) / "iter_0000020", checkpoints / "iter_0000020")
    (checkpoints / "latest").write_text("iter_0000020\n")


# Run locks the rows' setups hold, as a live run would; released once the row has run.
HELD: list = []


def run_in_use(paths: Paths) -> None:
    """{tmp}/run with a checkpoint of its own, held by a live run (here: this process)."""
    from trainer.launch import run_lock

    run_with_own_checkpoint(paths)
    HELD.append(run_lock.acquire(Path(paths["tmp"]) / "run"))


def checkpoints_in_use(paths: Paths) -> None:
    """{tmp}/run with a checkpoint of its own, its run and checkpoint directories held by a live run."""
    from trainer.launch import run_lock

    run_with_own_checkpoint(paths)
    HELD.extend(run_lock.hold(Path(paths["tmp"]) / "run", Path(paths["tmp"]) / "run" / "checkpoints"))


def a_file(name: str) -> Callable[[Paths], None]:
    """A setup that writes a regular file {tmp}/<name>."""
    return lambda paths: Path(paths["tmp"], name).write_text("not a directory\n")


class _Writable:
    """Undoes `unwritable`, once the row has run (pytest must be able to remove {tmp})."""

    def __init__(self, path: Path):
        self.path = path

    def release(self) -> None:
        subprocess.run(["chattr", "-i", str(self.path)], capture_output=True)
        self.path.chmod(0o755)


def unwritable(paths: Paths) -> None:
    """{tmp}/run, an existing run directory in which nothing can be created: immutable (chattr +i refuses root
    too, whom a read-only mode does not stop), or read-only where this user may not make it immutable."""
    run_dir = Path(paths["tmp"], "run")
    run_dir.mkdir()
    HELD.append(_Writable(run_dir))
    if subprocess.run(["chattr", "+i", str(run_dir)], capture_output=True).returncode != 0:
        run_dir.chmod(0o555)


def lock_file_is_a_directory(paths: Paths) -> None:
    Path(paths["tmp"], "run", "run.lock").mkdir(parents=True)


def config_with_a_key_twice(paths: Paths) -> None:
    Path(paths["tmp"], "twice.yaml").write_text(
        "model:\n  num_layers: 2\noptimizer:\n  lr: 0.001\n  weight_decay: 0.1\n  lr: 0.01\n"
    )


def yaml_with_a_typo(paths: Paths) -> None:
    text = Path(paths["config"]).read_text().replace("micro_batch_size:", "micro_batch_sise:")
    Path(paths["tmp"], "typo.yaml").write_text(text)


def hf_model_of_another_shape(paths: Paths) -> None:
    from safetensors.torch import save_file

    model = Path(paths["tmp"]) / "hf"
    model.mkdir()
    config = {
        "model_type": "llama",
        "vocab_size": 512,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    }
    (model / "config.json").write_text(json.dumps(config))
    save_file({"model.embed_tokens.weight": torch.zeros(512, 64)}, model / "model.safetensors")


def tokens_file(paths: Paths) -> None:
    Path(paths["tmp"], "tokens.json").write_text(json.dumps([[1, 2, 3], [4, 512]]))


TRAIN = "train --config {config}"
DEEPSPEED = f"{TRAIN} --set engine=deepspeed"
ROWS: dict[str, Row] = {
    # --- trainer config ---------------------------------------------------------------------------------------
    "train-heads-not-divisible-by-tp": Row(
        f"{TRAIN} --set parallel.tensor_model_parallel_size=3",
        ("model.num_attention_heads = 4 is not divisible by parallel.tensor_model_parallel_size = 3",),
    ),
    "train-query-groups-not-divisible-by-tp": Row(
        f"{TRAIN} --set parallel.tensor_model_parallel_size=4",
        ("model.num_query_groups = 2 is not divisible by parallel.tensor_model_parallel_size = 4",),
    ),
    "train-layers-not-divisible-by-pp-x-vp": Row(
        f"{TRAIN} --set parallel.pipeline_model_parallel_size=2 --set parallel.virtual_pipeline_model_parallel_size=3",
        ("model.num_layers = 8 is not divisible by parallel.pipeline_model_parallel_size x", "= 2 x 3 = 6"),
    ),
    "train-world-size-not-tp-x-pp-x-dp": Row(
        f"{TRAIN} --nproc 4 --set parallel.data_parallel_size=3",
        ("world size 4 != parallel.tensor_model_parallel_size x", "launch 3 processes or set"),
    ),
    "train-monitoring-switch-invalid": Row(
        f"{TRAIN} --set monitoring.prometheus=loud",
        ("monitoring.prometheus = 'loud': Input should be 'auto', 'on' or 'off'",),
    ),
    "train-monitoring-port-privileged": Row(
        f"{TRAIN} --set monitoring.prometheus_port=80",
        ("monitoring.prometheus_port = 80: Input should be greater than or equal to 1024",),
    ),
    "train-world-size-not-divisible-by-tp-x-pp": Row(
        f"{TRAIN} --nproc 3 --set parallel.tensor_model_parallel_size=2",
        ("world size 3 is not divisible by parallel.tensor_model_parallel_size x", "= 2 x 1 = 2"),
    ),
    "train-global-batch-not-divisible": Row(
        f"{TRAIN} --set schedule.global_batch_size=7",
        (
            "schedule.global_batch_size = 7 is not divisible by schedule.micro_batch_size x data parallel size = 2 x 1",
        ),
    ),
    "train-sequence-parallel-on-cpu": Row(
        f"{TRAIN} --set parallel.tensor_model_parallel_size=2 --set parallel.sequence_parallel=true",
        ("parallel.sequence_parallel = true cannot run on CPU", "set it to false here (it works on GPUs)"),
    ),
    "train-config-file-missing": Row(
        "train --config {tmp}/none.yaml", ("config file '{tmp}/none.yaml' not found",)
    ),
    "train-dollar-cap-without-price": Row(
        f"{TRAIN} --set budget.max_dollars=5",
        (
            "budget.max_dollars = 5 needs a price: a local run has no price list, so set budget.price_per_hour",
            "or use budget.max_hours",
        ),
    ),
    "train-unknown-key-in-set": Row(
        f"{TRAIN} --set schedule.train_iter=5",
        ("unknown key 'schedule.train_iter'; did you mean 'schedule.train_iters'?",),
    ),
    "train-key-given-twice-in-yaml": Row(
        "train --config {tmp}/twice.yaml",
        (
            "optimizer.lr is given twice, on line 4 and on line 6: YAML keys must be unique; keep the one you mean "
            "and delete the other",
        ),
        config_with_a_key_twice,
    ),
    "train-learning-rate-infinite": Row(
        f"{TRAIN} --set optimizer.lr=inf", ("optimizer.lr = 'inf': must be a finite number > 0",)
    ),
    "train-beta-not-a-number": Row(
        f"{TRAIN} --set optimizer.adam_beta2=.nan",
        ("optimizer.adam_beta2 = nan: must be a finite number >= 0 and < 1",),
    ),
    "train-unknown-key-in-yaml": Row(
        "train --config {tmp}/typo.yaml",
        ("unknown key 'schedule.micro_batch_sise'; did you mean 'schedule.micro_batch_size'?",),
        yaml_with_a_typo,
    ),
    "train-wrong-type-integer": Row(
        f"{TRAIN} --set schedule.train_iters=five",
        ("schedule.train_iters = 'five': Input should be a valid integer",),
    ),
    "train-wrong-type-boolean": Row(
        f"{TRAIN} --set parallel.sequence_parallel=maybe",
        ("parallel.sequence_parallel = 'maybe': Input should be a valid boolean",),
    ),
    "train-negative-size": Row(
        f"{TRAIN} --set model.hidden_size=-1", ("model.hidden_size = -1: Input should be greater than 0",)
    ),
    "train-split-without-validation": Row(
        f"{TRAIN} --set data.split=100,0,0",
        ("data.split = '100,0,0': the train and validation weights must be above 0",),
    ),
    "train-split-leaves-a-split-empty": Row(
        f"{TRAIN} --set data.split=99999,1,0",
        ("data.split = '99999,1,0': split '99999,1,0' leaves the valid split of dataset '{corpus}'",),
    ),
    "train-nproc-zero": Row(f"{TRAIN} --nproc 0", ("argument --nproc: 0: must be at least 1",)),
    # --- engine: deepspeed -------------------------------------------------------------------------------------
    "deepspeed-zero3-with-tensor-parallelism": Row(
        f"{DEEPSPEED} --set zero.stage=3 --set parallel.tensor_model_parallel_size=2",
        ("parallel.tensor_model_parallel_size = 2 needs engine: megatron", "(TP = PP = 1): set it to 1"),
    ),
    "deepspeed-optimizer-offload-at-stage-1": Row(
        f"{DEEPSPEED} --set zero.stage=1 --set zero.offload_optimizer=cpu",
        ("zero.offload_optimizer = 'cpu' needs zero.stage 2 or 3 (got 1)",),
    ),
    "deepspeed-parameter-offload-below-stage-3": Row(
        f"{DEEPSPEED} --set zero.stage=2 --set zero.offload_param=cpu",
        ("zero.offload_param = 'cpu' needs zero.stage 3 (got 2)",),
    ),
    "deepspeed-raw-key-conflicts-with-the-trainers": Row(
        f"{DEEPSPEED} --set deepspeed.train_batch_size=3",
        ("deepspeed.train_batch_size = 3 conflicts with", "derives from schedule.global_batch_size"),
    ),
    "deepspeed-raw-key-unknown-to-deepspeed": Row(
        f"{DEEPSPEED} --set deepspeed.zero_optimization.stag=3",
        ("deepspeed.zero_optimization.stag = 3: Extra inputs are not permitted",),
    ),
    # --- dataset files -----------------------------------------------------------------------------------------
    "data-path-missing": Row(
        f"{TRAIN} --set data.prefixes=[{{tmp}}/nothere]",
        (
            "data.prefixes[0] = '{tmp}/nothere': dataset '{tmp}/nothere' not found",
            "python -m trainer prepare",
        ),
    ),
    "data-bin-missing": Row(
        f"{TRAIN} --set data.prefixes=[{{tmp}}/d]",
        ("dataset '{tmp}/d' not found: no {tmp}/d.bin",),
        damaged("d", bin=deleted),
    ),
    "data-idx-missing": Row(
        f"{TRAIN} --set data.prefixes=[{{tmp}}/d]",
        ("dataset '{tmp}/d' not found: no {tmp}/d.idx",),
        damaged("d", idx=deleted),
    ),
    "data-empty-files": Row(
        f"{TRAIN} --set data.prefixes=[{{tmp}}/d]",
        ("{tmp}/d.bin is 0 bytes, its manifest says", "re-run `python -m trainer prepare ... --force`"),
        damaged("d", bin=empty, idx=empty),
    ),
    "data-truncated-bin": Row(
        f"{TRAIN} --set data.prefixes=[{{tmp}}/d]",
        ("{tmp}/d.bin is 1000 bytes, its manifest says",),
        damaged("d", bin=truncate),
    ),
    "data-corrupt-idx": Row(
        f"{TRAIN} --set data.prefixes=[{{tmp}}/d]",
        (
            "{tmp}/d.idx has the recorded size but other contents",
            "not a Megatron index (bad header)",
            "--force",
        ),
        damaged("d", idx=garbage),
    ),
    "data-corrupt-manifest": Row(
        f"{TRAIN} --set data.prefixes=[{{tmp}}/d]",
        ("manifest {tmp}/d.manifest.json is unreadable",),
        damaged("d", manifest_json=garbage),
    ),
    "data-other-tool-empty-files": Row(
        f"{TRAIN} --set data.prefixes=[{{tmp}}/d]",
        ("{tmp}/d.idx is not a Megatron index (bad header)",),
        damaged("d", manifest=False, bin=empty, idx=empty),
    ),
    "data-idx-random-bytes": Row(
        f"{TRAIN} --set data.prefixes=[{{tmp}}/d]",
        ("{tmp}/d.idx has the recorded size but other contents (its hash differs; sequence",),
        damaged("d", idx=random_bytes),
    ),
    "data-bin-bit-flip": Row(
        f"{TRAIN} --set data.prefixes=[{{tmp}}/d]",
        ("{tmp}/d.bin has the recorded size but other contents",),
        damaged("d", bin=bit_flip),
    ),
    "data-other-tool-idx-random-bytes": Row(
        f"{TRAIN} --set data.prefixes=[{{tmp}}/d]",
        ("{tmp}/d.idx is damaged or not {tmp}/d.bin's index: sequence",),
        damaged("d", manifest=False, idx=random_bytes),
    ),
    "data-other-tool-corrupt-idx": Row(
        f"{TRAIN} --set data.prefixes=[{{tmp}}/d]",
        ("{tmp}/d.idx is not a Megatron index (bad header)",),
        damaged("d", manifest=False, idx=garbage),
    ),
    "data-other-tool-truncated-bin": Row(
        f"{TRAIN} --set data.prefixes=[{{tmp}}/d]",
        (
            "{tmp}/d.idx is damaged or not {tmp}/d.bin's index: its sequences end at byte",
            "but the .bin holds 1000 bytes (truncated",
        ),
        damaged("d", manifest=False, bin=truncate),
    ),
    # --- tokenizer against dataset and model --------------------------------------------------------------------
    "tokenizer-not-the-datasets": Row(
        f"{TRAIN} --set data.tokenizer_path={{tmp}}/other.json",
        (
            "dataset '{corpus}' was tokenized with {corpus}.tokenizer.json (vocab 512",
            "but the tokenizer given is '{tmp}/other.json'",
        ),
        other_tokenizer,
    ),
    "tokenizer-smaller-than-other-tools-dataset": Row(
        f"{TRAIN} --set data.prefixes=[{{tmp}}/foreign] --set data.tokenizer_path={{tmp}}/other.json",
        ("dataset '{tmp}/foreign' holds token id 511, beyond tokenizer '{tmp}/other.json' (vocab",),
        other_tool_dataset_and_small_tokenizer,
    ),
    "tokenizer-missing": Row(
        f"{TRAIN} --set data.tokenizer_path={{tmp}}/none.json",
        ("data.tokenizer_path = '{tmp}/none.json': tokenizer '{tmp}/none.json' does not exist",),
    ),
    "tokenizer-not-a-tokenizer": Row(
        f"{TRAIN} --set data.tokenizer_path={{corpus}}.idx",
        ("tokenizer '{corpus}.idx' is not a valid Hugging Face tokenizer.json",),
    ),
    "model-vocab-below-tokenizer": Row(
        f"{TRAIN} --set model.vocab_size=100",
        ("model.vocab_size = 100 is below the tokenizer's vocabulary (512",),
    ),
    "score-tokens-outside-the-vocabulary": Row(
        "score --checkpoint {checkpoints} --tokens {tmp}/tokens.json",
        ("sequence 1 holds token id 512, outside the model's vocabulary (0..511)",),
        tokens_file,
    ),
    # --- checkpoints -------------------------------------------------------------------------------------------
    "checkpoint-load-of-another-shape": Row(
        f"{TRAIN} --set checkpoint.load={{checkpoints}} --set model.hidden_size=64",
        (
            "checkpoint.load: {checkpoints}/iter_0000020 holds another model: model.hidden_size = 64 in the config, 32",
        ),
    ),
    "checkpoint-resume-of-another-shape": Row(
        f"{TRAIN} --set logging.run_dir={{tmp}}/run --set model.num_layers=4",
        (
            "resuming from {tmp}/run/checkpoints/iter_0000020 holds another model: model.num_layers = 4 in the config, 8",
        ),
        run_with_own_checkpoint,
    ),
    "checkpoint-resume-with-another-schedule": Row(
        f"{TRAIN} --set logging.run_dir={{tmp}}/run --set optimizer.lr=0.002 --set schedule.train_iters=40",
        (
            "resuming from {tmp}/run/checkpoints/iter_0000020 was trained with other settings: optimizer.lr = "
            "0.002 in the config, 0.001 in the checkpoint",
            "schedule.train_iters = 40 in the config, 20 in the checkpoint",
            "set checkpoint.allow_schedule_change=true (train --allow-schedule-change)",
        ),
        run_with_own_checkpoint,
    ),
    "train-run-directory-in-use": Row(
        f"{TRAIN} --set logging.run_dir={{tmp}}/run",
        ("run directory {tmp}/run is in use by another run: pid", "stop it with kill -TERM"),
        run_in_use,
    ),
    "train-fresh-on-a-run-directory-in-use": Row(
        f"{TRAIN} --set logging.run_dir={{tmp}}/run --fresh",
        ("run directory {tmp}/run is in use by another run: pid", "stop it with kill -TERM"),
        run_in_use,
    ),
    "train-checkpoint-directory-in-use": Row(
        f"{TRAIN} --set logging.run_dir={{tmp}}/other --set checkpoint.dir={{tmp}}/run/checkpoints",
        (
            "checkpoint directory {tmp}/run/checkpoints is in use by another run: pid",
            "stop it with kill -TERM",
        ),
        checkpoints_in_use,
    ),
    "train-fresh-on-a-checkpoint-directory-in-use": Row(
        f"{TRAIN} --set logging.run_dir={{tmp}}/other --set checkpoint.dir={{tmp}}/run/checkpoints --fresh",
        (
            "checkpoint directory {tmp}/run/checkpoints is in use by another run: pid",
            "--set checkpoint.dir=...",
        ),
        checkpoints_in_use,
    ),
    "train-run-directory-is-a-file": Row(
        f"{TRAIN} --set logging.run_dir={{tmp}}/run",
        (
            "run directory cannot be used: {tmp}/run is a file, not a directory. Choose a run directory that is a "
            "writable directory (--set logging.run_dir=...)",
        ),
        a_file("run"),
    ),
    "train-run-directory-under-a-file": Row(
        f"{TRAIN} --set logging.run_dir={{tmp}}/file/run",
        ("run directory cannot be used: {tmp}/file/run cannot be a directory: {tmp}/file is a file",),
        a_file("file"),
    ),
    "train-run-directory-unwritable": Row(
        f"{TRAIN} --set logging.run_dir={{tmp}}/run",
        (
            "run directory cannot be used: cannot open {tmp}/run/run.lock for writing (",
            "): the directory or the file is read-only for this user, or immutable (lsattr shows an i)",
        ),
        unwritable,
    ),
    "train-run-lock-cannot-be-opened": Row(
        f"{TRAIN} --set logging.run_dir={{tmp}}/run",
        ("run directory cannot be used: {tmp}/run/run.lock is a directory, so it cannot be the lock file",),
        lock_file_is_a_directory,
    ),
    "checkpoint-load-with-another-data-split": Row(
        f"{TRAIN} --set checkpoint.load={{checkpoints}} --set data.split=70,30,0",
        (
            "checkpoint.load: {checkpoints}/iter_0000020 was trained with other settings: data.split = "
            "'70,30,0' in the config, '80,20,0' in the checkpoint",
        ),
    ),
    "checkpoint-load-missing": Row(
        f"{TRAIN} --set checkpoint.load={{tmp}}/none",
        ("checkpoint.load = '{tmp}/none': checkpoint '{tmp}/none' does not exist",),
    ),
    "checkpoint-load-unreadable": Row(
        f"{TRAIN} --set checkpoint.load={{tmp}}/torn",
        (
            "checkpoint.load = '{tmp}/torn': checkpoint '{tmp}/torn' holds no intact checkpoint: skipping checkpoint {tmp}/torn/iter_0000003: no manifest.json",
        ),
        garbage_checkpoint,
    ),
    "checkpoint-load-truncated": Row(
        f"{TRAIN} --set checkpoint.load={{tmp}}/cut/iter_0000020",
        (
            "checkpoint '{tmp}/cut/iter_0000020' is damaged, not loaded: metadata.json is 10 bytes, the save wrote",
        ),
        truncated_checkpoint,
    ),
    "score-checkpoint-unreadable": Row(
        "score --checkpoint {tmp}/torn --tokens {tmp}/tokens.json",
        (
            "score: checkpoint '{tmp}/torn' holds no intact checkpoint: skipping checkpoint {tmp}/torn/iter_0000003: no manifest.json",
        ),
        lambda paths: (garbage_checkpoint(paths), tokens_file(paths)),
    ),
    "score-checkpoint-missing": Row(
        "score --checkpoint {tmp}/none --data {corpus}", ("score: checkpoint '{tmp}/none' does not exist",)
    ),
    "convert-to-hf-unreadable": Row(
        "convert --to-hf {tmp}/torn --out {tmp}/hf",
        (
            "convert: checkpoint '{tmp}/torn' holds no intact checkpoint: skipping checkpoint {tmp}/torn/iter_0000003: no manifest.json",
        ),
        garbage_checkpoint,
    ),
    "convert-from-hf-of-another-shape": Row(
        "convert --from-hf {tmp}/hf --out {tmp}/converted",
        ("model.embed_tokens.weight has shape (512, 64), config.json implies (512, 32)",),
        hf_model_of_another_shape,
    ),
    # --- the verbs' own arguments --------------------------------------------------------------------------------
    "score-tp-zero": Row(
        "score --checkpoint {checkpoints} --data {corpus} --tp 0", ("argument --tp: 0: must be at least 1",)
    ),
    "score-data-missing": Row(
        "score --checkpoint {checkpoints} --data {tmp}/none",
        ("--data {tmp}/none: no {tmp}/none.bin / {tmp}/none.idx",),
    ),
    "score-data-corrupt": Row(
        "score --checkpoint {checkpoints} --data {tmp}/d",
        ("--data {tmp}/d: dataset '{tmp}/d': {tmp}/d.idx is not a Megatron index",),
        damaged("d", idx=garbage),
    ),
    "score-too-many-samples": Row(
        "score --checkpoint {checkpoints} --data {corpus} --samples 9999999",
        ("--samples 9999999: {corpus} holds", "whole windows of 32 + 1 tokens"),
    ),
    "convert-out-exists": Row(
        "convert --to-hf {checkpoints} --out {tmp}", ("--out {tmp} exists; convert never overwrites",)
    ),
    "convert-tp-with-to-hf": Row(
        "convert --to-hf {checkpoints} --out {tmp}/hf --tp 2", ("--tp/--pp apply to --from-hf",)
    ),
    "convert-from-hf-not-a-directory": Row(
        "convert --from-hf {tmp}/none --out {tmp}/out", ("'{tmp}/none' is not a directory",)
    ),
    "convert-bad-shard-size": Row(
        "convert --to-hf {checkpoints} --out {tmp}/hf --max-shard-size lots",
        ("'lots' is not a size; give e.g. 5GB",),
    ),
    "convert-unknown-dtype": Row(
        "convert --to-hf {checkpoints} --out {tmp}/hf --dtype fp8",
        ("argument --dtype: invalid choice: 'fp8'", "'bf16', 'fp16', 'fp32'"),
    ),
    "models-unknown-version": Row(
        "models show nope --dir {checkpoints}",
        ("no model version or tag 'nope' in {checkpoints}; versions (newest): tiny-s",),
    ),
    "serve-unknown-model": Row(
        "serve nope --dir {checkpoints}",
        ("serve: no model version or tag 'nope' in {checkpoints}; versions (newest): tiny-s",),
    ),
    "serve-export-not-an-export": Row(
        "serve --export {tmp}",
        ("serve: --export {tmp}: not a Hugging Face export (no config.json, generation_config.json)",),
    ),
    "serve-version-and-export": Row(
        "serve newest --export {tmp}",
        ("serve: give a model version ('newest') or --export, not both",),
    ),
    "plan-nowhere-to-run": Row(
        "plan --config trainer/configs/llama3-8b.yaml",
        ("say where it runs: --instance TYPE --nodes N, or --stack ENV",),
    ),
    "plan-ledger-of-another-job": Row(
        "plan --config trainer/configs/llama3-70b.yaml --instance p5.48xlarge --nodes 8 --ledger {tmp}/run/ledger.json",
        (
            "--ledger {tmp}/run/ledger.json measured another job's saves: it ran on this machine (its paid time is "
            "'local'), not on p5.48xlarge; its model differs: num_layers 4 (planned 80)",
        ),
        cpu_run_ledger,
    ),
    "plan-nodes-zero": Row(
        "plan --config trainer/configs/llama3-8b.yaml --instance p5.48xlarge --nodes 0",
        ("argument --nodes: 0: must be at least 1",),
    ),
    "plan-unknown-instance-type": Row(
        "plan --config trainer/configs/llama3-8b.yaml --instance p9.huge --nodes 2",
        ("argument --instance: invalid choice: 'p9.huge' (choose from", "p5.48xlarge"),
    ),
    "plan-unknown-stack": Row(
        "plan --config trainer/configs/llama3-8b.yaml --stack nowhere",
        ("--stack nowhere: no stack file Pulumi.nowhere.yaml", "stacks: dev, eks-dev, prod, staging"),
    ),
    "plan-negative-token-budget": Row(
        "plan --config trainer/configs/llama3-8b.yaml --instance p5.48xlarge --nodes 2 --tokens -5",
        ("argument --tokens: -5: must be above 0",),
    ),
    "plan-stack-and-region": Row(
        "plan --config trainer/configs/llama3-8b.yaml --stack prod --region us-east-1",
        ("give --stack or --region, not both (the stack names its Region: aws:region)",),
    ),
    "plan-measure-on-an-instance": Row(
        "plan --config trainer/configs/local.yaml --measure 2 --instance p5.48xlarge --nodes 1 --out {tmp}/m.yaml",
        ("--measure trains on this machine's CPU processes; drop --instance/--stack",),
    ),
    "plan-measure-without-out": Row(
        "plan --config trainer/configs/local.yaml --measure 2",
        ("--measure writes the measured-fastest layout's config: give --out FILE",),
    ),
    "plan-measure-steps-all-warm-up": Row(
        "plan --config trainer/configs/local.yaml --measure 2 --measure-steps 2 --out {tmp}/m.yaml",
        ("--measure-steps 2: the first 2 are warm-up; give at least 3",),
    ),
    "plan-compare-with-given-price": Row(
        "plan --config trainer/configs/llama3-8b.yaml --instance p5.48xlarge --nodes 2 --compare --price-per-hour 9",
        ("--price-per-hour prices one instance type; --compare prices each type from AWS",),
    ),
    "plan-negative-deadline": Row(
        "plan --config trainer/configs/llama3-8b.yaml --instance p5.48xlarge --nodes 2 --deadline -1",
        ("argument --deadline: -1: must be above 0",),
    ),
    "sweep-range-low-above-high": Row(
        "sweep --sweep {tmp}/s.yaml --runs {tmp}/runs",
        ("invalid sweep", "space.optimizer.lr", "low = 0.1 is not below high = 0.01"),
        sweep_file("space: {{optimizer.lr: {{low: 0.1, high: 0.01}}}}"),
    ),
    "sweep-unknown-key": Row(
        "sweep --sweep {tmp}/s.yaml --runs {tmp}/runs",
        ("space.optimizer.lrr = 0.001", "did you mean 'optimizer.lr'?"),
        sweep_file("space: {{optimizer.lrr: {{low: 0.001, high: 0.01}}}}"),
    ),
    "sweep-range-end-the-trainer-refuses": Row(
        "sweep --sweep {tmp}/s.yaml --runs {tmp}/runs",
        ("space.optimizer.lr = 1e-05: optimizer.min_lr = 0.0001 is above optimizer.lr = 1e-05",),
        sweep_file("space: {{optimizer.lr: {{low: 1.0e-5, high: 0.01, log: true}}}}"),
    ),
    "sweep-integer-key-fractional-range": Row(
        "sweep --sweep {tmp}/s.yaml --runs {tmp}/runs",
        (
            "space.schedule.lr_warmup_iters.high = 4.5: schedule.lr_warmup_iters is an integer in the trainer's "
            "config; give whole numbers for low and high",
        ),
        sweep_file("space: {{schedule.lr_warmup_iters: {{low: 0, high: 4.5}}}}"),
    ),
    "sweep-choice-the-layout-refuses": Row(
        "sweep --sweep {tmp}/s.yaml --runs {tmp}/runs",
        (
            "space.schedule.global_batch_size = 9: schedule.global_batch_size = 9 is not divisible by "
            "schedule.micro_batch_size x data parallel size = 2 x 1 (a trial's 1 ",
        ),
        sweep_file("space: {{schedule.global_batch_size: {{choices: [8, 9]}}}}"),
    ),
    "sweep-pruner-with-nothing-to-prune-on": Row(
        "sweep --sweep {tmp}/s.yaml --runs {tmp}/runs",
        (
            "schedule.eval_interval = 1000 is not below the trials' schedule.train_iters = 20: a trial reports a "
            "validation loss only at its end, so pruner.kind = successive_halving has nothing to stop on",
        ),
        sweep_file("space: {{optimizer.lr: {{low: 0.001, high: 0.01}}}}"),
    ),
    "sweep-pruner-judges-during-warm-up": Row(
        "sweep --sweep {tmp}/s.yaml --runs {tmp}/runs",
        (
            "pruner.min_resource = 5 would judge trials before their warm-up has ended (the longest, "
            "schedule.lr_warmup_iters, is 10 steps): give min_resource >= 10",
        ),
        sweep_file(
            "pruner: {{min_resource: 5}}\nset: {{schedule.eval_interval: 5}}\n"
            "space: {{schedule.lr_warmup_iters: {{low: 0, high: 10}}}}"
        ),
    ),
    "sweep-pruner-past-warm-up-never-judges": Row(
        "sweep --sweep {tmp}/s.yaml --runs {tmp}/runs",
        (
            "pruner.min_resource = 10 steps past the longest warm-up (schedule.lr_warmup_iters up to 10) first "
            "falls on the evaluation at step 20, not before the trials' schedule.train_iters = 20: those trials "
            "could never be stopped; give min_resource <= 5",
        ),
        sweep_file(
            "pruner: {{min_resource: 10, progress: past_warmup}}\nset: {{schedule.eval_interval: 5}}\n"
            "space: {{schedule.lr_warmup_iters: {{low: 0, high: 10}}}}"
        ),
    ),
    "sweep-pruner-first-rung-at-the-runs-end": Row(
        "sweep --sweep {tmp}/s.yaml --runs {tmp}/runs",
        (
            "pruner.min_resource = 16 first falls on the evaluation at step 20 (schedule.eval_interval = 15), not "
            "before the trials' schedule.train_iters = 20: no trial could be stopped; give min_resource <= 15",
        ),
        sweep_file(
            "pruner: {{min_resource: 16}}\nset: {{schedule.eval_interval: 15}}\n"
            "space: {{optimizer.lr: {{low: 0.001, high: 0.01}}}}"
        ),
    ),
    "sweep-recipe-outside-the-space": Row(
        "sweep --sweep {tmp}/s.yaml --runs {tmp}/runs",
        (
            "space.optimizer.lr: the recipe's own value 0.001 is outside the space (low 0.002, high 0.01); "
            "trial 0 is the recipe's values",
        ),
        sweep_file("pruner: {{kind: none}}\nspace: {{optimizer.lr: {{low: 0.002, high: 0.01}}}}"),
    ),
    "sweep-driver-already-running": Row(
        "sweep --sweep {tmp}/s.yaml --runs {tmp}/runs",
        (
            "the study in {tmp}/runs/sweeps/s is being run by another sweep driver: pid 4242 on elsewhere, "
            "started 1970-01-02 00:00:00 UTC",
            "stop it with kill -TERM 4242 on elsewhere",
            "or give this sweep another --name",
        ),
        sweep_driver_running,
    ),
    "sweep-study-directory-is-a-file": Row(
        "sweep --sweep {tmp}/s.yaml --runs {tmp}/runs",
        (
            "the study's directory cannot be used: {tmp}/runs/sweeps/s is a file, not a directory. Give this sweep "
            "another --name, or --runs a writable directory",
        ),
        lambda paths: (
            sweep_file("pruner: {{kind: none}}\nspace: {{optimizer.lr: {{low: 0.001, high: 0.01}}}}")(paths),
            Path(paths["tmp"], "runs", "sweeps").mkdir(parents=True),
            Path(paths["tmp"], "runs", "sweeps", "s").write_text(""),
        ),
    ),
    "sweep-key-given-twice": Row(
        "sweep --sweep {tmp}/s.yaml --runs {tmp}/runs",
        ("invalid sweep ({tmp}/s.yaml)", "space.optimizer.lr is given twice, on line 3 and on line 4"),
        sweep_file(
            "space:\n  optimizer.lr: {{low: 0.001, high: 0.01}}\n  optimizer.lr: {{low: 0.01, high: 0.1}}"
        ),
    ),
    "sweep-name-invalid": Row(
        "sweep --sweep trainer/configs/local-sweep.yaml --name ../x --runs {tmp}/runs",
        ("--name '../x': use letters, digits, '.', '-' and '_'",),
    ),
    "prepare-no-inputs": Row(
        "prepare --output {tmp}/p", ("no inputs: give INPUT files or directories, or --stdlib",)
    ),
    "prepare-input-missing": Row(
        "prepare {tmp}/none.txt --output {tmp}/p", ("input '{tmp}/none.txt' does not exist",)
    ),
    "prepare-vocab-too-small": Row(
        "prepare {config} --output {tmp}/p --vocab-size 10", ("--vocab-size 10 is too small: at least 257",)
    ),
    "prepare-tokenizer-missing": Row(
        "prepare {config} --output {tmp}/p --tokenizer {tmp}/none.json",
        ("tokenizer '{tmp}/none.json' does not exist",),
    ),
    "prepare-output-holds-another-dataset": Row(
        "prepare {config} --output {corpus}",
        ("'{corpus}' holds a dataset prepared from other inputs", "pass --force to replace it"),
    ),
    "prepare-chat-malformed-message": Row(
        "prepare --format chat {tmp}/chat.jsonl --tokenizer {corpus}.tokenizer.json --output {tmp}/c",
        ("{tmp}/chat.jsonl:1: messages[0] must be an object with 'role' and 'content', got ['role']",),
        setup=chat_lines('{"messages": [{"role": "user"}]}'),
    ),
    "prepare-chat-unknown-role": Row(
        "prepare {tmp}/chat.jsonl --tokenizer {corpus}.tokenizer.json --output {tmp}/c",
        (
            "{tmp}/chat.jsonl:1: messages[0] has role 'robot', which the chat template does not know",
            "valid: system, user, assistant",
        ),
        setup=chat_lines('{"messages": [{"role": "robot", "content": "beep"}]}'),
    ),
    "prepare-chat-longer-than-the-sequence": Row(
        "prepare {tmp}/chat.jsonl --tokenizer {corpus}.tokenizer.json --seq-length 4 --output {tmp}/c",
        (
            "{tmp}/chat.jsonl:1: the conversation is",
            "longer than --seq-length 4",
            "pass --truncate to cut it",
        ),
        setup=chat_lines('{"prompt": "What does len do?", "completion": "Return the number of items."}'),
    ),
    "train-chat-micro-batch-above-one": Row(
        f"{TRAIN} --set data.format=chat --set schedule.micro_batch_size=2",
        ("data.format = 'chat' needs schedule.micro_batch_size = 1 (got 2)",),
    ),
    "prepare-over-reject-rate": Row(
        "prepare {tmp}/half.jsonl --output {tmp}/p",
        (
            "1 of 2 records rejected (1 malformed)",
            "above --max-reject-rate 0.01",
            "{tmp}/half.jsonl:2: not valid JSON",
        ),
        setup=lambda paths: Path(paths["tmp"], "half.jsonl").write_text('{"text": "fine"}\n{"text": \n'),
    ),
    "merge-shard-not-prepared": Row(
        "merge --output {tmp}/m {tmp}/none",
        ("shard '{tmp}/none' has no none.manifest.json: prepare it first",),
    ),
    "generate-prompt-longer-than-the-context": Row(
        "generate --checkpoint {checkpoints} --tokenizer {corpus}.tokenizer.json --prompts {tmp}/long.jsonl",
        (
            "generate: prompt 0 has",
            "more than the model's context of 32 (the sequence length it was trained at)",
        ),
        setup=lambda paths: Path(paths["tmp"], "long.jsonl").write_text(
            json.dumps({"prompt": "x = 1\n" * 40})
        ),
    ),
    "evaluate-suite-unknown-key": Row(
        "evaluate --checkpoint {checkpoints} --tokenizer {corpus}.tokenizer.json --suite {tmp}/suite.yaml",
        ("suite {tmp}/suite.yaml: perplexity.0.sample: unknown key; valid: name, data, samples, seq_length",),
        setup=lambda paths: Path(paths["tmp"], "suite.yaml").write_text(
            f"perplexity:\n  - {{name: heldout, data: {paths['corpus']}, sample: 3}}\n"
        ),
    ),
}


def digest(*roots: Path) -> dict[str, str]:
    """Every file under the roots, by path, with its contents' hash."""
    return {
        str(path): hashlib.sha256(path.read_bytes()).hexdigest()
        for root in roots
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


@pytest.fixture
def no_launch(monkeypatch):
    """A verb run in this process must refuse before starting torchrun (which would replace pytest)."""
    from trainer.distributed import local as standalone

    def refuse(*args, **kwargs):
        raise AssertionError("the verb passed its checks and tried to start torchrun")

    monkeypatch.setattr(standalone, "exec_torchrun", refuse)
    # train's supervised torchrun too: a row whose check stops working must fail here, not train in the cwd's runs/
    monkeypatch.setattr(standalone, "run_torchrun", refuse)


@pytest.fixture(autouse=True)
def release_held():
    yield
    while HELD:
        HELD.pop().release()


@pytest.mark.parametrize("row_id", ROWS)
def test_bad_input_gives_one_message_exits_2_and_loses_nothing(
    row_id, tiny_config, tiny_corpus, single, tmp_path, no_launch, capsys
):
    if row_id == "train-sequence-parallel-on-cpu" and torch.cuda.is_available():
        pytest.skip("a CPU-only refusal; on GPUs sequence parallelism runs")
    row = ROWS[row_id]
    checkpoints = single.run_dir / "checkpoints"
    paths = {
        "config": str(tiny_config),
        "corpus": tiny_corpus,
        "checkpoints": str(checkpoints),
        "tmp": str(tmp_path),
    }
    if row.setup:
        row.setup(paths)
    kept = [Path(tiny_corpus).parent, checkpoints, tmp_path]
    before = digest(*kept)

    try:
        status = trainer_main(row.argv.format(**paths).split())
    except SystemExit as exit:  # argparse's own refusals
        status = exit.code
    err = capsys.readouterr().err

    assert status == row.exit_status, err
    missing = [fragment.format(**paths) for fragment in row.says if fragment.format(**paths) not in err]
    assert missing == [], err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert digest(*kept) == before
