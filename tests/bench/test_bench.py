"""`make bench` and `make bench-gpu` on a tiny input, so their code cannot rot: the CPU suite end to end
(data preparation against its baseline, training at TP1xPP2 against one process, pipeline idle time, checkpoint
throughput, memory against the planner), and the GPU suite's code on CPU through gloo."""

import email
import json
import statistics
from pathlib import Path

import pytest

from trainer.bench.checkpointing import BACKGROUND_SAVES
from trainer.bench.command import print_report, run_suite, write_report
from trainer.bench.gpu import run_gpu_suite
from trainer.bench.training import steady_blocking

pytestmark = pytest.mark.slow  # multi-process runs (make test still runs them)


@pytest.fixture(scope="module")
def pipelined_config(tiny_config, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bench-config") / "tiny-pp2.yaml"
    path.write_text(tiny_config.read_text() + "parallel:\n  pipeline_model_parallel_size: 2\n")
    return path


@pytest.fixture(scope="module")
def cpu_report(pipelined_config, tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("bench")
    report = run_suite(
        pipelined_config,
        out,
        steps=3,
        memory_layouts=(),
        checkpoint_overrides=(),
        disk_bytes=16 << 20,
        data_inputs=[str(Path(email.__file__).parent)],
        sweep=None,  # tests/bench/test_sweep.py runs it small
        serving=False,  # tests/bench/test_serving.py runs it
    )
    return report, write_report(report, out / "bench.json")


def results(report: dict) -> dict[str, dict]:
    return {r["name"].split(" (")[0]: r for r in report["results"]}


def test_every_result_stands_against_a_baseline_from_the_same_run(cpu_report):
    report, path = cpu_report
    assert json.loads(path.read_text()) == report
    named = results(report)
    assert set(named) >= {
        "data preparation",
        "data preparation, per worker",
        "training tp1-pp2",
        "step time tp1-pp2 fp32",
        "pipeline idle tp1-pp2",
        "checkpoint save",
        "checkpoint load",
        "checkpoint stall per background save, steady state",
        "checkpoint stall of a run's first background save",
        "checkpoint hashing while writing",
        "checkpoint digest of every byte",
        "checkpoint load at tp1-pp1-load",
        "trainer step, logging included",
    }
    for result in report["results"]:
        assert result["value"] >= 0 and result["baseline_value"] > 0  # a stall can be nil
        assert result["ratio"] == pytest.approx(result["value"] / result["baseline_value"])
    assert report["machine"]["cpus_usable"] >= 1 and "load_average_1m_at_end" in report["machine"]


def test_prepare_and_its_baseline_write_the_same_dataset(cpu_report):
    data = cpu_report[0]["details"]["data"]
    assert data["identical_output"] and data["tokens"] > 10_000


def test_prepare_per_worker_cpu_second_stands_against_the_tokenizer_alone(cpu_report):
    data = cpu_report[0]["details"]["data"]
    # The workers read, parse and frame documents besides encoding them: the tokenizer alone is their ceiling.
    assert 0 < data["ours_tokens_per_worker_cpu_s"] < 2 * data["tokenizer_tokens_per_cpu_s"]


def test_step_time_stands_at_both_precisions(cpu_report):
    report = cpu_report[0]
    row = results(report)["step time tp1-pp2 fp32"]  # tiny.yaml says fp32
    assert row["baseline"] == "bf16, same layout" and row["value"] > 0 and row["baseline_value"] > 0
    assert report["details"]["precision"].startswith("precision: fp32 (set in the config)")


def test_pipeline_idle_is_measured_per_stage_against_the_1f1b_bubble(cpu_report):
    idle = cpu_report[0]["details"]["pipeline_idle"]
    assert idle["bubble"] == pytest.approx(1 / 5)  # p = 2, m = 8 / 2 = 4
    assert len(idle["measured_by_stage"]) == 2
    assert all(0 < share < 1 for share in idle["measured_by_stage"])


def test_checkpoint_throughput_counts_the_bytes_written(cpu_report):
    checkpoint = cpu_report[0]["details"]["checkpoint"]
    assert checkpoint["bytes"] > 100_000 and checkpoint["save_gbytes_per_s"] > 0
    # Each background save was published while steps went on; the first save loaded at another layout.
    assert len(checkpoint["background_saves"]) == BACKGROUND_SAVES
    assert all(save["steps_while_writing_seconds"] for save in checkpoint["background_saves"])
    assert checkpoint["background_saves"][-1]["publish_seconds"] > 0
    assert checkpoint["load_seconds_other_layout"] > 0


def test_the_steady_state_stall_is_the_median_of_the_saves_that_reuse_the_plan(cpu_report):
    report = cpu_report[0]
    saves = [save["blocking_seconds"] for save in report["details"]["checkpoint"]["background_saves"]]
    row = results(report)["checkpoint stall per background save, steady state"]
    assert row["value"] == statistics.median(saves[2:])  # the first plans, the second checks the plan
    assert steady_blocking({"background_saves": [{"blocking_seconds": s} for s in (9.0, 5.0, 0.3)]}) == 0.3


def test_overhead_compares_the_trainers_loop_with_a_bare_megatron_loop(cpu_report):
    overhead = cpu_report[0]["details"]["overhead"]
    assert (
        len(overhead["seconds"]["bare"]) == len(overhead["seconds"]["trainer"]) == 2 * 3
    )  # 2 runs x 3 steps
    assert overhead["trainer"] > 0 and overhead["bare"] > 0


def test_memory_model_predicts_each_measured_peak_within_15_percent(cpu_report):
    rows = cpu_report[0]["details"]["memory"]
    assert [(row["layout"], row["pipeline_rank"]) for row in rows] == [
        ("tp1-pp1", 0),
        ("tp1-pp2", 0),
        ("tp1-pp2", 1),
    ]
    for row in rows:
        assert abs(row["error"]) < 0.15, row
        assert row["predicted"]["weights"] == pytest.approx(
            row["measured"]["weights"], rel=0.01
        )  # bucket padding


def test_report_prints_as_a_table(cpu_report):
    from rich.console import Console

    console = Console(record=True, width=200)
    print_report(console, cpu_report[0])
    text = console.export_text()
    assert "data preparation" in text and "pipeline idle tp1-pp2" in text


def test_gpu_suite_code_runs_on_cpu_and_writes_its_report(tiny_config, tmp_path):
    report = run_gpu_suite(tiny_config, tmp_path, steps=2, allreduce_processes=2, allreduce_max_bytes=4 << 20)
    [training] = [r for r in report["results"] if r["name"].startswith("training tokens/s")]
    assert training["value"] > 0 and training["ratio"] is None  # no CPU peak
    # Without TransformerEngine the figure names the spec and kernel and is not called production MFU.
    assert "local spec" in training["name"] and "NOT the production path" in training["name"]
    assert "(ratio: local-spec MFU)" in training["name"]
    details = report["details"]["training"]
    assert list(details) == ["local-bf16"]
    assert (details["local-bf16"]["production"], details["local-bf16"]["kernels"]) == (False, "local")
    # The same shape trained by a plain transformers SDPA loop in the same run, and the trainer against it.
    baseline = next(
        r for r in report["results"] if r["name"].startswith("transformers LlamaForCausalLM loop")
    )
    versus = next(r for r in report["results"] if "against the transformers SDPA loop" in r["name"])
    assert baseline["value"] > 0 and versus["baseline_value"] == baseline["value"]
    assert versus["ratio"] == pytest.approx(training["value"] / baseline["value"])
    assert report["details"]["baseline"]["micro_batch_size"] == details["local-bf16"]["micro_batch_size"]
    # The background save's stall against the synchronous save's, and the save's write speed.
    stall = next(r for r in report["results"] if r["name"].startswith("checkpoint stall per background save"))
    assert stall["value"] > 0 and stall["baseline_value"] > 0
    assert any(
        r["name"].startswith("checkpoint save write speed") and r["value"] > 0 for r in report["results"]
    )
    sweep = report["details"]["allreduce"]
    assert sweep["world_size"] == 2 and sweep["backend"] == "gloo"
    assert [row["bytes"] for row in sweep["sizes"]] == [1 << 20, 4 << 20]
    assert all(
        row["busbw_gbytes_per_s"] == pytest.approx(row["algbw_gbytes_per_s"]) for row in sweep["sizes"]
    )  # 2(n-1)/n = 1
    written = write_report(report, tmp_path / "bench-gpu.json")
    assert json.loads(written.read_text())["results"] == report["results"]
