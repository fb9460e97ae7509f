"""`make bench-gpu` where there is no GPU: it refuses before any work, and its model is what it says."""

from pathlib import Path

from trainer.__main__ import main as trainer_main
from trainer.bench.gpu import GPU_CONFIG
from trainer.config import layout_problems, load_config
from trainer.model.flops import parameter_counts
from trainer.plan.memory import estimate_memory
from trainer.plan.search import vocab_size

ROOT = Path(__file__).resolve().parents[2]


def test_bench_gpu_without_cuda_fails_before_any_work(capsys, tmp_path):
    assert trainer_main(["bench", "--gpu", "--out", str(tmp_path)]) == 2
    assert "make bench-gpu needs a CUDA GPU" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_bench_gpu_model_is_llama_3_2_1b_and_fits_one_h200():
    cfg = load_config(ROOT / GPU_CONFIG)
    assert layout_problems(cfg, 1, "cuda") == []
    assert parameter_counts(cfg.model, vocab_size(cfg)).total == 1_235_814_400  # Llama 3.2 1B, as published
    assert estimate_memory(cfg, 1, vocab_size(cfg), "transformer_engine").total < 141 * 2**30 * 0.9
