"""trainstack's trainer: `python -m trainer <verb>` (__main__.py lists the verbs; docs/architecture.md the layers).

train       the `train` command and the engine-agnostic training loop
metrics     metrics.jsonl, TensorBoard and the console for each logged step; MFU
faults      SIGTERM agreement, skipped steps, collective failures, and the tests' fault hook
arguments   argument types shared by the verbs
config      the typed config tree, its checks, the layout (ParallelDims) and the YAML/--set loader
engines     what does a step, evaluates, saves and loads: megatron, deepspeed
checkpoint  the checkpointer the loop calls, the background writer, the directory protocol, each format
model       the Llama model, its arithmetic, loss and precision
distributed process groups, optimizer, the fast path, megatron-core's CPU bridges
data        prepare, tokenizers, indexed datasets, samples and micro-batch streams
evaluation  measuring a trained model (score)
interop     Hugging Face and DeepSpeed checkpoints in and out
models      model versions: each checkpoint's lineage record, evaluations, tags (`models`)
launch      torchrun, each backend's rendezvous, the supervisor
preflight   the checks every node passes before training
health      straggler windows and the hang watchdog
monitoring  Prometheus and CloudWatch exporters, alert rules and dashboards
contract    what infra/, image/ and the trainer share
jobs        runs on a stack's cluster (submit, status, logs, cancel, push, upload, smoke)
deploy      `make deploy`: a model version onto the stack's SageMaker endpoint, behind a canary, rolled back by alarms
plan        the planner: layouts, memory, step time, cost
bench       `make bench` and `make bench-gpu`
cost        prices from AWS (or a dated snapshot), energy and emissions estimates
"""

import warnings

# megatron-core and torch warn on every run about things a user cannot act on (optional CUDA extensions absent
# on CPU, deprecations inside megatron-core's own calls). Silenced here, before either is imported.
for _message in (
    "Transformer Engine and Apex are not installed",
    "Apex is not installed",
    "The .grad attribute of a Tensor that is not a leaf",
    "When using async grad allreduce it is recommended",
    r"`torch.distributed.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated",
    "full scope is deprecated",
    "Please use DTensor instead and we are deprecating ShardedTensor",
    "`load_state_dict` is deprecated and will be removed",
):
    warnings.filterwarnings("ignore", message=_message)

# Before megatron-core is imported too: its fused functions are not compiled where CUDA is absent (they do not run
# there; compiling them at import is half of a CPU process's start-up).
from trainer.distributed import cpu_jit  # noqa: E402

cpu_jit.install()
