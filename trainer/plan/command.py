"""`python -m trainer plan`: the parallel layouts a config can train with on N nodes, ranked, and the best one
written as a config that `train` accepts.

    python -m trainer plan --config trainer/configs/llama3-70b.yaml --instance p5.48xlarge --nodes 32
    python -m trainer plan --config trainer/configs/llama3-8b.yaml --stack prod --tokens 1e12 --out planned.yaml
    python -m trainer plan --config trainer/configs/local.yaml --measure 3 --out measured.yaml

The search changes the layout keys the config marks `auto` (all of them when it marks none). See docs/plan.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainer.arguments import positive_float, positive_int
from trainer.config import LAYOUT_KEYS, ConfigError, TrainConfig, auto_keys, load_config
from trainer.contract.catalog import EFA_INSTANCE_TYPES, INSTANCE_TYPES, InstanceType, instance_type
from trainer.contract.serving import stack_pool
from trainer.contract.stack import (
    StackCapacity,
    StackFileError,
    read_stack_file,
    stack_capacity,
    stack_cluster,
)
from trainer.cost.energy import GRID_INTENSITY_DATE, PUE
from trainer.cost.idle import idle_cost, startup_cost
from trainer.cost.ledger import LEDGER_FILE, read_ledger
from trainer.cost.pricing import pool_cost
from trainer.cost.resilience import (
    INTERRUPTIONS_PER_GPU_HOUR,
    RATE_SOURCE,
    Recommendation,
    recommend,
)
from trainer.model.flops import parameter_counts
from trainer.plan import checkpoint_costs, measure
from trainer.plan.cost import (
    OptionCost,
    cheapest,
    dataset_gigabytes,
    energy_estimate,
    purchase_options,
    transfer_costs,
)
from trainer.plan.performance import Assumptions
from trainer.plan.search import GIB, Candidate, Plan, search


class PlanError(Exception):
    """Arguments the planner cannot work with; the message says what would be valid."""


def load_for_planning(path: str | Path, overrides: list[str]) -> tuple[TrainConfig, list[str]]:
    """The config with placeholders for its `auto` layout keys (the search replaces them), and those keys."""
    planned = auto_keys(path, overrides)
    placeholders = {
        "parallel.recompute": "none",
        "parallel.recompute_method": "uniform",
        "parallel.sequence_parallel": "false",
        "parallel.overlap_grad_reduce": "false",
        "parallel.overlap_param_gather": "false",
        "parallel.tp_comm_overlap": "false",
        "fp8.format": "null",
        "fp8.recipe": "delayed",
    }
    filled = [f"{key}={placeholders.get(key, '1')}" for key in planned]
    return load_config(path, [*overrides, *filled], device="cuda"), planned


def plan_for(
    path: str | Path, overrides: list[str], instance: InstanceType, nodes: int, assumptions: Assumptions
) -> Plan:
    """Search the `auto` keys of the config, or every layout key when it marks none."""
    cfg, planned = load_for_planning(path, overrides)
    return search(cfg, instance, nodes, planned or LAYOUT_KEYS, assumptions)


def token_budget(cfg: TrainConfig) -> float:
    s = cfg.schedule
    return float(s.train_iters * s.global_batch_size * cfg.data.seq_length)


def write_config(candidate: Candidate, path: Path, source: str, extra: dict[str, Any] | None = None) -> None:
    """The whole config with the chosen layout (and the `extra` keys, e.g. the recommended
    checkpoint.save_interval), written to a temporary name and renamed into place."""
    values = candidate.cfg.model_dump(mode="json", exclude_unset=True)
    for key, value in {**candidate.layout, **(extra or {})}.items():
        *sections, name = key.split(".")  # `engine` is top-level
        node = values
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = value
    header = f"# Planned by `python -m trainer plan` from {source}: {candidate.describe()}.\n"
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temporary.write_text(header + yaml.safe_dump(values, sort_keys=False))
    temporary.replace(path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", required=True, help="a trainer config, e.g. trainer/configs/llama3-70b.yaml"
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    where = parser.add_argument_group("where it runs: --instance and --nodes, or --stack")
    where.add_argument("--instance", choices=sorted(INSTANCE_TYPES), metavar="TYPE", help="an instance type")
    where.add_argument(
        "--nodes", type=positive_int, help="nodes (with --stack: instead of the stack's node count)"
    )
    where.add_argument("--stack", help="take the instance type and node count from Pulumi.<stack>.yaml")
    where.add_argument(
        "--region", help=f"the AWS Region prices come from (default: the stack's, else {DEFAULT_REGION})"
    )
    parser.add_argument(
        "--tokens",
        type=positive_float,
        help="tokens to train (default: the config's train_iters x global batch x sequence)",
    )
    parser.add_argument(
        "--price-per-hour", type=positive_float, metavar="USD", help="price of one instance-hour"
    )
    parser.add_argument(
        "--matmul-efficiency",
        type=positive_float,
        default=Assumptions().matmul_efficiency,
        help="share of the dense bf16 peak the compute reaches (default %(default)s)",
    )
    parser.add_argument(
        "--top", type=positive_int, default=10, help="rows of the table (default %(default)s)"
    )
    parser.add_argument("--out", type=Path, help="write the chosen layout's whole config here (YAML)")
    parser.add_argument(
        "--deadline",
        type=positive_float,
        metavar="DAYS",
        help="pick the cheapest purchase option (and with --compare, instance type) that finishes within DAYS",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="rank the catalog's EFA instance types by time to finish and dollars for the same config and nodes",
    )
    measuring = parser.add_argument_group(
        "layouts chosen by measurement on this machine's CPU processes (instead of --instance/--stack)"
    )
    measuring.add_argument(
        "--measure",
        type=positive_int,
        metavar="N",
        help="train the N best layouts a few steps each; --out gets the measured-fastest",
    )
    measuring.add_argument(
        "--measure-steps",
        type=positive_int,
        default=6,
        help=f"steps per layout, the first {measure.WARMUP_STEPS} not timed (default %(default)s)",
    )
    measuring.add_argument(
        "--measure-repeats",
        type=positive_int,
        default=measure.REPEATS,
        metavar="R",
        help="runs of each layout, interleaved; a layout is called faster only beyond the runs' spread "
        "(default %(default)s)",
    )
    measuring.add_argument(
        "--nproc", type=positive_int, help="processes (default: the config's TP x PP x DP)"
    )
    measuring.add_argument(
        "--measure-timeout",
        type=positive_float,
        default=600.0,
        metavar="S",
        help="seconds one layout's run may take (default %(default)s)",
    )
    interval = parser.add_argument_group(
        "the checkpoint interval (Young's rule at Llama 3's interruption rate): measured costs from a run's "
        "ledger, given, or with --stack estimated from the checkpoint's size and the file system's throughput"
    )
    interval.add_argument(
        "--ledger", type=Path, help="a run's ledger.json: its mean save stall and start-up per attempt"
    )
    interval.add_argument("--save-seconds", type=positive_float, help="seconds one save blocks training")
    interval.add_argument(
        "--restart-seconds", type=positive_float, help="seconds from an interruption to training again"
    )
    interval.add_argument(
        "--startup-seconds",
        type=positive_float,
        help="with --stack and no ledger: a restart's start-up before the checkpoint is read (default: an assumed "
        f"{checkpoint_costs.ASSUMED_STARTUP_S:.0f} s, said so)",
    )
    interval.add_argument(
        "--interruptions-per-gpu-hour",
        type=finite_positive_float,
        default=INTERRUPTIONS_PER_GPU_HOUR,
        metavar="RATE",
        help=f"unexpected interruptions per GPU-hour (default {INTERRUPTIONS_PER_GPU_HOUR:.3g}: {RATE_SOURCE})",
    )
    parser.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE.measured.json",
        help="scale the predicted step times by the measured/predicted ratio that plan --measure recorded there",
    )


def finite_positive_float(text: str) -> float:
    """A number above 0 that is finite (argparse's type: the error names the value and what would be valid)."""
    value = positive_float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number above 0")
    return value


def main(args: argparse.Namespace) -> int:
    # Piped output keeps the table whole instead of rich's 80-column default.
    console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
    if args.measure:
        return _measure(console, args)
    try:
        instance, nodes = _where(args)
        if not 0 < args.matmul_efficiency <= 1:
            raise PlanError(f"--matmul-efficiency {args.matmul_efficiency}: give a fraction in (0, 1]")
        assumptions = Assumptions(matmul_efficiency=args.matmul_efficiency)
        region = _region(args)
        if args.compare and args.price_per_hour:
            raise PlanError("--price-per-hour prices one instance type; --compare prices each type from AWS")
        cfg, planned = load_for_planning(args.config, args.overrides)
        # A bad record is refused before the search, which takes seconds on a large config.
        calibration = calibration_ratio(args.calibration, cfg, instance, nodes) if args.calibration else None
        plan = search(cfg, instance, nodes, planned or LAYOUT_KEYS, assumptions)
        if calibration:
            plan, calibrated = calibrate(plan, *calibration, args.calibration)
        interval_costs = _interval_costs(args, plan)
    except (ConfigError, PlanError) as error:
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            f"[bold red]plan:[/] {escape(str(error))}"
        )
        return 2
    tokens = args.tokens or token_budget(plan.config)
    if args.calibration:
        console.print(calibrated)
    _print_plan(console, plan, tokens, args.price_per_hour, args.top)
    chosen = plan.chosen
    if chosen is None:
        if not plan.candidates:
            console.print("[bold red]no layout passes the trainer's checks on this many GPUs[/]")
            return 1
        smallest = min(plan.candidates, key=lambda c: c.memory.total)
        usable = instance.gpu_memory_gib * assumptions.memory_usable_fraction
        console.print(
            f"[bold red]no layout fits[/]: the smallest needs {smallest.memory.total / GIB:.1f} GiB per GPU "
            f"({smallest.describe()}), {usable:.0f} GiB are usable; add nodes, or shorten the sequence or batch"
        )
        return 1
    _print_chosen(console, chosen, plan)
    interval = _checkpoint_interval(console, interval_costs, plan, chosen, args.interruptions_per_gpu_hour)
    costs = purchase_options(instance, nodes, tokens, chosen.step.tokens_per_s, region, args.price_per_hour)
    met = _print_costs(console, plan, costs, tokens, region, args.deadline)
    if args.stack:
        _print_idle(console, stack_capacity(args.stack), nodes, region)
    if args.stack and (pool := stack_pool(read_stack_file(args.stack))) is not None:
        console.print(
            f"\n[bold]inference pool[/] (trainstack:serving, docs/serving-stack.md): {escape(pool_cost(pool[0], region, pool[1], pool[2]))}"
        )
    if args.compare:
        met = _print_compare(console, args, nodes, tokens, region, assumptions)
    console.print("\n[bold]--set lines for train[/] (or --out FILE writes the whole config):")
    extra = {"checkpoint.save_interval": interval.steps} if interval else {}
    lines = [*chosen.overrides(), *(f"{key}={value}" for key, value in extra.items())]
    console.print(" ".join(f"--set {line}" for line in lines))
    if args.out:
        write_config(chosen, args.out, args.config, extra)
        console.print(f"wrote {args.out}: python -m trainer train --config {args.out}")
    return 0 if met else 1


def _measure(console: Console, args: argparse.Namespace) -> int:
    """--measure N: the N best local layouts trained a few steps each, the measured-fastest written to --out."""
    try:
        if args.stack or args.instance:
            raise PlanError(
                "--measure trains on this machine's CPU processes; drop --instance/--stack (on a stack's nodes: "
                "python -m trainer measure-stack --stack ENV --config ... --measure N --out FILE)"
            )
        if args.out is None:
            raise PlanError("--measure writes the measured-fastest layout's config: give --out FILE")
        if args.measure_steps <= measure.WARMUP_STEPS:
            raise PlanError(
                f"--measure-steps {args.measure_steps}: the first {measure.WARMUP_STEPS} are warm-up; give at "
                f"least {measure.WARMUP_STEPS + 1}"
            )
        world = measure.world_of(args.config, args.overrides, args.nproc)
        assumptions = Assumptions(matmul_efficiency=args.matmul_efficiency)
        candidates = measure.local_candidates(args.config, args.overrides, world, assumptions)
    except (ConfigError, PlanError) as error:
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            f"[bold red]plan:[/] {escape(str(error))}"
        )
        return 2
    if not candidates:
        console.print(f"[bold red]no layout passes the trainer's checks on {world} CPU processes[/]")
        return 1
    best = candidates[: args.measure]
    console.print(
        f"measuring the planner's {len(best)} best of {len(candidates)} layouts on {world} CPU processes, "
        f"{args.measure_steps} steps each (the first {measure.WARMUP_STEPS} not timed), {args.measure_repeats} "
        "run(s) each, interleaved"
    )
    measurements = measure.measure(
        args.config,
        args.overrides,
        best,
        world,
        args.measure_steps,
        args.measure_timeout,
        console,
        args.measure_repeats,
    )
    chosen = measure.fastest(measurements)
    measure.print_measurements(console, measurements, chosen)
    record = measure.record_path(args.out)
    measure.write_record(
        record, args.config, args.measure_steps, measurements, *measure.local_record_context(world)
    )
    console.print(f"prediction errors: {record}")
    if chosen is None:
        console.print("[bold red]no layout's run succeeded[/]")
        return 1
    console.print(f"{measure.choice_line(measurements, chosen)}: {chosen.candidate.describe()}")
    write_config(chosen.candidate, args.out, args.config)
    console.print(f"wrote {args.out}: python -m trainer train --config {args.out}")
    return 0


def _interval_costs(args: argparse.Namespace, plan: Plan) -> checkpoint_costs.Costs:
    """The save's blocking time and the restart's cost: given, measured in --ledger (refused when that run was
    another model or ran elsewhere), or with --stack and neither, estimated."""
    save_s, restart_s = args.save_seconds, args.restart_seconds
    if args.ledger:
        ledger = read_ledger(args.ledger)
        if ledger is None:
            raise PlanError(f"--ledger {args.ledger}: no ledger there (a run directory's {LEDGER_FILE})")
        record = checkpoint_costs.ledger_record(args.ledger)
        problems = checkpoint_costs.ledger_mismatches(ledger, record, plan.config, plan.instance.name)
        if problems and (save_s is None or restart_s is None):
            raise PlanError(
                f"--ledger {args.ledger} measured another job's saves: {'; '.join(problems)}. Give the ledger of a "
                f"run of this model on {plan.instance.name}, or --save-seconds and --restart-seconds"
                + ("" if args.stack else ", or --stack ENV for an estimate from the checkpoint's size")
            )
        measured_save, measured_restart, note = checkpoint_costs.measured_costs(
            ledger, plan.config.checkpoint.save_interval
        )
        chosen = plan.chosen
        warning = checkpoint_costs.layout_mismatch(record, chosen.cfg) if chosen else None
        return checkpoint_costs.Costs(
            save_s or measured_save,
            restart_s or measured_restart,
            f"measured in {args.ledger}" + (f"; {note}" if note and not args.save_seconds else ""),
            warning,
        )
    if (save_s is None or restart_s is None) and args.stack:
        parameters = parameter_counts(plan.config.model, plan.padded_vocab_size).total
        estimated = checkpoint_costs.estimate(plan.config, parameters, args.stack, args.startup_seconds)
        return checkpoint_costs.Costs(
            save_s or estimated.save_s, restart_s or estimated.restart_s, estimated.source
        )
    return checkpoint_costs.Costs(save_s, restart_s, "given")


def _checkpoint_interval(
    console: Console,
    costs: checkpoint_costs.Costs,
    plan: Plan,
    chosen: Candidate,
    per_gpu_hour: float = INTERRUPTIONS_PER_GPU_HOUR,
) -> Recommendation | None:
    """Young's interval for the chosen layout, from measured (or given) save and restart costs, at `per_gpu_hour`
    interruptions per GPU-hour."""
    save_s, restart_s, source = costs.save_s, costs.restart_s, costs.source
    console.print("\n[bold]checkpoint interval[/]")
    if save_s is None or restart_s is None:
        console.print(
            "  give --ledger runs/<run>/ledger.json (a run that saved), --save-seconds and --restart-seconds, or "
            "--stack ENV for an estimate: Young's interval needs the save's blocking time and the restart's cost"
            + (f" ({escape(source)})" if source != "given" else "")
        )
        return None
    recommendation = recommend(
        plan.nodes * plan.instance.gpus, save_s, restart_s, chosen.step.total_s, per_gpu_hour
    )
    for line in recommendation.lines():
        console.print(f"  {line}")
    console.print(f"  (save and restart: {escape(source)})")
    if costs.warning:
        console.print(f"  [yellow]warning:[/] {escape(costs.warning)}")
    return recommendation


def calibration_ratio(path: Path, cfg: TrainConfig, instance: InstanceType, nodes: int) -> tuple[float, int]:
    """The median measured/predicted step time of the layouts a `plan --measure` record (trainer/plan/measure.py
    write_record) measured, and how many; refused when it was measured on another world size than `nodes` x
    `instance` or a config of another shape (model, sequence, global batch) than `cfg`, or measured nothing."""
    try:
        record = json.loads(path.read_text())
        machine, config = str(record["machine"]), str(record["config"])
        pairs = [
            (float(layout["measured_s"]), float(layout["predicted_s"]))
            for layout in record["layouts"]
            if layout.get("measured_s") and layout.get("predicted_s")
        ]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise PlanError(
            f"--calibration {path}: not a plan --measure record (FILE.measured.json): {error}"
        ) from None
    world = nodes * instance.gpus
    # write_record's machine: "<P> CPU processes on <C> cores" (local) or "<N> x <instance> (stack <S>)"
    words = machine.split()
    measured_world = None
    if len(words) > 1 and words[0].isdigit() and words[1] == "CPU":
        measured_world = int(words[0])
    elif len(words) > 2 and words[0].isdigit() and words[1] == "x" and words[2] in INSTANCE_TYPES:
        measured_world = int(words[0]) * INSTANCE_TYPES[words[2]].gpus
    if measured_world != world:
        raise PlanError(
            f"--calibration {path}: measured on {machine}, not this plan's {world} GPUs ({nodes} x "
            f"{instance.name}); calibrate with a record of the same world size"
        )
    try:
        measured_cfg = load_config(config, device="cuda")
    except (ConfigError, OSError) as error:
        raise PlanError(f"--calibration {path}: its config {config} cannot be read: {error}") from None
    shape = (cfg.model, cfg.data.seq_length, cfg.schedule.global_batch_size)
    if (measured_cfg.model, measured_cfg.data.seq_length, measured_cfg.schedule.global_batch_size) != shape:
        raise PlanError(
            f"--calibration {path}: measured with {config}, whose model, sequence or global batch differs from "
            "this plan's config; calibrate with a record of the same shape"
        )
    if not pairs:
        raise PlanError(f"--calibration {path}: no layout was measured there (every run failed)")
    return statistics.median(measured / predicted for measured, predicted in pairs), len(pairs)


def calibrate(plan: Plan, ratio: float, layouts: int, path: Path) -> tuple[Plan, str]:
    """The plan with every predicted step time scaled by the record's measured/predicted `ratio` (throughput and
    MFU by its inverse; calibration_ratio), and the line that says so."""
    timed = (
        *("compute_s", "tensor_parallel_s", "pipeline_p2p_s", "bubble_s"),
        *("data_parallel_s", "context_parallel_s", "hidden_s"),
    )

    def scaled(c: Candidate) -> Candidate:
        times = {name: getattr(c.step, name) * ratio for name in timed}
        step = dataclasses.replace(
            c.step, **times, tokens_per_s=c.step.tokens_per_s / ratio, mfu=c.step.mfu / ratio
        )
        return dataclasses.replace(c, step=step)

    candidates = sorted((scaled(c) for c in plan.candidates), key=lambda c: c.step.total_s)
    line = (
        f"calibration applied: predicted step times x {ratio:.3f}, the median measured/predicted of {layouts} "
        f"layout(s) in {path}"
    )
    return dataclasses.replace(plan, candidates=candidates), line


def _where(args: argparse.Namespace) -> tuple[InstanceType, int]:
    if args.stack:
        if args.instance:
            raise PlanError("give --stack or --instance, not both (the stack names its instance type)")
        try:
            stack_instance, stack_nodes = stack_cluster(args.stack)
        except StackFileError as error:
            raise PlanError(f"--stack {args.stack}: {error}") from None
        return instance_type(stack_instance), args.nodes or stack_nodes
    if args.instance is None or args.nodes is None:
        raise PlanError("say where it runs: --instance TYPE --nodes N, or --stack ENV")
    return instance_type(args.instance), args.nodes


DEFAULT_REGION = "us-east-1"


def _region(args: argparse.Namespace) -> str:
    if args.stack:
        if args.region:
            raise PlanError("give --stack or --region, not both (the stack names its Region: aws:region)")
        return str(read_stack_file(args.stack).get("aws:region", DEFAULT_REGION))
    return args.region or DEFAULT_REGION


def _usd(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _print_costs(
    console: Console, plan: Plan, costs: list[OptionCost], tokens: float, region: str, deadline: float | None
) -> bool:
    """Dollars per purchase option, transfer and energy; False when a deadline is given and no option meets it."""
    hours = costs[0].hours
    console.print(
        f"\n[bold]cost[/] of {tokens:.3g} tokens on {plan.nodes} x {plan.instance.name} in {region}: "
        f"{hours / 24:.1f} days ({hours:,.0f} hours, {hours * plan.nodes:,.0f} node-hours)"
    )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("option", "$/node-hour", "billed hours", "dollars", "$/M tokens", "price"):
        table.add_column(column, justify="left" if column in ("option", "price") else "right")
    sources: list[str] = []
    for c in costs:
        rate = "-" if c.price is None else f"{c.price.usd_per_hour:,.2f}"
        per_million = "-" if c.usd_per_million_tokens is None else f"{c.usd_per_million_tokens:,.2f}"
        if c.price is not None and c.price.source not in sources:
            sources.append(c.price.source)
        where = f"[{sources.index(c.price.source) + 1}] as of {c.price.as_of}" if c.price else ""
        note = f"{where}; {c.problem}" if c.problem and where else c.problem or where
        table.add_row(c.option, rate, f"{c.billed_hours:,.0f}", _usd(c.dollars), per_million, escape(note))
    console.print(table)
    for number, source in enumerate(sources, 1):
        console.print(f"  [{number}] {escape(source)}")
    best = cheapest(costs, deadline * 24 if deadline else None)
    met = True
    if best is None and not any(c.dollars is not None for c in costs):
        met = not deadline
        console.print("[bold red]no purchase option has a price here[/] (the reasons above)")
    elif deadline and best is None:
        met = False
        console.print(
            f"[bold red]no purchase option finishes within {deadline:g} days[/]: the run takes {hours / 24:.1f} days"
        )
    elif best is not None:
        within = f" within {deadline:g} days" if deadline else ""
        console.print(f"cheapest{within}: {best.option}, ${_usd(best.dollars)}")
    gigabytes = dataset_gigabytes(tokens, plan.padded_vocab_size)
    transfers, source = transfer_costs(gigabytes)
    console.print(f"data transfer of the {gigabytes:,.0f} GB dataset ({source}):")
    for t in transfers:
        where = "this stack" if t.applies else "if"
        console.print(f"  - {where}: {t.path}: ${t.usd_per_gb:g}/GB = ${t.dollars:,.0f}")
    energy = energy_estimate(plan.instance, plan.nodes, hours, region)
    emissions = (
        "no grid intensity for this Region"
        if energy.kg_co2e is None
        else f"{energy.kg_co2e / 1000:,.1f} t CO2e"
    )
    console.print(
        f"energy (estimate: nodes at maximum power, PUE {PUE}): {energy.kwh:,.0f} kWh; emissions (estimate, "
        f"{region} grid intensity of {GRID_INTENSITY_DATE}): {emissions}  (docs/cost.md)"
    )
    return met


def _print_idle(console: Console, capacity: StackCapacity, nodes: int, region: str) -> None:
    """What the stack costs on GPUs with no job, and the most a job's node start-up costs (docs/cost.md)."""
    idle = idle_cost(capacity, region)
    rate = "unpriced" if idle.usd_per_hour is None else f"${idle.usd_per_hour:,.2f}/hour"
    console.print(f"idle stack: {idle.nodes} GPU nodes, {rate} on GPUs ({idle.why})")
    startup = startup_cost(capacity, nodes, region)
    if startup is not None:
        dollars = "unpriced" if startup.usd is None else f"${startup.usd:,.0f}"
        console.print(
            f"node start-up per attempt: at most {startup.minutes} min x {nodes} nodes = {dollars} ({startup.why})"
        )


def _print_compare(
    console: Console,
    args: argparse.Namespace,
    nodes: int,
    tokens: float,
    region: str,
    assumptions: Assumptions,
) -> bool:
    """Each EFA instance type's best layout for the same config and nodes, ranked by time to finish, then dollars."""
    rows: list[tuple[str, float, list[OptionCost]]] = []
    unfit: list[str] = []
    for name in EFA_INSTANCE_TYPES:
        chosen = plan_for(args.config, args.overrides, instance_type(name), nodes, assumptions).chosen
        if chosen is None:
            unfit.append(name)
            continue
        costs = purchase_options(
            instance_type(name), nodes, tokens, chosen.step.tokens_per_s, region, args.price_per_hour
        )
        rows.append((chosen.describe(), costs[0].hours, costs))
    rows.sort(key=lambda row: (row[1], (cheapest(row[2]) or row[2][0]).dollars or float("inf")))
    console.print(f"\n[bold]compare[/]: {tokens:.3g} tokens on {nodes} nodes in {region}")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    options = [c.option for c in rows[0][2]] if rows else []
    for column in ("#", "instance", "days", *(f"{o} $" for o in options), "cheapest", "$/M tokens"):
        table.add_column(column, justify="left" if column in ("instance", "cheapest") else "right")
    for rank, (_, hours, costs) in enumerate(rows, 1):
        best = cheapest(costs)
        table.add_row(
            str(rank),
            costs[0].instance_type,
            f"{hours / 24:.1f}",
            *(_usd(c.dollars) for c in costs),
            best.option if best else "-",
            "-"
            if best is None or best.usd_per_million_tokens is None
            else f"{best.usd_per_million_tokens:,.2f}",
        )
    for name in unfit:
        table.add_row("-", name, "no layout fits", *("-" for _ in options), "-", "-")
    console.print(table)
    everything = [c for _, _, costs in rows for c in costs]
    if args.deadline:
        best = cheapest(everything, args.deadline * 24)
        if best is None:
            console.print(
                f"[bold red]no instance type and purchase option finishes within {args.deadline:g} days[/]"
            )
            return False
        console.print(
            f"cheapest within {args.deadline:g} days: {best.instance_type} {best.option}, ${_usd(best.dollars)} "
            f"({best.hours / 24:.1f} days)"
        )
    return True


def _print_plan(console: Console, plan: Plan, tokens: float, price: float | None, top: int) -> None:
    cfg, i = plan.config, plan.instance
    params = parameter_counts(cfg.model, plan.padded_vocab_size).total
    console.print(
        f"[bold]{cfg.name}[/]: {params / 1e9:.2f} B parameters, sequence {cfg.data.seq_length}, global batch "
        f"{cfg.schedule.global_batch_size}, {cfg.precision}; on {plan.nodes} x {i.name} "
        f"({plan.nodes * i.gpus} x {i.gpu_model} {i.gpu_memory_gib} GiB); {tokens:.3g} tokens"
    )
    free = ", ".join(
        key.split(".", 1)[1] if key.startswith(("parallel.", "schedule.")) else key for key in plan.free_keys
    )
    console.print(f"searched {len(plan.candidates)} layouts over: {free}")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    columns: tuple[str, ...] = (
        "#",
        "TP",
        "PP",
        "VP",
        "CP",
        "DP",
        "micro",
        "recompute",
        "precision",
        "overlap",
        "sharding",
    )
    columns += ("GiB/GPU", "bubble", "step s")
    columns += ("tokens/s", "MFU", "days", "cost $" if price else "node-hours")
    for column in columns:
        table.add_column(
            column, justify="left" if column in ("recompute", "precision", "overlap") else "right"
        )
    for rank, c in enumerate(plan.candidates[:top], 1):
        p, s = c.cfg.parallel, c.cfg.schedule
        seconds = tokens / c.step.tokens_per_s
        node_hours = seconds / 3600 * plan.nodes
        memory = f"{c.memory.total / GIB:.1f}" if c.fits else f"[red]{c.memory.total / GIB:.1f} ✗[/]"
        table.add_row(
            str(rank),
            str(p.tensor_model_parallel_size),
            str(p.pipeline_model_parallel_size),
            str(p.virtual_pipeline_model_parallel_size),
            str(p.context_parallel_size),
            str(c.data_parallel_size),
            str(s.micro_batch_size),
            c.recompute,
            c.fp8,
            c.overlap,
            c.sharding,
            memory,
            f"{c.step.bubble_fraction:.1%}",
            f"{c.step.total_s:.2f}",
            f"{c.step.tokens_per_s:,.0f}",
            f"{c.step.mfu:.1%}",
            f"{seconds / 86400:.1f}",
            f"{node_hours * price:,.0f}" if price else f"{node_hours:,.0f}",
        )
    console.print(table)


def _print_chosen(console: Console, c: Candidate, plan: Plan) -> None:
    m, t = c.memory, c.step
    usable = plan.instance.gpu_memory_gib * plan.assumptions.memory_usable_fraction
    console.print(f"\n[bold]chosen[/]: {c.describe()}")
    console.print(
        f"memory per GPU (pipeline rank {m.pipeline_rank}, peak at the {m.moment}): {m.total / GIB:.1f} of "
        f"{usable:.0f} usable GiB = weights {m.weights / GIB:.1f} + gradients {m.gradients / GIB:.1f} + optimizer "
        f"{m.optimizer_states / GIB:.1f} + activations {m.activations / GIB:.1f} + logits {m.logits / GIB:.1f} + "
        f"in flight {m.transient / GIB:.1f}  ({m.parameters / 1e9:.2f} B parameters on the GPU)"
    )
    console.print(
        f"step {t.total_s:.2f} s = compute {t.compute_s:.2f} + tensor parallel {t.tensor_parallel_s:.2f} + "
        f"pipeline sends {t.pipeline_p2p_s:.2f} + bubble {t.bubble_s:.2f} ({t.bubble_fraction:.1%}) + data "
        f"parallel {t.data_parallel_s:.2f} + context parallel ring {t.context_parallel_s:.2f}; overlap hid "
        f"{t.hidden_s:.2f} s of communication"
    )
    console.print("assumptions:")
    for line in plan.assumptions.lines():
        console.print(f"  - {line}")
