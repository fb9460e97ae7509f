"""The one place that bridges megatron-core's assumptions of CUDA and of TransformerEngine/Apex.

Written for the megatron-core that requirements/train.txt pins: a version bump must come with a rerun of tests/trainer (TP2xPP2-equals-single-
process and resume-equals-straight are the gates). Each bridge applies only where its assumption fails, so a GPU
with TransformerEngine runs megatron-core untouched.

Without CUDA (CPU over gloo):
1. The CUDA RNG tracker (model_parallel_cuda_manual_seed, fork) reads and writes CUDA generator states: here the
   "CUDA" generator is the CPU one.
2. Hard-coded `device="cuda"` factories (pipeline schedules, grad buffers, clip_grads) and `Tensor.cuda()`
   (tied embeddings with PP > 1) land on the CPU, through a TorchFunctionMode. It stays on inside
   `Tensor.backward()` (DeepSpeed's backward calls it), where activation recompute re-runs megatron's forward.
3. `torch.cuda.current_device()` is used as a device for p2p receive buffers: it answers the CPU.
4. `torch.cuda.synchronize()` after p2p communication: nothing to wait for.
5. clip_grads and the mixed-precision / distributed optimizers check `tensor.type()` against `torch.cuda.*`
   names: CPU tensors report their CUDA type name.
Gloo in torch 2.13 has every collective megatron's DDP and distributed optimizer use (reduce_scatter_tensor,
all_gather_into_tensor, coalescing), so none is bridged.

Without TransformerEngine or Apex, megatron-core falls back to torch's AdamW, which keeps a per-parameter `step`
where their FusedAdam keeps one per param group; its distributed-optimizer checkpoint load assumes the latter:
6. Building a load request reads the step from the optimizer's state, which a fresh torch AdamW lacks:
   `prepare_torch_adam_for_load()` gives it its step-0 state first.
7. Loading the `fully_reshardable` format copies every state key but `step` from the checkpoint and fails on
   the per-parameter `step`; the `dp_reshardable` format copies the load request's own stale `step` over it; and
   load_state_dict gives all parameters one shared `step` tensor, which AdamW then increments once per parameter.
   Each parameter keeps the step restored from the param groups, in a tensor of its own.
"""

from __future__ import annotations

import megatron.core
import torch
from megatron.core.optimizer import MegatronOptimizer
from megatron.core.optimizer import distrib_optimizer as megatron_distrib_optimizer
from megatron.core.tensor_parallel import random as megatron_random
from torch.autograd import Variable
from torch.overrides import TorchFunctionMode

from trainer.contract.image import requirement_pin

# The version these bridges were written and tested against: the one requirements/train.txt pins.
MEGATRON_CORE_VERSION = requirement_pin("megatron-core")

_applied = False


class _CudaToCpu(TorchFunctionMode):
    """Bridges 2 and 5: CUDA placements become CPU ones; CPU tensors report CUDA type names."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if func is torch.Tensor.backward:
            # A mode is off while it handles a call, and recompute re-runs megatron's forward inside backward:
            # start the autograd engine directly (as megatron's schedules do), with the bridge on.
            (tensor,) = args
            gradient = kwargs.get("gradient")
            create_graph = kwargs.get("create_graph", False)
            retain_graph = kwargs.get("retain_graph")
            with self:
                Variable._execution_engine.run_backward(
                    (tensor,),
                    (torch.ones_like(tensor) if gradient is None else gradient,),
                    create_graph if retain_graph is None else retain_graph,
                    create_graph,
                    tuple(kwargs.get("inputs") or ()),
                    allow_unreachable=True,
                    accumulate_grad=True,
                )
            return None
        device = kwargs.get("device")
        if (isinstance(device, str) and device.startswith("cuda")) or getattr(device, "type", None) == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def apply() -> None:
    """Apply the bridges this machine needs; idempotent. Call before building anything with megatron-core."""
    global _applied
    if _applied:
        return
    if megatron.core.__version__ != MEGATRON_CORE_VERSION:
        raise RuntimeError(
            f"trainer/distributed/megatron_compat.py bridges megatron-core {MEGATRON_CORE_VERSION}, found "
            f"{megatron.core.__version__}: check each bridge against it and rerun tests/trainer before changing the pin"
        )
    if not torch.cuda.is_available():
        _bridge_cuda_to_cpu()
    if not megatron_distrib_optimizer.HAVE_APEX_OR_TE:
        _bridge_torch_adam_load()
    _applied = True


def _cpu_manual_seed(seed: int) -> None:
    """torch.manual_seed, returning None as torch.cuda.manual_seed does."""
    torch.manual_seed(seed)


def _bridge_cuda_to_cpu() -> None:
    # 1. The "CUDA" RNG is the CPU generator.
    torch.cuda.manual_seed = _cpu_manual_seed
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.set_rng_state = lambda new_state, device="cuda": torch.set_rng_state(new_state)
    megatron_random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    megatron_random._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    # 3 and 4.
    # Deliberately a device where torch types an index: megatron passes the result on as a device (item 3).
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment,return-value]
    torch.cuda.synchronize = lambda device=None: None
    # 2 and 5, for this thread (megatron-core runs its model and optimizer on the main thread).
    _CudaToCpu().__enter__()


def _bridge_torch_adam_load() -> None:
    optimizer_class = megatron_distrib_optimizer.DistributedOptimizer
    set_states = optimizer_class._set_main_param_and_optimizer_states

    def set_states_with_own_step(self, model_param, tensors):  # 7.
        group_index, group_order = self.model_param_group_index_map[model_param]
        state = self.optimizer.state[self.optimizer.param_groups[group_index]["params"][group_order]]
        if "step" in state:
            # The step load_state_dict restored from the param groups, in a tensor of its own. A dp_reshardable
            # load passes a `step` too: the load request's (a LocalNonpersistentObject of the state the request
            # was built from, megatron-core 0.16.1 distrib_optimizer.py sharded_param_state_dp_reshardable), not
            # the checkpoint's: it is not used.
            state["step"] = state["step"].clone()
            tensors = {**tensors, "step": state["step"]}
        return set_states(self, model_param, tensors)

    optimizer_class._set_main_param_and_optimizer_states = set_states_with_own_step


def prepare_torch_adam_for_load(optimizer: MegatronOptimizer) -> None:
    """6. Give a fresh torch AdamW the state it has at step 0 (loading then overwrites it); else a no-op."""
    for megatron_optimizer in getattr(optimizer, "chained_optimizers", [optimizer]):
        adam = megatron_optimizer.optimizer
        if not isinstance(adam, torch.optim.AdamW) or adam.state:
            continue
        for group in adam.param_groups:
            for param in group["params"]:
                adam.state[param] = {
                    "step": torch.tensor(0.0),
                    "exp_avg": torch.zeros_like(param),
                    "exp_avg_sq": torch.zeros_like(param),
                }
