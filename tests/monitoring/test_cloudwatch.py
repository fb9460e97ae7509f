"""The EMF lines parse as the embedded metric format specification says (Amazon CloudWatch User Guide,
"Specification: Embedded metric format"): the schema in fixtures/emf_schema.json plus the rules on target members."""

from __future__ import annotations

import io
import json
from pathlib import Path

import jsonschema
import pytest

from trainer.contract import metrics as r
from trainer.monitoring.cloudwatch import EmfWriter
from trainer.monitoring.node import Sample

SCHEMA = json.loads((Path(__file__).parent / "fixtures" / "emf_schema.json").read_text())
DIMENSIONS = {"JobQueue": "trainstack-prod-gpu", "Run": "llama3-8b", "Rank": "3", "Node": "ip-10-30-0-12"}


def spec_problems(line: str) -> list[str]:
    """What the spec forbids in one log event: not one JSON object, schema violations, missing or mistyped targets."""
    document = json.loads(line)  # "a valid JSON object with no additional data at the beginning or end"
    problems = [error.message for error in jsonschema.Draft7Validator(SCHEMA).iter_errors(document)]
    for directive in document["_aws"]["CloudWatchMetrics"]:
        for key in {key for dimension_set in directive["Dimensions"] for key in dimension_set}:
            if not isinstance(document.get(key), str):
                problems.append(f"dimension target {key} is not a string member of the root")
        for definition in directive["Metrics"]:
            value = document.get(definition["Name"])
            numbers = value if isinstance(value, list) else [value]
            if not numbers or len(numbers) > 100 or not all(isinstance(v, int | float) for v in numbers):
                problems.append(f"metric target {definition['Name']} is not a number or 1-100 numbers")
    return problems


def lines(writer_output: io.StringIO) -> list[str]:
    return writer_output.getvalue().splitlines()


@pytest.fixture
def clock():
    now = [1_800_000_000.0]
    return now


@pytest.fixture
def emf(clock):
    out = io.StringIO()
    return EmfWriter(DIMENSIONS, interval_s=60, stream=out, clock=lambda: clock[0]), out


def test_a_logged_step_is_one_valid_emf_line_per_dimension_group(emf):
    writer, out = emf
    writer.add(r.TRAINING_LOSS, 2.5)
    writer.add(r.TOKENS_PER_SECOND, 1.2e6)
    writer.add(r.MFU, 0.41)
    writer.add(r.STEPS, 1)
    writer.add(r.STEP_TIME, 0.8)
    writer.flush()
    documents = [json.loads(line) for line in lines(out)]
    assert [spec_problems(line) for line in lines(out)] == [[], []]
    by_dimensions = {json.dumps(d["_aws"]["CloudWatchMetrics"][0]["Dimensions"]): d for d in documents}
    run = by_dimensions[json.dumps([["JobQueue"], ["JobQueue", "Run"]])]
    assert run["_aws"]["Timestamp"] == 1_800_000_000_000
    assert (run["TrainingLoss"], run["MFU"], run["Steps"], run["JobQueue"]) == (
        [2.5],
        [0.41],
        1,
        "trainstack-prod-gpu",
    )
    rank = by_dimensions[json.dumps([["JobQueue", "Run", "Rank"]])]
    assert (rank["StepSeconds"], rank["Rank"]) == ([0.8], "3")


def test_a_hundredth_value_writes_its_line_early_so_no_value_is_lost(emf):
    """The spec allows 100 values per metric in a line: the 150 step times of a busy interval go out as a line of
    100 and one of 50, so CloudWatch's Max and Min see the spike wherever it fell."""
    writer, out = emf
    times = [1.0] * 150
    times[7] = 9.5  # the spike, early in the interval (a keep-the-last-100 buffer dropped it)
    for value in times:
        writer.add(r.STEP_TIME, value)
    writer.flush()
    first, second = (json.loads(line) for line in lines(out))
    assert all(spec_problems(line) == [] for line in lines(out))
    assert (len(first["StepSeconds"]), len(second["StepSeconds"])) == (100, 50)
    assert first["StepSeconds"] + second["StepSeconds"] == times


def test_lines_wait_for_the_interval(emf, clock):
    writer, _ = emf
    writer.add(r.STEPS, 1)
    assert not writer.due()
    clock[0] += 60
    assert writer.due()


def test_node_counters_go_out_as_their_increase(emf):
    writer, out = emf
    previous: dict = {}
    port = {"device": "rdmap16s27", "port": "1"}
    writer.add_samples(
        [Sample(r.EFA_TRANSMITTED, port, 1000.0), Sample(r.GPU_TEMPERATURE, {"gpu": "0"}, 61)], previous
    )
    writer.flush()
    writer.add_samples(
        [Sample(r.EFA_TRANSMITTED, port, 5000.0), Sample(r.GPU_TEMPERATURE, {"gpu": "0"}, 63)], previous
    )
    writer.flush()
    first, second = (json.loads(line) for line in lines(out))
    assert "EfaTransmittedBytes" not in first and first["GpuTemperatureCelsius"] == [61]
    assert second["EfaTransmittedBytes"] == 4000.0 and second["Node"] == "ip-10-30-0-12"
    assert all(spec_problems(line) == [] for line in lines(out))


def test_the_checker_rejects_what_the_spec_forbids():
    good = {
        "_aws": {
            "Timestamp": 1,
            "CloudWatchMetrics": [
                {"Namespace": "n", "Dimensions": [["A"]], "Metrics": [{"Name": "x", "Unit": "Seconds"}]}
            ],
        },
        "A": "a",
        "x": 1,
    }
    assert spec_problems(json.dumps(good)) == []
    assert spec_problems(json.dumps({**good, "A": 3}))  # a dimension target must be a string
    assert spec_problems(json.dumps({**good, "x": list(range(101))}))  # at most 100 values
    bad_unit = json.loads(json.dumps(good))
    bad_unit["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Unit"] = "Seconds/Minute"
    assert spec_problems(json.dumps(bad_unit))
    nine = json.loads(json.dumps(good))
    nine["_aws"]["CloudWatchMetrics"][0]["Dimensions"] = [[f"D{i}" for i in range(10)]]
    assert spec_problems(json.dumps(nine))


def test_every_pushed_metric_has_a_cloudwatch_unit_and_a_unique_name():
    pushed = [m for m in r.METRICS if m.cloudwatch]
    assert len({m.cloudwatch for m in pushed}) == len(pushed)
    assert {m.cloudwatch_unit for m in pushed} <= set(
        SCHEMA["properties"]["_aws"]["properties"]["CloudWatchMetrics"]["items"]["properties"]["Metrics"][
            "items"
        ]["properties"]["Unit"]["enum"]
    )
