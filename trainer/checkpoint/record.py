"""What a checkpoint records about its model: enough to rebuild it without the run's config (score, convert) and
to refuse a config it does not fit."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config import ModelConfig


@dataclass(frozen=True)
class ModelRecord:
    config: ModelConfig  # vocab_size set (the tokenizer's where the run's config left it unset)
    seq_length: int  # the sequence length it was trained at; converted: the source's maximum
    hf_config: dict | None = None  # the Hugging Face config.json it was converted from, if it was

    def to_dict(self) -> dict:
        return {
            "config": self.config.model_dump(),
            "seq_length": self.seq_length,
            "hf_config": self.hf_config,
        }

    @classmethod
    def from_dict(cls, saved: dict) -> ModelRecord:
        return cls(ModelConfig(**saved["config"]), saved["seq_length"], saved["hf_config"])


def model_mismatches(saved: ModelConfig, wanted: ModelConfig) -> list[str]:
    """How a model config differs from the one a checkpoint holds, in what decides its weights and outputs."""

    def weights_defining(m: ModelConfig) -> dict:
        assert m.vocab_size is not None  # a record and the run's model both have resolved_model's vocabulary
        return {
            "model.num_layers": m.num_layers,
            "model.hidden_size": m.hidden_size,
            "model.ffn_hidden_size": m.ffn_hidden_size,
            "model.num_attention_heads": m.num_attention_heads,
            "model.num_query_groups": m.query_groups,
            "model.kv_channels": m.head_dim,
            "model.vocab_size": m.vocab_size,
            "padded vocabulary (model.make_vocab_size_divisible_by)": m.padded_vocab_size(m.vocab_size),
            "model.rotary_base": m.rotary_base,
            "model.rope_scaling_factor": m.rope_scaling_factor,
            "model.norm_epsilon": m.norm_epsilon,
            "model.share_embeddings_and_output_weights": m.share_embeddings_and_output_weights,
        }

    theirs, ours = weights_defining(saved), weights_defining(wanted)
    return [
        f"{key} = {ours[key]} in the config, {theirs[key]} in the checkpoint"
        for key in ours
        if ours[key] != theirs[key]
    ]
