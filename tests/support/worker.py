"""One process of a test run, launched by torchrun: trains with the production loop and records each step's
full (unsharded) gradients, or loads a checkpoint and evaluates it.

    worker.py train CONFIG OUT [--set k=v ...]          metrics in the run dir; OUT/grads_pp<rank>.pt
    worker.py evaluate CONFIG OUT CHECKPOINT [--set ...] OUT/val_loss.json
    worker.py uneven CONFIG OUT [--set k=v ...]         one global batch whose samples keep uneven numbers of
                                                        tokens in their loss masks: OUT/grads_pp<rank>.pt, the
                                                        gradients the optimizer would apply
"""

import argparse
import json
from pathlib import Path

import torch
from megatron.core import parallel_state
from megatron.core.utils import unwrap_model
from rich.console import Console

from trainer import engines, loop
from trainer.config import load_config
from trainer.distributed import parallel
from trainer.model import llama as model

GRADIENT_STEPS = 3  # steps whose gradients are recorded


def full_gradients(run) -> dict[str, torch.Tensor]:
    """Every parameter's gradient as the optimizer sees it, reduced over DP and gathered over TP."""
    dims = run.dims
    if run.cfg.parallel.use_distributed_optimizer and dims.dp > 1:
        # The distributed optimizer's reduce-scatter left each DP rank its shard only: gather the rest.
        for chunk in run.chunks:
            for buffer in chunk.buffers:
                for bucket in buffer.buckets:
                    shard = bucket.grad_data.view(dims.dp, -1)[
                        parallel_state.get_data_parallel_rank()
                    ].clone()
                    torch.distributed.all_gather_into_tensor(
                        bucket.grad_data, shard, group=parallel_state.get_data_parallel_group()
                    )
    gradients = {}
    tp_group = parallel_state.get_tensor_model_parallel_group()
    for chunk in unwrap_model(run.chunks):
        for name, param in chunk.named_parameters():
            gradient = param.main_grad.detach().float().clone()
            dim = model.tp_dim(name)
            if dim is not None and dims.tp > 1:
                full_shape = list(gradient.shape)
                full_shape[dim] *= dims.tp
                # Where each element of this shard sits in the full tensor, by the trainer's own sharding.
                index = model.tp_shard(torch.arange(gradient.numel() * dims.tp).view(full_shape), name)
                shards = [torch.empty_like(gradient) for _ in range(dims.tp)]
                indices = [torch.empty_like(index) for _ in range(dims.tp)]
                torch.distributed.all_gather(shards, gradient, group=tp_group)
                torch.distributed.all_gather(indices, index, group=tp_group)
                full = torch.empty(gradient.numel() * dims.tp)
                for shard, where in zip(shards, indices, strict=True):
                    full[where.reshape(-1)] = shard.reshape(-1)
                gradient = full.view(full_shape)
            gradients[model.global_name(chunk, name)] = gradient
    return gradients


def record_gradients(steps: list) -> None:
    """Make each run's optimizer record the gradients it is about to apply, for the first GRADIENT_STEPS steps."""
    build = engines.build

    def build_recording(cfg, dims):
        run = build(cfg, dims)
        apply_gradients = run.apply_gradients  # prepared, norm computed, not yet clipped

        def recording_step(grad_norm):
            if len(steps) < GRADIENT_STEPS:
                steps.append(full_gradients(run))
            return apply_gradients(grad_norm)

        run.apply_gradients = recording_step
        return run

    engines.build = build_recording


def uneven_masks(stream):
    """The same micro-batches, each sample keeping 1 to seq_length leading tokens in its loss mask, by its first
    token: which sample keeps how many does not depend on the layout that draws it."""
    for batch in stream:
        seq_length = batch["loss_mask"].shape[1]
        keep = 1 + (batch["tokens"][:, :1] * 7919) % seq_length
        positions = torch.arange(seq_length, device=keep.device)[None]
        yield {**batch, "loss_mask": batch["loss_mask"] * (positions < keep).to(batch["loss_mask"].dtype)}


def uneven_gradients(cfg, dims) -> list[dict[str, torch.Tensor]]:
    """One global batch with uneven loss masks through the engine's forward and backward, gradients prepared."""
    run = engines.build(cfg, dims)
    batches = [uneven_masks(stream) for stream in run.train_batches(0)]
    for chunk in run.chunks:
        chunk.zero_grad_buffer()
    run.forward_backward(batches)
    run.optimizer.prepare_grads()
    return [full_gradients(run)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["train", "evaluate", "uneven"])
    parser.add_argument("config")
    parser.add_argument("out", type=Path)
    parser.add_argument("checkpoint", nargs="?", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    dims = parallel.initialize(cfg)
    console = Console(stderr=True, quiet=torch.distributed.get_rank() != 0)
    try:
        if args.mode in ("train", "uneven"):
            if args.mode == "uneven":
                steps = uneven_gradients(cfg, dims)
            else:
                steps = []
                if cfg.engine == "megatron":  # DeepSpeed's runs are compared by their losses
                    record_gradients(steps)
                loop.train(cfg, dims, console)
            if (
                parallel_state.get_tensor_model_parallel_rank() == 0
                and parallel_state.get_data_parallel_rank() == 0
            ):
                torch.save(
                    steps, args.out / f"grads_pp{parallel_state.get_pipeline_model_parallel_rank()}.pt"
                )
        else:
            run = engines.build(cfg, dims)
            run.load(args.checkpoint)
            val_loss = run.evaluate()
            if torch.distributed.get_rank() == 0:
                (args.out / "val_loss.json").write_text(json.dumps(val_loss))
    finally:
        parallel.shutdown()


if __name__ == "__main__":
    main()
