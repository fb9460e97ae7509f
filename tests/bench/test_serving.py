"""The serving section of `make bench` (trainer/bench/serving.py): its rows from raw measurements, and the section
end to end on the tests' tiny run, the server for real on 127.0.0.1."""

from __future__ import annotations

import pytest

from trainer.bench.serving import add_serving_results, bench_serving, percentile


def test_percentile_is_the_nearest_rank():
    samples = [float(n) for n in range(1, 101)]
    assert (
        percentile(samples, 50) == 50.0
        and percentile(samples, 99) == 99.0
        and percentile(samples, 100) == 100
    )
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="percentile 0 of 3 samples"):
        percentile([1.0, 2.0, 3.0], 0)
    with pytest.raises(ValueError, match="of 0 samples"):
        percentile([], 50)


def details(**load: object) -> dict:
    return {
        "prompts": 2,
        "new_tokens": 4,
        "generate": {
            "seconds": [1.0, 3.0],
            "tokens": [4, 4],
            "first_token_seconds": [0.5, 0.7],
            "texts": ["a", "b"],
        },
        "server": {
            "seconds": [0.2, 0.6],
            "tokens": [4, 2],
            "first_token_seconds": [0.1, 0.3],
            "texts": ["a", "b"],
        },
        "load": {
            "clients": 2,
            "requests": 4,
            "wall_seconds": 2.0,
            "seconds": [0.4, 0.8, 0.5, 1.0],
            "tokens": [4, 4, 4, 4],
            "errors": 0,
            "health_after": 200,
            "rss_before_bytes": 100 * 2**20,
            "rss_after_bytes": 110 * 2**20,
        }
        | load,
    }


def test_the_rows_stand_the_server_against_generate_and_the_load_against_one_at_a_time():
    report: dict = {"results": [], "details": {}}
    add_serving_results(report, details())
    rows = {row["name"].split(" (")[0]: row for row in report["results"]}
    speed = rows["serving tokens/s, one request at a time"]
    assert (speed["value"], speed["baseline_value"]) == (6 / 0.8, 8 / 4.0)
    assert "TEXT DIFFERS" not in speed["baseline"]
    first = rows["serving time to first token"]
    assert (first["value"], first["baseline_value"]) == pytest.approx((0.2, 0.6))
    p50, p99 = rows["serving load p50 latency"], rows["serving load p99 latency"]
    assert (p50["value"], p99["value"], p50["baseline_value"]) == (0.5, 1.0, pytest.approx(0.4))
    assert (
        rows["serving load tokens/s"]["value"] == 8.0 and rows["serving load tokens/s"]["ratio"] == 8.0 / 7.5
    )
    errors = rows["serving load errors"]
    assert (errors["value"], errors["baseline_value"], errors["ratio"]) == (0, 4, 0)
    memory = rows["serving resident memory after the load"]
    assert (memory["value"], memory["baseline_value"], memory["ratio"]) == (110, 100, 1.1)


def test_a_server_down_after_the_load_counts_as_an_error_and_differing_texts_are_named():
    report: dict = {"results": [], "details": {}}
    broken = details(errors=1, health_after=None)
    broken["server"]["texts"] = ["a", "c"]
    add_serving_results(report, broken)
    rows = {row["name"]: row for row in report["results"]}
    assert rows["serving load errors (/health after: None)"]["value"] == 2
    assert any(row["baseline"].endswith("(TEXT DIFFERS)") for row in report["results"])


@pytest.mark.slow
def test_the_section_serves_the_tiny_run_and_measures_both_sides_and_the_load(tiny_config, tmp_path):
    report: dict = {"results": [], "details": {}}
    steps = ("schedule.train_iters=5", "checkpoint.save_interval=5", "logging.tensorboard=false")
    bench_serving(
        report,
        tmp_path,
        recipe=tiny_config,
        overrides=steps,
        prompts=("def parse(self, ", "import os\n"),
        new_tokens=8,
        clients=2,
        requests=8,
    )
    measured = report["details"]["serving"]
    assert measured["generate"]["texts"] == measured["server"]["texts"]  # greedy, token for token
    load = measured["load"]
    assert load["errors"] == 0 and load["health_after"] == 200 and len(load["seconds"]) == 8
    assert load["rss_after_bytes"] > 0 and all(0 < t <= 8 for t in load["tokens"])
    assert len(report["results"]) == 7 and all(row["value"] is not None for row in report["results"])
    assert (tmp_path / "serving" / "runs" / "bench" / "export").is_dir()  # served from its own export
