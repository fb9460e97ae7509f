"""trainstack's trainer: `python -m trainer <verb>` (__main__.py lists the verbs; docs/architecture.md the floors).

By floor, bottom to top; a package imports only the floors below it (tests/test_structure.py):

contract    what infra/, image/ and the trainer share
arguments   argument types shared by the verbs
lock_file   a directory's flock(2) lock file, or why the directory cannot hold one
device      cpu or cuda and the GPU count, torch asked only where a GPU driver's device file exists
aws         AWS clients with the project's retries, the instance metadata, a stack's outputs
monitoring  Prometheus and CloudWatch exporters, alert rules and dashboards
config      the typed config tree, its checks, the layout (ParallelDims), precision and the YAML/--set loader
cost        prices from AWS (or a dated snapshot), energy and emissions estimates, the ledger
distributed torchrun and its supervisor, process groups, optimizer, the fast path, megatron-core's CPU bridges
data        prepare, tokenizers, indexed datasets, samples and micro-batch streams
model       the Llama model, its arithmetic and loss
faults      SIGTERM agreement, skipped steps, collective failures, and the tests' fault hook
plan        the planner: layouts, memory, step time, cost
checkpoint  the checkpointer the loop calls, the background writer, the directory protocol, each format, the
            model version record
engines     what does a step, evaluates, saves and loads: megatron, deepspeed
interop     Hugging Face and DeepSpeed checkpoints in and out
evaluation  measuring a trained model (score, generate, suites)
models      model versions: registry, tags, the fine-tune's last stages (`models`, `finetune-stages`)
serving     a model version served with an OpenAI-compatible API on this machine (`serve`)
tracking    runs and sweep trials in MLflow: config, metrics, model version
metrics     metrics.jsonl, TensorBoard and the console for each logged step; MFU
health      straggler windows and the hang watchdog
preflight   the checks every node passes before training
launch      a cluster node's share of a job: each backend's rendezvous, preflight, torchrun
deploy      `make deploy`: a model version onto the stack's SageMaker endpoint, behind a canary, rolled back by alarms
jobs        runs on a stack's cluster (submit, status, logs, cancel, push, upload, smoke)
sweep       hyperparameter sweeps: an Optuna study, each trial a trainer run (`sweep`)
loop        the engine-agnostic training loop of one torchrun process
train       the `train` command: checks, then torchrun under its supervisor, or the loop under torchrun
bench       `make bench` and `make bench-gpu`
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

# First of all: a process another trainer process started (a rank, torchrun, a checkpoint writer) ends with it.
from trainer.distributed import lifetime  # noqa: E402

lifetime.end_with_parent()

# Before megatron-core is imported too: its fused functions are not compiled where CUDA is absent (they do not run
# there; compiling them at import is half of a CPU process's start-up).
from trainer.distributed import cpu_jit  # noqa: E402

cpu_jit.install()
