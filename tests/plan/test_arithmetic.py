"""Parameter counts and model FLOPs against published figures.

Sources:
- Llama 3 8B / 70B: the Hugging Face checkpoints meta-llama/Meta-Llama-3-8B and -70B,
  `model.safetensors.index.json` "total_size" 16,060,522,496 and 141,107,412,992 bytes of bf16 weights, i.e.
  8,030,261,248 and 70,553,706,496 parameters; shapes from their config.json.
- GPT-3 175B: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM" (SC21), section 5.1 / appendix: P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)) and, with activation
  recomputation, F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration; l=96, h=12288, V=51200, s=2048.
  Brown et al. 2020, "Language Models are Few-Shot Learners", table D.1: 3.14e23 FLOPs for 300B tokens.
- Kaplan et al. 2020, "Scaling Laws for Neural Language Models": C = 6 N per token for the weight matmuls.
"""

import pytest

from trainer.config import ModelConfig
from trainer.model.flops import forward_flops_per_sequence, model_flops_per_sequence, parameter_counts

LLAMA3_8B = ModelConfig(
    num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32, num_query_groups=8
)
LLAMA3_70B = ModelConfig(
    num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64, num_query_groups=8
)
LLAMA3_VOCAB = 128256  # a multiple of 128: no padding
# GPT-3 175B in this trainer's terms: a SwiGLU of 8h/3 has the parameters and FLOPs of GPT-3's 4h GELU MLP;
# GPT-3 ties its embeddings. What differs (biases, LayerNorm's bias, learned positions) is under 0.05 %.
GPT3_175B = ModelConfig(
    num_layers=96,
    hidden_size=12288,
    ffn_hidden_size=32768,
    num_attention_heads=96,
    share_embeddings_and_output_weights=True,
)
GPT3_VOCAB, GPT3_SEQ = 51200, 2048


def test_llama3_8b_has_the_published_8_030_261_248_parameters():
    assert parameter_counts(LLAMA3_8B, LLAMA3_VOCAB).total == 16_060_522_496 // 2


def test_llama3_70b_has_the_published_70_553_706_496_parameters():
    assert parameter_counts(LLAMA3_70B, LLAMA3_VOCAB).total == 141_107_412_992 // 2


def test_gpt3_parameters_match_megatrons_formula_within_its_biases_and_positions():
    layers, h, v, s = 96, 12288, GPT3_VOCAB, GPT3_SEQ
    megatron = 12 * layers * h**2 * (1 + 13 / (12 * h) + (v + s) / (12 * layers * h))
    ours = parameter_counts(GPT3_175B, GPT3_VOCAB).total
    assert ours == pytest.approx(megatron, rel=5e-4)
    assert 174.5e9 < ours < 174.7e9  # "175B": 174.6 B in the paper


def test_gpt3_flops_match_megatrons_formula_without_recompute_and_with_the_causal_half():
    layers, h, v, s = 96, 12288, GPT3_VOCAB, GPT3_SEQ
    # The paper's 96 = 4 passes (recomputation) x 24; three passes give 72, and the logits (not recomputed)
    # keep their 6 B s h V. The paper counts the full s x s score matrix; Megatron-LM now counts its causal half.
    paper_without_recompute = 72 * s * layers * h**2 * (1 + s / (6 * h) + v / (12 * layers * h))
    causal_half = 72 * s * layers * h**2 * (s / (12 * h))
    assert model_flops_per_sequence(GPT3_175B, s, v) == pytest.approx(
        paper_without_recompute - causal_half, rel=1e-12
    )


def test_gpt3_flops_per_token_are_within_2_percent_of_brown_et_al():
    published_per_token = 3.14e23 / 300e9  # 6 N with N = 174.6 B, attention left out
    ours = model_flops_per_sequence(GPT3_175B, GPT3_SEQ, GPT3_VOCAB) / GPT3_SEQ
    assert ours == pytest.approx(published_per_token, rel=0.02)


@pytest.mark.parametrize(("model", "seq_length"), [(LLAMA3_8B, 8192), (LLAMA3_70B, 8192), (LLAMA3_8B, 2048)])
def test_llama3_flops_per_token_are_6n_of_the_matmul_weights_plus_causal_attention(model, seq_length):
    counts = parameter_counts(model, LLAMA3_VOCAB)
    matmul_weights = (
        counts.total - counts.embedding - counts.num_layers * counts.layer_norms - counts.final_norm
    )
    head_dim = model.hidden_size // model.num_attention_heads
    attention = 6 * seq_length * model.num_layers * model.num_attention_heads * head_dim  # causal half
    per_token = model_flops_per_sequence(model, seq_length, LLAMA3_VOCAB) / seq_length
    assert per_token == pytest.approx(6 * matmul_weights + attention, rel=1e-12)


def test_model_flops_count_every_matmul_three_times_with_causal_attention_halved():
    s, h, head_dim, vocab = 8192, 4096, 128, LLAMA3_VOCAB
    qkv = 2 * s * h * (32 + 2 * 8) * head_dim
    attention = 2 * (2 * s * s * h) / 2  # scores and weighted values, half of them masked
    projection = 2 * s * h * h
    mlp = 3 * 2 * s * h * 14336  # gate, up, down
    forward = 32 * (qkv + attention + projection + mlp) + 2 * s * h * vocab
    assert forward_flops_per_sequence(LLAMA3_8B, s, vocab).total == pytest.approx(forward, rel=1e-12)
    assert model_flops_per_sequence(LLAMA3_8B, s, vocab) == pytest.approx(3 * forward, rel=1e-12)


def test_tied_embeddings_count_once():
    untied = parameter_counts(LLAMA3_8B, LLAMA3_VOCAB)
    tied = parameter_counts(
        LLAMA3_8B.model_copy(update={"share_embeddings_and_output_weights": True}), LLAMA3_VOCAB
    )
    assert untied.total - tied.total == LLAMA3_VOCAB * 4096
