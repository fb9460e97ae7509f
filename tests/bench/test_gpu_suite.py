"""`make bench-gpu` where there is no GPU: it refuses before any work, and its model is what it says."""

from tests.conftest import ROOT
from trainer.__main__ import main as trainer_main
from trainer.bench.gpu import (
    ALLREDUCE_TIMEOUT_S,
    BASELINE_TIMEOUT_S,
    FIRST_PASS_TIMEOUT_S,
    GPU_CONFIG,
    PASS_TIMEOUT_S,
    add_allreduce,
    gpu_passes,
)
from trainer.config import accelerator_problems, layout_problems, load_config
from trainer.model.flops import parameter_counts
from trainer.plan.memory import estimate_memory
from trainer.plan.search import vocab_size


def test_bench_gpu_without_cuda_fails_before_any_work(capsys, tmp_path):
    assert trainer_main(["bench", "--gpu", "--out", str(tmp_path)]) == 2
    assert "make bench-gpu needs a CUDA GPU" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_bench_gpu_model_is_llama_3_2_1b_and_fits_one_h200():
    cfg = load_config(ROOT / GPU_CONFIG)
    assert layout_problems(cfg, 1, "cuda") == []
    assert parameter_counts(cfg.model, vocab_size(cfg)).total == 1_235_814_400  # Llama 3.2 1B, as published
    assert estimate_memory(cfg, 1, vocab_size(cfg), "transformer_engine").total < 141 * 2**30 * 0.9


def test_with_transformer_engine_the_suite_runs_the_production_path_in_bf16_and_fp8():
    for capability, fp8 in (((9, 0), "te-fp8-tensorwise"), ((10, 0), "te-fp8-mxfp8"), ((8, 0), None)):
        passes = gpu_passes(True, capability)
        assert [p.name for p in passes] == ["te-bf16", *([fp8] if fp8 else [])]
        for gpu_pass in passes:
            assert gpu_pass.production and "TransformerEngine spec" in gpu_pass.label
            cfg = load_config(ROOT / GPU_CONFIG, list(gpu_pass.overrides))
            assert cfg.fusion.gradient_accumulation_fusion and cfg.fusion.cross_entropy_loss_fusion
            assert layout_problems(cfg, 1, "cuda") == []
            assert accelerator_problems(cfg, transformer_engine=True, compute_capability=capability) == []


def test_without_transformer_engine_one_local_pass_labelled_as_not_production():
    [local] = gpu_passes(False, (9, 0))
    assert (local.name, local.overrides, local.production) == ("local-bf16", (), False)
    assert "torch SDPA attention" in local.label and "NOT the production path" in local.label
    cfg = load_config(ROOT / GPU_CONFIG, list(local.overrides))
    assert accelerator_problems(cfg, transformer_engine=False, compute_capability=(9, 0)) == []


def test_the_suite_is_cut_off_inside_eight_minutes():
    # With TransformerEngine: two passes (the first with the checkpoint timings), the baseline, the sweep.
    assert FIRST_PASS_TIMEOUT_S + PASS_TIMEOUT_S + BASELINE_TIMEOUT_S + ALLREDUCE_TIMEOUT_S < 8 * 60


def test_all_reduce_on_one_device_is_not_a_zero_row(tmp_path):
    report = {"results": [], "details": {}}
    add_allreduce(report, tmp_path, devices=1, max_bytes=1 << 20)
    [row] = report["results"]
    assert (row["value"], row["baseline"], row["ratio"]) == (None, "n/a on one device", None)
    assert list(tmp_path.iterdir()) == []  # no sweep was started


def test_without_transformer_engine_the_shipped_micro_batch_fits_an_h200_by_the_planner():
    # The GPU report's H200: 139.8 GiB; the SDPA path keeps no scores, so the shipped micro-batch 2 fits.
    from trainer.plan.fit import fit_problem

    cfg = load_config(ROOT / GPU_CONFIG)
    assert fit_problem(cfg, 1, vocab_size(cfg), "local", 139.8 * 2**30 - 2**30) is None
    assert fit_problem(cfg, 1, vocab_size(cfg), "local-unfused", 139.8 * 2**30 - 2**30) is not None
