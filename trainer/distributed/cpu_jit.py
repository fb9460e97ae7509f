"""megatron-core's fused elementwise functions without torch.compile on machines without CUDA.

megatron-core decorates them (bias + SwiGLU, bias + dropout + add, the GELUs, ...) with `jit_fuser` as its modules
are imported; since torch 2.2 that is torch.compile (megatron/core/jit.py, core_v0.16.1), and decorating imports
TorchDynamo's and Inductor's compiler: about half of a CPU process's start-up (4 s of 7 s of imports, measured on a
2-core Zen 3 with torch 2.13). On CPU none of them runs: the model turns these fusions off there
(trainer/model/llama.py `fused`). So where CUDA is absent, `install()` makes megatron's own `disable_jit_fuser()`
(its no-op decorator) take effect as megatron.core.jit is first imported, before any module takes the name; a
function that did run would run eagerly, with the same result. torch is imported by megatron.core.jit itself: this
module imports nothing heavy, so the torch-free verbs (`prepare`, the infra tools) stay torch-free.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

MODULE = "megatron.core.jit"


class _WithoutCompileOnCpu(importlib.abc.MetaPathFinder):
    """Finds megatron.core.jit as the path finder does; once it has run, disables its fuser where CUDA is absent."""

    def find_spec(self, fullname, path, target=None):
        if fullname != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            import torch

            if not torch.cuda.is_available():
                module.disable_jit_fuser()

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Before megatron-core is imported (else megatron's modules hold torch.compile already): from here on."""
    if MODULE not in sys.modules and not any(isinstance(f, _WithoutCompileOnCpu) for f in sys.meta_path):
        sys.meta_path.insert(0, _WithoutCompileOnCpu())
