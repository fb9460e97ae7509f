"""Which device this machine trains on, asked of torch only where a GPU could be present.

Importing torch takes 1.2 to 1.5 CPU seconds; the `train` command outside torchrun (the supervisor: checks, then
torchrun) and every sweep trial's supervisor ask this on machines with no GPU at all. Without the GPU driver's device
files no CUDA (or ROCm) device exists, so the answer is "cpu" without torch; with any of them, torch decides.
"""

from __future__ import annotations

import functools
import os
from typing import Literal

# CUDA needs the NVIDIA driver's device files, /dev/nvidiactl among them (CUDA Installation Guide for Linux,
# docs.nvidia.com/cuda/cuda-installation-guide-linux/#device-node-verification); under WSL 2 it goes through
# /dev/dxg instead (CUDA on WSL User Guide); ROCm builds of torch answer torch.cuda for AMD GPUs, whose kernel driver
# is /dev/kfd (ROCm docs, "Running ROCm Docker containers": --device=/dev/kfd).
GPU_DRIVER_FILES = ("/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


@functools.cache
def gpu_driver_present() -> bool:
    """Looked up once a process: the loop asks `device_type` every step, and the driver does not come and go."""
    return any(os.path.exists(path) for path in GPU_DRIVER_FILES)


def device_type() -> Literal["cpu", "cuda"]:
    if not gpu_driver_present():
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def gpu_count() -> int:
    """GPUs this process may use (0 on CPU)."""
    if device_type() == "cpu":
        return 0
    import torch

    return torch.cuda.device_count()
