"""One process, launched by torchrun: checkpoints move between the local layer spec (CPU) and a spec whose modules
carry Transformer Engine style `_extra_state` (GPU), in both directions, and nothing else may be absent.

    extra_state_worker.py OUT       OUT/results.json: {case: "loaded" | the error's first line}

The TE side is the local model with each core attention given an extra state, as TE's attention modules keep FP8
metadata there (megatron-core 0.16.1 transformer/utils.py make_sharded_tensors_for_checkpoint wraps every
`*_extra_state` entry in a ShardedObject, which is what the TE spec's checkpoints hold and the local spec's lack).
"""

import io
import json
import sys
from pathlib import Path

import torch
from megatron.core import dist_checkpointing

from trainer.checkpoint import megatron as checkpoint
from trainer.checkpoint.record import ModelRecord
from trainer.checkpoint.store import Progress
from trainer.config import ModelConfig, ParallelDims
from trainer.distributed import parallel
from trainer.model import llama
from trainer.model.weights import model_only_config

MODEL = ModelConfig(
    num_layers=2,
    hidden_size=32,
    ffn_hidden_size=64,
    num_attention_heads=4,
    num_query_groups=2,
    vocab_size=128,
    share_embeddings_and_output_weights=True,
)


class WithExtraState:
    """Mixed into a module's class: an FP8-metadata-like extra state, serialized as TE does (a BytesIO)."""

    def get_extra_state(self):
        stream = io.BytesIO()
        torch.save({"scale": torch.ones(2)}, stream)
        return stream

    def set_extra_state(self, state):
        self.loaded_extra_state = state


def with_extra_state(chunks):
    for chunk in chunks:
        for layer in chunk.decoder.layers:
            attention = layer.self_attention.core_attention
            attention.__class__ = type(
                "TEStyle" + type(attention).__name__, (WithExtraState, type(attention)), {}
            )
    return chunks


def build(te_style: bool, *, zeroed: bool = False):
    """The model at TP = PP = 1; zeroed: every weight 0, so that a load that restores them shows."""
    chunks = llama.build(model_only_config(MODEL, seq_length=16)).chunks
    if zeroed:
        with torch.no_grad():
            for param in chunks[0].parameters():
                param.zero_()
    return with_extra_state(chunks) if te_style else chunks


def same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a[0].parameters(), b[0].parameters(), strict=True))


def save(directory: Path, chunks) -> Path:
    dims = ParallelDims(tp=1, pp=1, dp=1, vp=1)
    write = checkpoint.save(directory, chunks, None, None, Progress(), dims, ModelRecord(MODEL, 16))
    return write.finish()


def outcome(load) -> str:
    try:
        load()
        return "loaded"
    except Exception as error:  # the test reads which error it was
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"


def main() -> None:
    out = Path(sys.argv[1])
    parallel.initialize(model_only_config(MODEL, seq_length=16))
    try:
        local, te_style = build(te_style=False), build(te_style=True)
        assert any(k.endswith("core_attention._extra_state") for k in te_style[0].state_dict())
        local_saved, te_saved = save(out / "local", local), save(out / "te", te_style)
        results = {}
        target = build(te_style=True, zeroed=True)
        # What the trainer did before (megatron's default strictness, then a strict module load): refused.
        results["default strict load, local checkpoint into TE-style model"] = outcome(
            lambda: target[0].load_state_dict(
                dist_checkpointing.load({"model": target[0].sharded_state_dict()}, str(local_saved))["model"]
            )
        )
        results["local checkpoint into TE-style model"] = outcome(
            lambda: checkpoint.load_weights(local_saved, target)
        )
        results["weights equal after local -> TE-style"] = same_weights(local, target)
        target = build(te_style=False, zeroed=True)
        results["TE-style checkpoint into local model"] = outcome(
            lambda: checkpoint.load_weights(te_saved, target)
        )
        results["weights equal after TE-style -> local"] = same_weights(te_style, target)
        # Anything else absent still fails: an untied output layer, which the tied model's checkpoint lacks.
        untied = MODEL.model_copy(update={"share_embeddings_and_output_weights": False})
        target = llama.build(model_only_config(untied, seq_length=16)).chunks
        results["checkpoint lacking the output layer"] = outcome(
            lambda: checkpoint.load_weights(local_saved, target)
        )
        if torch.distributed.get_rank() == 0:
            (out / "results.json").write_text(json.dumps(results, indent=1))
    finally:
        parallel.shutdown()


if __name__ == "__main__":
    main()
