"""trainstack's trainer: `python -m trainer <verb>`."""

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
