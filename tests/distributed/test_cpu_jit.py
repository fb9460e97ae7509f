"""megatron-core's jit_fuser under trainer/distributed/cpu_jit.py: megatron's no-op decorator where CUDA is absent
(without the compiler's imports), torch.compile where CUDA is present; each in a fresh interpreter, as a process
starts."""

import json
import subprocess
import sys

from tests.conftest import ROOT

PROBE = """
import json, sys
import torch
if sys.argv[1] == "cuda":
    torch.cuda.is_available = lambda: True  # a CUDA machine, as megatron.core.jit is imported
import trainer
from megatron.core import jit
from megatron.core.fusions import fused_bias_swiglu
print(json.dumps({
    "fuser": jit.jit_fuser.__name__,
    "swiglu_compiled": hasattr(fused_bias_swiglu.bias_swiglu, "_torchdynamo_orig_callable"),  # torch.compile's
    "inductor_imported": "torch._inductor.compile_fx" in sys.modules,
}))
"""


def probe(device: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, device],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_without_cuda_megatrons_fused_functions_stay_plain_and_the_compiler_is_not_imported():
    assert probe("cpu") == {"fuser": "noop_decorator", "swiglu_compiled": False, "inductor_imported": False}


def test_with_cuda_megatron_compiles_them_as_upstream_does():
    assert probe("cuda") == {"fuser": "compile", "swiglu_compiled": True, "inductor_imported": True}
