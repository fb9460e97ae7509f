"""Which device a machine trains on, asked of torch only where a GPU driver's device file exists (trainer/device.py),
and the `train` command that needs neither torch nor megatron-core before its data checks."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from trainer import device


def _in_a_fresh_interpreter(code: str) -> str:
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_without_a_gpu_driver_the_answer_is_cpu_and_torch_is_not_imported():
    # This machine has no GPU driver's device file (the suite's CI and laptops): asserted, not assumed.
    assert not device.gpu_driver_present()
    code = (
        "import sys; from trainer import device; "
        "print(device.device_type(), device.gpu_count(), 'torch' in sys.modules)"
    )
    assert _in_a_fresh_interpreter(code) == "cpu 0 False"


def test_with_a_gpu_driver_file_torch_decides(monkeypatch, tmp_path):
    import torch

    (tmp_path / "nvidiactl").touch()
    monkeypatch.setattr(device, "GPU_DRIVER_FILES", (str(tmp_path / "nvidiactl"),))
    device.gpu_driver_present.cache_clear()  # looked up once a process: again for this stand-in, and after it
    try:
        assert device.gpu_driver_present()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
        assert (device.device_type(), device.gpu_count()) == ("cuda", 8)
        # a driver, but no GPU for this process (CUDA_VISIBLE_DEVICES="", say)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        assert (device.device_type(), device.gpu_count()) == ("cpu", 0)
    finally:
        device.gpu_driver_present.cache_clear()


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["train", "--help"], 0),
        # refused at its config's checks (4 attention heads over TP=3): one message, exit 2
        (
            [
                "train",
                "--config",
                "tests/support/tiny.yaml",
                "--set",
                "parallel.tensor_model_parallel_size=3",
            ],
            2,
        ),
    ],
)
def test_the_train_command_imports_neither_torch_nor_megatron_before_its_data_checks(argv, status):
    code = (
        "import contextlib, io, sys\n"
        "from trainer.__main__ import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "    try:\n"
        f"        status = main({argv!r})\n"
        "    except SystemExit as exit:\n"
        "        status = exit.code\n"
        "print(status, 'torch' in sys.modules, 'megatron.core' in sys.modules)\n"
    )
    assert _in_a_fresh_interpreter(code) == f"{status} False False"
