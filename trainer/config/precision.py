"""`precision: auto`: compute in the precision this machine runs natively.

On a CPU without AVX-512 BF16 or AMX, PyTorch emulates bf16 matrix multiplies, and a bf16 step of local.yaml
takes 6-7x the fp32 one (3.7-4.5 s against 0.58-0.74 s on an AMD Zen 3, docs/trainer.md), so `auto` picks bf16
only where the hardware has it: CPUs with those instructions and GPUs of compute capability 8.0 or later (A100,
H100, ...). Production configs say `bf16` explicitly and get it everywhere. torch is imported only to look.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from trainer.device import device_type

AUTO = "auto"
Precision = Literal["bf16", "fp32"]
PRECISIONS = ("bf16", "fp32")
# The CPU features that compute bf16 natively: keys of torch.cpu.get_capabilities() (torch v2.13.0
# torch/cpu/__init__.py, from the cpuinfo library), named as the /proc/cpuinfo flags of the same features.
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class PrecisionChoice:
    """What `precision: auto` resolved to on this machine, and why, in words for the run's first lines."""

    precision: Precision
    reason: str


def native_bf16_cpu_flags() -> list[str]:
    """Which of NATIVE_BF16_CPU_FLAGS this CPU has."""
    import torch

    capabilities = torch.cpu.get_capabilities()
    return [flag for flag in NATIVE_BF16_CPU_FLAGS if capabilities.get(flag)]


def choose_precision(device: Literal["cpu", "cuda"]) -> PrecisionChoice:
    """The precision `auto` means on `device` of this machine."""
    import torch

    if device == "cuda":
        if not torch.cuda.is_available():  # planning or submitting for a cluster from elsewhere
            return PrecisionChoice(
                "bf16", "every GPU in the instance catalog (A100 and later) computes bf16 natively"
            )
        # torch/cuda/__init__.py (v2.13.0): without emulation, True from compute capability 8.0 (and on ROCm).
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return PrecisionChoice("bf16", f"{torch.cuda.get_device_name()} computes bf16 natively")
        return PrecisionChoice(
            "fp32", f"{torch.cuda.get_device_name()} has no native bf16 (compute capability below 8.0)"
        )
    if flags := native_bf16_cpu_flags():
        return PrecisionChoice("bf16", f"this CPU computes bf16 natively ({', '.join(flags)})")
    return PrecisionChoice(
        "fp32",
        "this CPU has neither AVX-512 BF16 nor AMX, so bf16 would be emulated at several times fp32's step time",
    )


class PrecisionSetting(Protocol):
    """What precision_note reads of a TrainConfig (trainer/config/load.py resolves `auto` through this module)."""

    @property
    def precision(self) -> str: ...
    @property
    def precision_choice(self) -> PrecisionChoice | None: ...


def precision_note(cfg: PrecisionSetting, device: Literal["cpu", "cuda"] | None = None) -> str:
    """One line for the start of a run: the compute precision, and why it is the one used."""
    choice = cfg.precision_choice
    if choice is not None:
        other = "fp32" if choice.precision == "bf16" else "bf16"
        return f"precision: {choice.precision} (auto: {choice.reason}; --set precision={other} to override)"
    note = f"precision: {cfg.precision} (set in the config)"
    if cfg.precision == "bf16" and (device or device_type()) == "cpu" and not native_bf16_cpu_flags():
        note += (
            "; this CPU has neither AVX-512 BF16 nor AMX and emulates bf16, several times slower than fp32 "
            "(precision: auto would choose fp32 here)"
        )
    return note
