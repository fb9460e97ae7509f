"""One process of a logits run, launched by torchrun: loads each checkpoint's weights at the given layout and
writes the full logits (gathered over TP, real vocabulary only) of one batch of tokens.

    logits_worker.py TP PP TOKENS.json OUT NAME=CHECKPOINT...      OUT/NAME.pt: [batch, sequence, vocab]
"""

import json
import sys
from pathlib import Path

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.pipeline_parallel import get_forward_backward_func

from trainer.checkpoint import formats as checkpoint
from trainer.distributed import parallel
from trainer.model import llama as model
from trainer.model.weights import model_only_config


def forward_logits(chunks, tokens: torch.Tensor) -> torch.Tensor | None:
    """The model's logits over its padded vocabulary on the last pipeline stage; None elsewhere."""
    captured = []

    def forward_step(batches, chunk):
        batch = next(batches)
        positions = torch.arange(batch.shape[1])[None].expand_as(batch)
        return chunk(batch, positions, None), capture

    def capture(logits):
        captured.append(tensor_parallel.gather_from_tensor_model_parallel_region(logits))
        return logits.sum() * 0, torch.tensor(1), {}

    with torch.no_grad():
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter([tokens]),
            model=chunks[0],
            num_microbatches=1,
            seq_length=tokens.shape[1],
            micro_batch_size=tokens.shape[0],
            forward_only=True,
        )
    return captured[0] if captured else None


def main() -> None:
    tp, pp, tokens_file, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    tokens = torch.tensor(json.loads(tokens_file.read_text()))
    named = [argument.split("=", 1) for argument in sys.argv[5:]]
    records = {name: checkpoint.read_record(checkpoint.resolve(path)) for name, path in named}
    first = next(iter(records.values()))
    parallel.initialize(
        model_only_config(first.config, tensor_parallel=tp, pipeline_parallel=pp, seq_length=tokens.shape[1])
    )
    try:
        for name, path in named:
            m = records[name].config
            cfg = model_only_config(m, tensor_parallel=tp, pipeline_parallel=pp, seq_length=tokens.shape[1])
            chunks = model.build(cfg).chunks
            checkpoint.load_weights(checkpoint.resolve(path), chunks)
            logits = forward_logits(chunks, tokens)
            if logits is not None and parallel_state.get_tensor_model_parallel_rank() == 0:
                torch.save(logits[..., : m.vocab_size].clone(), out / f"{name}.pt")
    finally:
        parallel.shutdown()


if __name__ == "__main__":
    main()
