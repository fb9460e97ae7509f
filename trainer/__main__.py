"""`python -m trainer <verb>`: each verb lives in its own module, imported only when it runs (torch and
megatron-core take seconds to import; `--help` should not)."""

from __future__ import annotations

import argparse
import importlib
import sys

# verb -> (module, one-line help). Each module defines add_arguments(parser) and main(args) -> int.
VERBS: dict[str, tuple[str, str]] = {
    "prepare": ("trainer.data.prepare", "tokenize text/JSONL into a Megatron indexed dataset (.bin/.idx)"),
    "merge": (
        "trainer.data.merge",
        "merge prepared shards into one indexed dataset, as one prepare would write",
    ),
    "train": ("trainer.train", "train (launched by torchrun, one process per device)"),
    "convert": (
        "trainer.interop.convert",
        "trainer checkpoint <-> Hugging Face Llama or DeepSpeed checkpoint",
    ),
    "score": (
        "trainer.evaluation.score",
        "mean loss per token and perplexity of a checkpoint (evaluation only)",
    ),
    "models": (
        "trainer.models.command",
        "model versions (lineage, metrics, evaluations) and their tags: list, show, promote",
    ),
    "finetune-stages": (
        "trainer.models.pipeline",
        "after a fine-tune: evaluate its newest checkpoint, promote it to a tag, export it; each once",
    ),
    "serve": (
        "trainer.serving.command",
        "serve a model version (a tag or name) with an OpenAI-compatible API on this machine",
    ),
    "generate": (
        "trainer.evaluation.generate",
        "continue prompts with a checkpoint's model (KV cache; greedy, temperature, top-k, top-p)",
    ),
    "evaluate": (
        "trainer.evaluation.evaluate",
        "a checkpoint against a suite: perplexity on held-out data, exact match on generation tasks",
    ),
    "sweep": (
        "trainer.sweep.command",
        "a hyperparameter sweep (Optuna: TPE, pruning on validation loss), each trial a trainer run; resumes",
    ),
    "sweep-worker": (
        "trainer.sweep.worker",
        "one worker of a sweep shared by several: trials from the shared study until its trials or its dollar cap",
    ),
    "sweep-stack": (
        "trainer.jobs.sweep",
        "a sweep on a stack: its workers as one array job (or JobSet) of the queue; follows it, found again by name",
    ),
    "plan": ("trainer.plan.command", "rank parallel layouts by memory, step time and cost on N nodes"),
    "measure-stack": (
        "trainer.jobs.measure",
        "the planner's N best layouts for a stack, each a few steps as a job there; writes the measured-fastest",
    ),
    "bench": (
        "trainer.bench.command",
        "measure data prep, training, checkpoints and memory against baselines",
    ),
    "launch": (
        "trainer.launch.node",
        "map Batch node variables to torchrun, run the preflight, then a verb",
    ),
    "preflight": (
        "trainer.preflight.command",
        "check GPUs, EFA devices, checkpoint storage and an all-reduce",
    ),
    "submit": ("trainer.jobs.submit", "run the trainer on a stack's cluster as a Batch multi-node job"),
    "finetune": (
        "trainer.jobs.finetune",
        "a fine-tune's stages on a stack's cluster (train, then evaluate -> promote -> export), resuming",
    ),
    "render": (
        "trainer.jobs.render",
        "print what submit would send: the JobSet (EKS) or the Batch job request, no AWS call",
    ),
    "smoke": ("trainer.jobs.smoke", "prove a stack: a 2-node preflight job, its report and the S3 export"),
    "job": ("trainer.jobs.job", "status, logs or cancel of a stack's training jobs"),
    "push": ("trainer.jobs.push", "push the trainer image to a stack's ECR repository"),
    "upload": ("trainer.jobs.upload", "upload a prepared dataset to a stack's datasets bucket"),
    "data": ("trainer.jobs.data", "prepare a corpus on a stack's CPU queue: array job of shards, then merge"),
    "deploy": (
        "trainer.deploy.command",
        "a model version onto the stack's SageMaker endpoint: canary, rollback on alarms, or ROLLBACK",
    ),
    "audit": ("trainer.jobs.audit", "who submitted, cancelled and changed what on a stack, newest first"),
    "compliance": (
        "trainer.jobs.compliance",
        "map each security control to its policies, resources and status",
    ),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="<verb>")
    for verb, (_, help_text) in VERBS.items():
        verbs.add_parser(verb, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in VERBS:
        parser.parse_args(argv)  # prints help or the "invalid choice" error and exits
    module = importlib.import_module(VERBS[argv[0]][0])
    verb_parser = argparse.ArgumentParser(prog=f"python -m trainer {argv[0]}", description=VERBS[argv[0]][1])
    module.add_arguments(verb_parser)
    return module.main(verb_parser.parse_args(argv[1:]))


if __name__ == "__main__":
    from trainer.distributed import lifetime
    from trainer.distributed.quick_exit import quick_exit

    lifetime.start_children()  # torchrun, a rank's writer and evaluations end with this process
    quick_exit(main())
