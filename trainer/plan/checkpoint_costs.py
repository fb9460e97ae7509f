"""What one save blocks and one restart costs, for the planner's checkpoint interval (Young's rule needs the first;
Daly's goodput both): measured in a run's ledger, checked against the plan it is applied to, or, on a first plan
with none, estimated from the checkpoint's size and the stack's storage throughput.

A ledger from another model, another instance type or another layout measured another job's saves: a 2.8 M-parameter
CPU run's ledger said nothing about a 70 B job on p5 nodes (issue 48). The run's model version record beside its
checkpoints (trainer/checkpoint/version.py, model_version.json: the run's whole config) gives its model and layout,
and the ledger's paid time says where it ran (`local`: this machine, no instance type)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trainer.config import TrainConfig
from trainer.contract.stack import StackFileError, stack_storage
from trainer.cost.ledger import Ledger

GB = 1e9
# Bytes a save writes per parameter: the weights in the compute precision and the optimizer state, fp32 main
# parameters (none apart from fp32 weights) and Adam's two fp32 moments; not the gradients. From the Megatron Core
# developer guide, "Distributed Optimizer" (docs.nvidia.com/megatron-core/developer-guide/latest/api-guide/
# dist_optimizer.html): bf16 parameters with fp32 gradients 18 bytes a parameter (2 + 4 gradient + 12), fp32 ones 16.
OPTIMIZER_BYTES_PER_PARAMETER = 8
FP32 = 4
# A restart's start-up before the checkpoint is read (the image pulled and started, the rendezvous): no public
# figure for this image; an assumption to replace with --startup-seconds or a ledger's measurement.
ASSUMED_STARTUP_S = 300.0


@dataclass(frozen=True)
class Costs:
    save_s: float | None
    restart_s: float | None
    source: str  # where the figures come from, printed under the interval
    warning: str | None = None  # a ledger's run whose layout differs from the chosen one


def measured_costs(
    ledger: Ledger, save_interval: int | None
) -> tuple[float | None, float | None, str | None]:
    """A run's mean blocking time per save (its checkpoint stalls over the saves it counted) and its mean start-up
    per attempt (process start to the first step: what a restart costs before lost work); and, for a ledger
    written before saves were counted, the note that its saves are assumed from its steps and `save_interval`."""
    saves, note = ledger.saves, None
    if saves is None:
        saves = ledger.step // save_interval if save_interval else 0
        note = (
            f"the ledger does not count its saves (written before they were counted): assumed {saves}, its step "
            f"{ledger.step} // checkpoint.save_interval {save_interval} of the planned config"
        )
    save_s = (
        ledger.seconds["checkpoint_stall"] / saves if saves and ledger.seconds["checkpoint_stall"] else None
    )
    restart_s = (
        ledger.seconds["startup"] / ledger.attempts if ledger.attempts and ledger.seconds["startup"] else None
    )
    return save_s, restart_s, note


def checkpoint_bytes(cfg: TrainConfig, parameters: int) -> float:
    """The bytes one save writes: weights and optimizer state for every parameter."""
    weights = 2 if cfg.precision == "bf16" else FP32
    masters = FP32 if weights != FP32 else 0
    return parameters * (weights + masters + OPTIMIZER_BYTES_PER_PARAMETER)


def storage_throughput(stack: str) -> tuple[float, str]:
    """The stack's FSx for Lustre aggregate throughput in bytes/s, and how it was worked out."""
    fsx = stack_storage(stack)
    return fsx.bytes_per_s, (
        f"FSx for Lustre {fsx.deployment_type} {fsx.capacity_gib:,} GiB x {fsx.mb_s_per_tib} MB/s per TiB = "
        f"{fsx.bytes_per_s / 1e6:,.0f} MB/s"
    )


def estimate(cfg: TrainConfig, parameters: int, stack: str, startup_s: float | None) -> Costs:
    """The save as the checkpoint's bytes at the file system's throughput (a synchronous write; an asynchronous
    save blocks less), the restart as the start-up plus reading the checkpoint back."""
    try:
        throughput, storage = storage_throughput(stack)
    except StackFileError as error:
        return Costs(None, None, f"no estimate: {error}")
    size = checkpoint_bytes(cfg, parameters)
    write_s = size / throughput
    start = ASSUMED_STARTUP_S if startup_s is None else startup_s
    started = "assumed (no measured figure; --startup-seconds)" if startup_s is None else "given"
    source = (
        f"ESTIMATED, no run measured them: checkpoint {size / GB:,.0f} GB ({parameters / 1e9:.2f} B parameters x "
        f"{size / parameters:.0f} bytes: weights, fp32 main parameters and Adam moments, Megatron Core guide, "
        f"Distributed Optimizer) over {storage} (FSx for Lustre User Guide, performance) = save {write_s:.0f} s; restart = "
        f"start-up {start:.0f} s ({started}) + reading it back {write_s:.0f} s. Young's interval rests on the save "
        "alone; measure both with --ledger after a first run"
    )
    return Costs(write_s, start + write_s, source)


def ledger_record(ledger_path: Path) -> dict | None:
    """The newest model version record beside the ledger's run (its checkpoints' model_version.json), if any."""
    found = sorted((ledger_path.parent / "checkpoints").glob("iter_*/model_version.json"))
    if not found:
        return None
    try:
        return json.loads(found[-1].read_text())
    except (OSError, ValueError):
        return None


def ledger_mismatches(ledger: Ledger, record: dict | None, cfg: TrainConfig, instance: str) -> list[str]:
    """Why the ledger's run measured another job's saves: another model, or another machine. Empty: none found."""
    problems = []
    if "local" in ledger.node_hours and instance != "local-cpu":
        problems.append(f"it ran on this machine (its paid time is 'local'), not on {instance}")
    if record is not None:
        model = record.get("config", {}).get("model", {})
        planned = cfg.model.model_dump(mode="json")
        keys = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads")
        differs = [
            f"{key} {model.get(key)} (planned {planned[key]})"
            for key in keys
            if model.get(key) != planned[key]
        ]
        if differs:
            problems.append(f"its model differs: {', '.join(differs)}")
    return problems


def layout_mismatch(record: dict | None, chosen: TrainConfig) -> str | None:
    """A warning where the ledger's run had another layout than the chosen one (each rank saves another share)."""
    if record is None:
        return "no model version record beside the ledger: its run's model and layout could not be checked"
    parallel = record.get("config", {}).get("parallel", {})
    run = (parallel.get("tensor_model_parallel_size"), parallel.get("pipeline_model_parallel_size"))
    planned = (chosen.parallel.tensor_model_parallel_size, chosen.parallel.pipeline_model_parallel_size)
    if run != planned:
        return (
            f"the ledger's run had TP={run[0]} x PP={run[1]}, the chosen layout TP={planned[0]} x PP={planned[1]}: "
            "each rank's share of a save differs, so its time per save may too"
        )
    return None
