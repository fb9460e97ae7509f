"""`precision: auto`: bf16 only where the machine computes it natively, said in the run's first lines; an explicit
precision is kept as written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.config import ConfigError, load_config, precision
from trainer.config.precision import choose_precision, native_bf16_cpu_flags, precision_note

CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"
LOCAL = CONFIGS / "local.yaml"


def cpuinfo_flags() -> set[str]:
    """The kernel's own list (/proc/cpuinfo), the other source that names these features."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.fixture
def cpu_with(monkeypatch):
    """This machine's torch.cpu capabilities with the native-bf16 features set as given (the other kind of CPU)."""

    def set_flags(*flags: str) -> None:
        real = dict(torch.cpu.get_capabilities())
        changed = {**real, **{flag: flag in flags for flag in precision.NATIVE_BF16_CPU_FLAGS}}
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: changed)

    return set_flags


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="/proc/cpuinfo is Linux's")
def test_torch_sees_the_same_native_bf16_features_as_the_kernel():
    assert set(native_bf16_cpu_flags()) == cpuinfo_flags() & set(precision.NATIVE_BF16_CPU_FLAGS)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ((), "fp32"),
        (("avx512_bf16",), "bf16"),
        (("amx_bf16",), "bf16"),
        (("avx512_bf16", "amx_bf16"), "bf16"),
    ],
)
def test_auto_on_cpu_is_bf16_only_with_avx512_bf16_or_amx(cpu_with, flags, expected):
    cpu_with(*flags)

    cfg = load_config(LOCAL, device="cpu")

    assert cfg.precision == expected
    assert cfg.precision_choice.precision == expected
    note = precision_note(cfg, "cpu")
    assert note.startswith(f"precision: {expected} (auto: ")
    assert all(flag in note for flag in flags)
    if not flags:
        assert "neither AVX-512 BF16 nor AMX" in note and "--set precision=bf16 to override" in note


def test_auto_on_this_machine_follows_its_cpu_flags():
    native = (
        bool(cpuinfo_flags() & set(precision.NATIVE_BF16_CPU_FLAGS))
        if Path("/proc/cpuinfo").exists()
        else None
    )
    cfg = load_config(LOCAL)  # what `make train` does
    if native is not None and not torch.cuda.is_available():
        assert cfg.precision == ("bf16" if native else "fp32")
    assert precision_note(cfg).startswith(f"precision: {cfg.precision} (auto: ")


@pytest.mark.parametrize("value", ["bf16", "fp32"])
def test_an_explicit_precision_is_kept_on_any_cpu(cpu_with, value):
    cpu_with()  # no native bf16

    cfg = load_config(LOCAL, [f"precision={value}"], device="cpu")

    assert cfg.precision == value and cfg.precision_choice is None
    assert precision_note(cfg, "cpu").startswith(f"precision: {value} (set in the config)")


def test_explicit_bf16_on_a_cpu_that_emulates_it_says_so(cpu_with):
    cpu_with()
    assert "emulates bf16" in precision_note(load_config(LOCAL, ["precision=bf16"]), "cpu")
    cpu_with("amx_bf16")
    assert "emulates" not in precision_note(load_config(LOCAL, ["precision=bf16"]), "cpu")


def test_planning_for_the_cluster_from_a_cpu_machine_chooses_bf16():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: choose_precision asks it instead")
    assert choose_precision("cuda").precision == "bf16"
    assert load_config(LOCAL, device="cuda").precision == "bf16"


def test_local_config_says_auto_and_production_configs_say_bf16():
    assert "\nprecision: auto" in LOCAL.read_text()
    for name in ("llama3-8b.yaml", "llama3-70b.yaml", "bench-gpu.yaml"):
        assert "\nprecision: bf16" in (CONFIGS / name).read_text()
        assert load_config(CONFIGS / name).precision_choice is None


def test_a_bad_precision_names_the_key_and_every_valid_value():
    with pytest.raises(ConfigError) as error:
        load_config(LOCAL, ["precision=bf8"])
    message = str(error.value)
    assert "precision = 'bf8'" in message and all(value in message for value in ("bf16", "fp32", "auto"))
    assert str(LOCAL) in message
