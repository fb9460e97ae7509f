"""A run's dollar ledger: paid wall time split by what it bought, node-hours by purchase option, dollars, dollars
per million tokens, goodput, and the hard cap (budget.max_dollars, budget.max_hours).

Every second between this attempt's start and its last mark is charged to exactly one category, so the shares add
up to 100 % of paid time by construction: goodput is the productive share. The training loop marks its points
(trainer/loop.py); a resume reconciles the ledger its checkpoint stored with the one the run directory holds, so
productive time after that checkpoint becomes lost work and a retry's gap becomes restart time.

Torch-free: `make status` and the tests read it anywhere.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainer.config.schema import BudgetConfig
from trainer.contract.catalog import INSTANCE_TYPES
from trainer.contract.container import JOBSET_NAME_ENV, NUM_NODES_ENV, PURCHASE_OPTION_ENV, SUBMITTED_AT_ENV
from trainer.cost import energy
from trainer.cost.pricing import PURCHASE_OPTIONS, hourly_price
from trainer.cost.resilience import INTERRUPTIONS_PER_GPU_HOUR, expected_lost_seconds

# Paid wall time, by what it bought; the order is the report's.
CATEGORIES = ("productive", "queue_wait", "startup", "checkpoint_stall", "restart", "evaluation")
CATEGORY_LABELS = {
    "productive": "productive steps",
    "queue_wait": "queue wait",
    "startup": "start-up and preflight",
    "checkpoint_stall": "checkpoint stalls",
    "restart": "restarts and lost work",
    "evaluation": "evaluation",
}
# The live ledger in the run directory (rank 0 rewrites it at every logged step); `make status` reads it.
LEDGER_FILE = "ledger.json"
# The key the ledger is stored under in a checkpoint's manifest (trainer/checkpoint/store.py write_manifest).
MANIFEST_KEY = "ledger"
LOCAL = "local"  # the purchase option of a run on the machine at hand
# The ledger's keys on every metrics.jsonl line (Ledger.metrics; pinned by tests/trainer/test_metrics.py).
JSONL_KEYS = (
    "dollars",
    "dollars_per_million_tokens",
    "node_hours",
    "goodput",
    "paid_time_shares",
    "energy_kwh_estimate",
    "emissions_kg_co2e_estimate",
)


@dataclass(frozen=True)
class Rate:
    """What one attempt pays per second of wall time: its nodes, bought one way, at a price per node-hour."""

    option: str  # on-demand, spot, capacity-block, reservation (trainer/cost/pricing.py), or local
    nodes: int
    usd_per_node_hour: float | None  # None: unpriced (a local run without budget.price_per_hour)
    source: str  # where the price came from, for the report
    # The nodes' instance type and Region on AWS (energy and emissions estimates, trainer/cost/energy.py); None on
    # the machine at hand, whose power nobody published.
    instance_type: str | None = None
    region: str | None = None


@dataclass
class Ledger:
    """What a run has paid for so far, over every attempt."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    node_hours: dict[str, float] = field(default_factory=dict)  # by purchase option
    dollars: float = 0.0
    unpriced_node_hours: float = 0.0  # paid time with no price: dollars are a lower bound while > 0
    step: int = 0
    tokens: int = 0  # tokens of the steps the weights kept (a resume drops those after its checkpoint)
    marked_at: float | None = None  # Unix time up to which every second is charged
    attempts: int = 0
    # Estimates (trainer/cost/energy.py: the nodes' maximum power x PUE; the Region's dated grid average), over the
    # paid node-hours of a known instance type; 0 on the machine at hand.
    energy_kwh: float = 0.0
    emissions_kg: float = 0.0
    # Checkpoints the run wrote (interval, last step, SIGTERM and cap saves alike), whose blocking time is the
    # checkpoint stalls: the planner's time per save (trainer/plan/command.py). None: a ledger written before it was
    # counted (and a run resumed from one), whose saves nobody knows; a new run's ledger starts at 0
    # (resumed_ledger).
    saves: int | None = None

    # --- charging ----------------------------------------------------------------------------------------------
    def start_attempt(
        self, started_at: float, rate: Rate, *, retry: bool, queued_since: float | None = None
    ) -> None:
        """Open an attempt that started at `started_at`: a retry pays for the gap since the last mark (the nodes
        are held while the job restarts); a first attempt pays its queue wait when the submitter recorded it."""
        self.attempts += 1
        if retry and self.marked_at is not None:
            self.charge("restart", started_at, rate)
        elif queued_since is not None and queued_since < started_at:
            self.marked_at = queued_since
            self.charge("queue_wait", started_at, rate)
        self.marked_at = started_at

    def charge(self, category: str, until: float, rate: Rate) -> float:
        """Charge the wall time from the last mark to `until` to `category`; the seconds charged."""
        if category not in self.seconds:
            raise ValueError(f"unknown ledger category {category!r}; one of {', '.join(CATEGORIES)}")
        if self.marked_at is None:
            raise ValueError("charge before start_attempt: the ledger has no mark to charge from")
        seconds = max(0.0, until - self.marked_at)
        self.marked_at = max(self.marked_at, until)
        self.seconds[category] += seconds
        node_hours = seconds * rate.nodes / 3600
        self.node_hours[rate.option] = self.node_hours.get(rate.option, 0.0) + node_hours
        if rate.usd_per_node_hour is None:
            self.unpriced_node_hours += node_hours
        else:
            self.dollars += node_hours * rate.usd_per_node_hour
        if rate.instance_type is not None:
            kwh = energy.energy_kwh(rate.instance_type, node_hours)
            self.energy_kwh += kwh
            if rate.region in energy.GRID_KG_CO2E_PER_KWH:
                self.emissions_kg += energy.emissions_kg(kwh, rate.region)
        return seconds

    def save_done(self) -> None:
        """A checkpoint was written (its blocking time is charged to checkpoint_stall)."""
        if self.saves is not None:
            self.saves += 1

    def step_done(self, step: int, tokens_per_step: int) -> None:
        """Step `step` ended; it trained `tokens_per_step` tokens (0: skipped, no update)."""
        self.step = step
        self.tokens += tokens_per_step

    # --- what it adds up to --------------------------------------------------------------------------------------
    @property
    def paid_seconds(self) -> float:
        return sum(self.seconds.values())

    @property
    def shares(self) -> dict[str, float]:
        """Each category's share of paid time (0-1); they add up to 1."""
        paid = self.paid_seconds
        return {category: (seconds / paid if paid else 0.0) for category, seconds in self.seconds.items()}

    @property
    def goodput(self) -> float:
        return self.shares["productive"]

    @property
    def dollars_per_million_tokens(self) -> float | None:
        return self.dollars / self.tokens * 1e6 if self.tokens and self.priced else None

    @property
    def priced(self) -> bool:
        return self.unpriced_node_hours == 0

    # --- storage -------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Ledger:
        ledger = cls(**{key: value for key, value in values.items() if key in cls.__dataclass_fields__})
        ledger.seconds = {**dict.fromkeys(CATEGORIES, 0.0), **ledger.seconds}
        return ledger

    def write(self, run_dir: Path) -> None:
        """The live ledger, replaced atomically so that a reader or a crash never sees half of it."""
        run_dir.mkdir(parents=True, exist_ok=True)
        staging = run_dir / (LEDGER_FILE + ".tmp")
        staging.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        os.replace(staging, run_dir / LEDGER_FILE)

    def metrics(self) -> dict[str, Any]:
        """The ledger's fields on a metrics.jsonl line (JSONL_KEYS)."""
        return {
            "dollars": self.dollars if self.priced else None,
            "dollars_per_million_tokens": self.dollars_per_million_tokens,
            "node_hours": dict(self.node_hours),
            "goodput": self.goodput,
            "paid_time_shares": self.shares,
            "energy_kwh_estimate": self.energy_kwh,
            "emissions_kg_co2e_estimate": self.emissions_kg,
        }


def read_ledger(path: Path) -> Ledger | None:
    """A ledger file (the run directory's), or None when there is none or it cannot be read."""
    try:
        return Ledger.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def resumed_ledger(live: Ledger | None, stored: Ledger | None, step: int) -> Ledger:
    """The ledger a run resumes with at checkpoint `step`: everything paid so far (the run directory's live ledger
    when it is at least as new as the checkpoint's), with the productive time after the checkpoint moved to lost
    work, since those steps run again."""
    if live is None or live.step < (stored.step if stored else 0):
        return stored or Ledger(saves=0)
    kept_productive = stored.seconds["productive"] if stored else 0.0
    lost = max(0.0, live.seconds["productive"] - kept_productive)
    live.seconds["productive"] -= lost
    live.seconds["restart"] += lost
    live.step, live.tokens = step, (stored.tokens if stored else 0)
    return live


def on_a_stack(environ: dict[str, str]) -> bool:
    """Whether this process runs in a stack's job: AWS_BATCH_JOB_ID is in every Batch job's container (AWS Batch
    User Guide, "Environment variables for Batch jobs"), JOBSET_NAME in every pod of the JobSets the submit tool
    renders (trainer/jobs/jobset.py)."""
    return "AWS_BATCH_JOB_ID" in environ or JOBSET_NAME_ENV in environ


def local_rate(budget: BudgetConfig, environ: dict[str, str] | None = None) -> Rate:
    """This attempt's rate: in a stack's job its nodes (AWS_BATCH_JOB_NUM_NODES on Batch, TRAINSTACK_NUM_NODES in a
    JobSet) and instance type (TRAINSTACK_INSTANCE_TYPE, set by the job definition or the JobSet) at
    budget.price_per_hour, else at the price list's; on the machine at hand one node at budget.price_per_hour, the
    only price there is."""
    environ = dict(os.environ if environ is None else environ)
    if not on_a_stack(environ):
        price = budget.price_per_hour
        return Rate(LOCAL, 1, price, "budget.price_per_hour" if price is not None else "unpriced")
    nodes = int(environ.get("AWS_BATCH_JOB_NUM_NODES") or environ.get(NUM_NODES_ENV) or "1")
    # Batch multi-node jobs cannot run on Spot (Batch User Guide, "Multi-node parallel jobs").
    option = environ.get(PURCHASE_OPTION_ENV, "on-demand")
    options = {o: o for o in PURCHASE_OPTIONS}
    if option not in options:
        raise ValueError(f"{PURCHASE_OPTION_ENV} = {option!r}: use one of {', '.join(PURCHASE_OPTIONS)}")
    instance = environ["TRAINSTACK_INSTANCE_TYPE"]
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION", "")
    if budget.price_per_hour is not None:
        return Rate(option, nodes, budget.price_per_hour, "budget.price_per_hour", instance, region)
    # The seam to the price list (trainer/cost/pricing.py): live from AWS, else its dated snapshot.
    price_list = hourly_price(instance, region, options[option])
    return Rate(option, nodes, price_list.usd_per_hour, price_list.source, instance, region)


def budget_problems(budget: BudgetConfig, environ: dict[str, str] | None = None) -> list[str]:
    """A dollar cap needs a price: on the machine at hand budget.price_per_hour is the only one; on Batch the
    purchase option the ledger prices must be one the price list knows."""
    environ = dict(os.environ if environ is None else environ)
    if budget.max_dollars is not None and budget.price_per_hour is None and not on_a_stack(environ):
        return [
            f"budget.max_dollars = {budget.max_dollars:g} needs a price: a local run has no price list, so set "
            "budget.price_per_hour (US dollars per node-hour, e.g. --set budget.price_per_hour=2.5), or use "
            "budget.max_hours for a cap in paid hours"
        ]
    option = environ.get(PURCHASE_OPTION_ENV, "on-demand")
    if on_a_stack(environ) and option not in PURCHASE_OPTIONS:
        return [f"{PURCHASE_OPTION_ENV} = {option!r}: use one of {', '.join(PURCHASE_OPTIONS)}"]
    return []


def cap_reached(budget: BudgetConfig, ledger: Ledger) -> str | None:
    """Why the run must stop now (the cap it reached and what it spent), or None while it is under its caps."""
    if budget.max_dollars is not None and ledger.dollars >= budget.max_dollars:
        return f"budget.max_dollars = {budget.max_dollars:g} reached: spent ${ledger.dollars:,.2f}"
    hours = ledger.paid_seconds / 3600
    if budget.max_hours is not None and hours >= budget.max_hours:
        return f"budget.max_hours = {budget.max_hours:g} reached: paid for {hours:.3f} h (${ledger.dollars:,.2f})"
    return None


def cost_report(ledger: Ledger, rate: Rate | None = None, save_interval: int | None = None) -> str:
    """The run's cost at its end, for people: dollars, node-hours, $/M tokens and where the paid time went; on
    GPUs of a known instance type, its lost work against what the planner expects (trainer/cost/resilience.py)."""
    paid_h = ledger.paid_seconds / 3600
    if ledger.priced:
        dollars = f"${ledger.dollars:,.2f}"
    elif ledger.dollars:
        dollars = f"${ledger.dollars:,.2f} and unpriced hours"
    else:  # a local run without budget.price_per_hour: hours, not a made-up $0
        dollars = "no price (set budget.price_per_hour to count dollars)"
    lines = [
        f"cost: {dollars} for {paid_h:.3f} h of paid time over {ledger.attempts} attempt(s), "
        f"{ledger.tokens:,} tokens trained to step {ledger.step}",
        "  node-hours: "
        + ", ".join(f"{option} {hours:.3f}" for option, hours in sorted(ledger.node_hours.items())),
    ]
    per_million = ledger.dollars_per_million_tokens
    if per_million is not None:
        lines.append(f"  dollars per million tokens: ${per_million:,.4f}")
    if rate is not None:
        price = f"${rate.usd_per_node_hour:g}/node-hour" if rate.usd_per_node_hour is not None else "no price"
        lines.append(f"  price: {price} ({rate.source}), {rate.nodes} node(s), {rate.option}")
    if ledger.energy_kwh:
        lines.append(
            f"  energy (estimate): {ledger.energy_kwh:,.1f} kWh, {ledger.emissions_kg:,.1f} kg CO2e "
            "(the nodes' maximum power x PUE, the Region's grid average: docs/cost.md)"
        )
    shares = ledger.shares
    lines.append(
        "  paid time: "
        + ", ".join(f"{CATEGORY_LABELS[c]} {shares[c]:.1%}" for c in CATEGORIES)
        + f" (goodput {ledger.goodput:.1%})"
    )
    if (expected := expected_lost_work(ledger, rate, save_interval)) is not None:
        lines.append(
            f"  restarts and lost work: {ledger.seconds['restart']:,.0f} s; expected {expected:,.0f} s at "
            f"{INTERRUPTIONS_PER_GPU_HOUR:.3g} interruptions per GPU-hour (Llama 3) with a save every "
            f"{save_interval} steps"
        )
    return "\n".join(lines)


def expected_lost_work(ledger: Ledger, rate: Rate | None, save_interval: int | None) -> float | None:
    """Seconds of restarts and lost work the planner's interruption rate expects over this run's GPU-hours: half
    a save interval of work and a start-up per interruption. None where the GPUs or the interval are unknown."""
    if rate is None or rate.instance_type not in INSTANCE_TYPES or not save_interval or not ledger.step:
        return None
    gpu_hours = ledger.paid_seconds / 3600 * rate.nodes * INSTANCE_TYPES[rate.instance_type].gpus
    step_s = ledger.seconds["productive"] / ledger.step
    startup_s = ledger.seconds["startup"] / max(1, ledger.attempts)
    return expected_lost_seconds(gpu_hours, save_interval * step_s, startup_s)


class Meter:
    """Rank 0's ledger in the training loop: `charge(category)` pays the wall time since the previous mark to
    that category, so the loop names what each stretch of time bought and nothing goes uncounted."""

    def __init__(
        self,
        ledger: Ledger,
        rate: Rate,
        budget: BudgetConfig,
        run_dir: Path,
        tokens_per_step: int,
        save_interval: int | None = None,
    ):
        self.ledger, self.rate, self.budget = ledger, rate, budget
        self.run_dir, self.tokens_per_step, self.save_interval = run_dir, tokens_per_step, save_interval

    @classmethod
    def start(
        cls,
        budget: BudgetConfig,
        run_dir: Path,
        *,
        stored: Ledger | None,
        step: int,
        tokens_per_step: int,
        started_at: float,
        retry: bool,
        environ: dict[str, str] | None = None,
        save_interval: int | None = None,
    ) -> Meter:
        """The meter of an attempt that started at `started_at` and resumes at `step` (0: from scratch) from a
        checkpoint that stored `stored`; a retry (torchrun's restart, Batch's next attempt) pays its gap."""
        environ = dict(os.environ if environ is None else environ)
        ledger = resumed_ledger(read_ledger(run_dir / LEDGER_FILE), stored, step)
        rate = local_rate(budget, environ)
        # The submitter's clock at submit_job (trainer/jobs/submit.py): a first attempt's queue wait.
        queued = environ.get(SUBMITTED_AT_ENV)
        ledger.start_attempt(started_at, rate, retry=retry, queued_since=float(queued) if queued else None)
        return cls(ledger, rate, budget, run_dir, tokens_per_step, save_interval)

    def charge(self, category: str, now: float | None = None) -> None:
        self.ledger.charge(category, time.time() if now is None else now, self.rate)

    def save_done(self) -> None:
        self.ledger.save_done()

    def step_done(self, step: int, *, trained: bool = True) -> None:
        self.ledger.step_done(step, self.tokens_per_step if trained else 0)

    def cap_reached(self) -> str | None:
        return cap_reached(self.budget, self.ledger)

    def save(self) -> None:
        self.ledger.write(self.run_dir)

    def report(self) -> str:
        return cost_report(self.ledger, self.rate, self.save_interval)
