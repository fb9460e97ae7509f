"""The run's ledger (trainer/cost/ledger.py): its arithmetic on a simulated run with a crash, a retry and a user's
resume (paid time adds up to 100 %), the cap's messages and config check, and the cap stopping a real CPU run at
the step whose line first reaches it, with a checkpoint that a resumed run counts on from."""

from __future__ import annotations

import json
import math

import pytest

from tests.trainer.test_resilience import Training, _completed
from trainer.checkpoint.store import LATEST, MANIFEST, damage
from trainer.config.schema import BudgetConfig
from trainer.cost import energy
from trainer.cost.ledger import (
    CATEGORIES,
    LEDGER_FILE,
    MANIFEST_KEY,
    Ledger,
    Meter,
    Rate,
    budget_problems,
    cap_reached,
    cost_report,
    local_rate,
    read_ledger,
    resumed_ledger,
)

ON_DEMAND = Rate("on-demand", nodes=2, usd_per_node_hour=36.0, source="budget.price_per_hour")  # $0.02/s
TOKENS_PER_STEP = 1000


def _steps(ledger: Ledger, first: int, last: int, clock: float, rate: Rate = ON_DEMAND) -> float:
    """Steps first..last of 10 s each from `clock`; the clock after them."""
    for step in range(first, last + 1):
        clock += 10.0
        ledger.charge("productive", clock, rate)
        ledger.step_done(step, TOKENS_PER_STEP)
    return clock


def test_a_run_with_a_crash_and_a_retry_adds_up_to_all_of_its_paid_time(tmp_path):
    # Attempt 1: submitted at 0, started at 100, up at 160, evaluates to 170, steps 1-5 (10 s each), saves
    # (a 5 s stall), steps 6-8, last mark at 255, then dies without another save.
    ledger = Ledger()
    ledger.start_attempt(100.0, ON_DEMAND, retry=False, queued_since=0.0)
    ledger.charge("startup", 160.0, ON_DEMAND)
    ledger.charge("evaluation", 170.0, ON_DEMAND)
    clock = _steps(ledger, 1, 5, 170.0)  # 220
    ledger.charge("checkpoint_stall", clock + 5, ON_DEMAND)  # 225
    stored = Ledger.from_dict(json.loads(json.dumps(ledger.to_dict())))  # what the save at step 5 keeps
    clock = _steps(ledger, 6, 8, clock + 5)  # 255
    ledger.write(tmp_path)  # the live ledger, as of step 8

    # Attempt 2, a retry 45 s after the last mark: steps 6-8 run again, so their 30 s are lost work.
    live = read_ledger(tmp_path / LEDGER_FILE)
    resumed = resumed_ledger(live, stored, step=5)
    resumed.start_attempt(300.0, ON_DEMAND, retry=True)
    resumed.charge("startup", 320.0, ON_DEMAND)
    clock = _steps(resumed, 6, 10, 320.0)  # 370

    assert resumed.seconds == {
        "productive": 100.0,  # steps 1-5 and 6-10 once each
        "queue_wait": 100.0,
        "startup": 80.0,  # 60 + 20
        "checkpoint_stall": 5.0,
        "restart": 75.0,  # steps 6-8 lost (30 s) + the gap from the last mark (255) to the retry (300)
        "evaluation": 10.0,
    }
    assert resumed.paid_seconds == 370.0  # every second from submission to the last mark
    assert math.isclose(sum(resumed.shares.values()), 1.0)
    assert math.isclose(resumed.goodput, 100 / 370)
    assert resumed.node_hours == {"on-demand": pytest.approx(370 * 2 / 3600)}
    assert resumed.dollars == pytest.approx(370 * 2 * 36 / 3600)  # 0.2056 node-hours x $36 = $7.40
    assert (resumed.step, resumed.tokens, resumed.attempts) == (10, 10 * TOKENS_PER_STEP, 2)
    assert resumed.dollars_per_million_tokens == pytest.approx(7.40 / 10_000 * 1e6)


def test_a_users_resume_later_pays_nothing_for_the_days_in_between():
    ledger = Ledger()
    ledger.start_attempt(0.0, ON_DEMAND, retry=False)
    _steps(ledger, 1, 3, 0.0)
    resumed = resumed_ledger(ledger, Ledger.from_dict(ledger.to_dict()), step=3)
    resumed.start_attempt(86_400.0 * 3, ON_DEMAND, retry=False)  # three days later, a new command
    resumed.charge("startup", 86_400.0 * 3 + 12, ON_DEMAND)
    assert resumed.seconds["restart"] == 0 and resumed.paid_seconds == 42.0


def test_a_crash_before_the_first_save_loses_every_step_and_keeps_the_cost():
    ledger = Ledger()
    ledger.start_attempt(0.0, ON_DEMAND, retry=False)
    _steps(ledger, 1, 4, 0.0)
    resumed = resumed_ledger(ledger, None, step=0)  # nothing saved: the retry starts from scratch
    assert resumed.seconds["productive"] == 0 and resumed.seconds["restart"] == 40.0
    assert (resumed.tokens, resumed.dollars) == (0, pytest.approx(40 * 2 * 36 / 3600))


def test_switching_purchase_options_keeps_node_hours_apart():
    spot = Rate("spot", nodes=4, usd_per_node_hour=9.0, source="test")
    ledger = Ledger()
    ledger.start_attempt(0.0, ON_DEMAND, retry=False)
    ledger.charge("productive", 3600.0, ON_DEMAND)
    ledger.start_attempt(3600.0, spot, retry=True)
    ledger.charge("productive", 5400.0, spot)
    assert ledger.node_hours == {"on-demand": 2.0, "spot": 2.0}
    assert ledger.dollars == 2 * 36 + 2 * 9


def test_a_local_run_without_a_price_counts_hours_and_no_dollars():
    rate = local_rate(BudgetConfig(), environ={})
    assert rate == Rate("local", 1, None, "unpriced")
    ledger = Ledger()
    ledger.start_attempt(0.0, rate, retry=False)
    _steps(ledger, 1, 2, 0.0, rate)
    assert not ledger.priced and ledger.dollars_per_million_tokens is None
    assert ledger.metrics()["dollars"] is None and ledger.node_hours == {"local": pytest.approx(20 / 3600)}


def test_on_batch_the_nodes_and_price_come_from_the_job():
    environ = {
        "AWS_BATCH_JOB_ID": "j",
        "AWS_BATCH_JOB_NUM_NODES": "4",
        "TRAINSTACK_INSTANCE_TYPE": "p5.48xlarge",
        "AWS_REGION": "us-west-2",
    }
    rate = local_rate(BudgetConfig(price_per_hour=50.0), environ=environ)
    assert rate == Rate("on-demand", 4, 50.0, "budget.price_per_hour", "p5.48xlarge", "us-west-2")


def test_an_unknown_purchase_option_on_batch_is_refused_before_the_run():
    environ = {
        "AWS_BATCH_JOB_ID": "j",
        "TRAINSTACK_PURCHASE_OPTION": "savings",
        "TRAINSTACK_INSTANCE_TYPE": "x",
    }
    assert budget_problems(BudgetConfig(), environ=environ) == [
        "TRAINSTACK_PURCHASE_OPTION = 'savings': use one of on-demand, spot, capacity-block, reservation"
    ]
    with pytest.raises(ValueError, match="TRAINSTACK_PURCHASE_OPTION = 'savings'"):
        local_rate(BudgetConfig(price_per_hour=1), environ=environ)


def test_charging_an_unknown_category_is_refused():
    ledger = Ledger()
    ledger.start_attempt(0.0, ON_DEMAND, retry=False)
    with pytest.raises(ValueError, match="unknown ledger category 'idle'; one of productive, queue_wait"):
        ledger.charge("idle", 1.0, ON_DEMAND)


def test_the_cap_names_itself_and_what_was_spent():
    ledger = Ledger()
    ledger.start_attempt(0.0, ON_DEMAND, retry=False)
    ledger.charge("productive", 1800.0, ON_DEMAND)  # 1 node-hour at $36
    assert cap_reached(BudgetConfig(max_dollars=40), ledger) is None
    assert (
        cap_reached(BudgetConfig(max_dollars=36), ledger) == "budget.max_dollars = 36 reached: spent $36.00"
    )
    assert cap_reached(BudgetConfig(max_hours=0.5), ledger) == (
        "budget.max_hours = 0.5 reached: paid for 0.500 h ($36.00)"
    )


def test_a_dollar_cap_without_a_price_is_a_config_error_on_a_local_run():
    [problem] = budget_problems(BudgetConfig(max_dollars=5), environ={})
    assert problem.startswith("budget.max_dollars = 5 needs a price: a local run has no price list, so set ")
    assert "budget.price_per_hour" in problem
    assert budget_problems(BudgetConfig(max_dollars=5, price_per_hour=2), environ={}) == []
    assert budget_problems(BudgetConfig(max_hours=1), environ={}) == []
    assert budget_problems(BudgetConfig(max_dollars=5), environ={"AWS_BATCH_JOB_ID": "j"}) == []


def test_the_cost_report_shows_every_share_and_the_goodput():
    ledger = Ledger()
    meter = Meter(ledger, ON_DEMAND, BudgetConfig(), run_dir=None, tokens_per_step=TOKENS_PER_STEP)  # type: ignore[arg-type]
    ledger.start_attempt(0.0, ON_DEMAND, retry=False)
    meter.charge("startup", now=30.0)
    meter.charge("productive", now=120.0)
    meter.step_done(1)
    report = cost_report(ledger, ON_DEMAND)
    assert report.splitlines()[0] == (
        "cost: $2.40 for 0.033 h of paid time over 1 attempt(s), 1,000 tokens trained to step 1"
    )
    assert "goodput 75.0%" in report and all(label in report for label in ("queue wait", "evaluation"))
    assert len(CATEGORIES) == 6


# --- the cap on a real CPU run (tests/support/training.py's tiny config, `python -m trainer train`) -------------

PRICE = "budget.price_per_hour=36"  # one node at $0.01 a second
CLOCK = "clock step=1 seconds=1"  # TRAINSTACK_FAULT: each step paid 1 s, nothing else (trainer/faults.py)


def _ledger_lines(run: Training) -> list[dict]:
    return [r for r in run.records() if "dollars" in r and r["step"] > 0]


@pytest.mark.slow
def test_the_cap_stops_a_cpu_run_at_its_step_with_a_checkpoint_and_a_resume_counts_on(tmp_path, tiny_config):
    # On the fault clock a step is paid 1 s ($0.01) and nothing else costs time: the cap's step is known in
    # advance, however fast or loaded the machine (a wall clock made it 75 s of training and a loaded machine's
    # start-up alone could pass the cap).
    settings = ("schedule.train_iters=200", "checkpoint.save_interval=1000", PRICE)

    def capped(cap: float) -> Training:
        return Training(tmp_path, "capped", tiny_config, *settings, f"budget.max_dollars={cap}", fault=CLOCK)

    run = capped(0.25)
    output = _completed(run)  # exit 0
    lines = _ledger_lines(run)
    stopped = lines[-1]["step"]
    assert stopped in (
        25,
        26,
    )  # $0.01 a step: the 25th reaches $0.25, or the 26th where the float sum falls short
    # The right step: the first whose line reached the cap (the step before was under it).
    assert lines[-1]["dollars"] >= 0.25 > lines[-2]["dollars"]
    assert [line["step"] for line in lines] == list(range(1, stopped + 1))  # a line a step
    assert f"step {stopped}: budget.max_dollars = 0.25 reached: spent $" in output
    assert (run.checkpoints / LATEST).read_text() == f"iter_{stopped:07d}\n"
    checkpoint = run.checkpoints / f"iter_{stopped:07d}"
    assert damage(checkpoint) is None
    stored = Ledger.from_dict(json.loads((checkpoint / MANIFEST).read_text())[MANIFEST_KEY])
    assert stored.step == stopped and stored.dollars >= 0.25
    assert "cost: $" in output and "goodput" in output

    # The same cap again: already spent, nothing trained, still exit 0.
    again = _completed(capped(0.25))
    assert f"step {stopped}: budget.max_dollars = 0.25 reached: spent $" in again
    assert "before this run's first step" in again
    assert _ledger_lines(run)[-1]["step"] == stopped

    # A higher cap, 50 steps' pay above what is spent now: the resumed run counts on from the stored ledger, trains
    # 50 more steps, and stops at its new cap.
    spent = read_ledger(run.run_dir / LEDGER_FILE)
    assert spent is not None and spent.dollars == pytest.approx(lines[-1]["dollars"])
    cap = round(spent.dollars + 0.5, 2)
    more = _completed(capped(cap))
    resumed = [r for r in _ledger_lines(run) if r["step"] > stopped]
    assert resumed and resumed[0]["dollars"] > spent.dollars  # counted on, not from zero
    assert resumed[-1]["dollars"] >= cap > resumed[-2]["dollars"]
    assert resumed[-1]["step"] - stopped in (49, 50, 51) and f"budget.max_dollars = {cap:g} reached" in more
    final = read_ledger(run.run_dir / LEDGER_FILE)
    assert final is not None and final.attempts == 3 and final.dollars >= cap
    assert math.isclose(sum(final.shares.values()), 1.0)


def test_a_skipped_step_is_paid_for_but_trains_no_tokens(tmp_path):
    meter = Meter(Ledger(), ON_DEMAND, BudgetConfig(), tmp_path, tokens_per_step=TOKENS_PER_STEP)
    meter.ledger.start_attempt(0.0, ON_DEMAND, retry=False)
    meter.charge("productive", now=10.0)
    meter.step_done(1)
    meter.charge("restart", now=20.0)  # the loop charges a skipped step as lost work
    meter.step_done(2, trained=False)
    assert (meter.ledger.step, meter.ledger.tokens, meter.ledger.goodput) == (2, TOKENS_PER_STEP, 0.5)
    meter.save()
    assert read_ledger(tmp_path / LEDGER_FILE) == meter.ledger  # the live file round-trips


def test_the_ledger_estimates_energy_and_emissions_of_known_nodes_only():
    on_aws = Rate("on-demand", 2, 98.32, "test", "p5.48xlarge", "us-east-1")
    ledger = Ledger()
    ledger.start_attempt(0.0, on_aws, retry=False)
    ledger.charge("productive", 3600.0, on_aws)  # one hour of two nodes
    kwh = energy.energy_kwh("p5.48xlarge", 2.0)
    assert ledger.energy_kwh == pytest.approx(kwh)
    assert ledger.emissions_kg == pytest.approx(energy.emissions_kg(kwh, "us-east-1"))
    assert ledger.metrics()["energy_kwh_estimate"] == pytest.approx(kwh)
    assert "energy (estimate):" in cost_report(ledger, on_aws)

    here = Rate("local", 1, None, "unpriced")  # the machine at hand: no published power
    local = Ledger()
    local.start_attempt(0.0, here, retry=False)
    local.charge("productive", 3600.0, here)
    assert (local.energy_kwh, local.emissions_kg) == (0.0, 0.0)
    assert "energy" not in cost_report(local, here)


def test_in_a_jobset_pod_the_nodes_instance_and_region_come_from_the_rendered_environment():
    # The variables trainer/jobs/jobset.py renders into every pod, with JobSet's own JOBSET_NAME.
    environ = {
        "JOBSET_NAME": "llama-eks",
        "TRAINSTACK_NUM_NODES": "2",
        "TRAINSTACK_INSTANCE_TYPE": "p5.48xlarge",
        "AWS_REGION": "us-east-1",
    }
    rate = local_rate(BudgetConfig(price_per_hour=98.0), environ=environ)
    assert rate == Rate("on-demand", 2, 98.0, "budget.price_per_hour", "p5.48xlarge", "us-east-1")
    assert budget_problems(BudgetConfig(max_dollars=10), environ=environ) == []  # the price list prices it


def test_the_report_sets_lost_work_against_what_the_planners_interruption_rate_expects():
    from trainer.cost.resilience import expected_lost_seconds

    on_aws = Rate("on-demand", 2, 98.32, "test", "p5.48xlarge", "us-east-1")  # 16 GPUs
    ledger = Ledger()
    ledger.start_attempt(0.0, on_aws, retry=False)
    ledger.charge("startup", 300.0, on_aws)
    ledger.charge("productive", 36_000.0, on_aws)
    ledger.step_done(1000, TOKENS_PER_STEP)
    ledger.charge("restart", 36_900.0, on_aws)  # one interruption: 600 s of lost work and restart
    gpu_hours = 36_900.0 / 3600 * 16
    expected = expected_lost_seconds(gpu_hours, 200 * 35.7, 300.0)  # a save every 200 steps of 35.7 s
    report = cost_report(ledger, on_aws, save_interval=200)
    assert f"restarts and lost work: 900 s; expected {expected:,.0f} s" in report
    assert "with a save every 200 steps" in report
    # where the GPUs or the interval are unknown there is nothing to expect
    assert "expected" not in cost_report(ledger, on_aws)
    assert "expected" not in cost_report(ledger, Rate("local", 1, None, "unpriced"), save_interval=200)


def test_the_ledger_counts_its_saves_and_an_old_ledger_counts_none():
    ledger = resumed_ledger(None, None, step=0)  # a new run's
    ledger.save_done()
    ledger.save_done()
    assert Ledger.from_dict(json.loads(json.dumps(ledger.to_dict()))).saves == 2  # kept through the file
    old = {key: value for key, value in ledger.to_dict().items() if key != "saves"}
    unknown = Ledger.from_dict(old)  # written before saves were counted
    unknown.save_done()
    assert unknown.saves is None  # not a count of the saves after it


@pytest.mark.slow
def test_a_cpu_run_counts_every_save_it_wrote_the_last_one_too(tmp_path, tiny_config):
    run = Training(tmp_path, "saves", tiny_config, "schedule.train_iters=5", "checkpoint.save_interval=2")
    _completed(run)
    ledger = read_ledger(run.run_dir / LEDGER_FILE)
    assert ledger is not None and ledger.saves == 3  # steps 2 and 4 on the interval, 5 the last
    assert ledger.seconds["checkpoint_stall"] > 0
