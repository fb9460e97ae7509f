"""The node readers on fixtures built from their sources (tests/monitoring/fixtures.py), and on this machine."""

from __future__ import annotations

import pynvml
import pytest

from tests.monitoring.fixtures import (
    EFA_PORT_COUNTER_FILES,
    OLD_EFA_PORT_COUNTER_FILES,
    efa_sysfs,
    fake_nvml,
    h100,
)
from trainer.contract import metrics as r
from trainer.monitoring.node import EFA_PORT_COUNTERS, Gpus, NodeReaders, efa_ports, host_memory


def by_metric(samples):
    return {(s.metric.name, tuple(sorted(s.labels.items()))): s.value for s in samples}


def test_efa_counters_we_export_are_ones_the_driver_creates():
    assert set(EFA_PORT_COUNTERS) <= set(EFA_PORT_COUNTER_FILES)


def test_efa_ports_read_every_counter_of_efa_devices_only(tmp_path):
    counters = {name: 1000 + i for i, name in enumerate(EFA_PORT_COUNTER_FILES)}
    root = efa_sysfs(
        tmp_path,
        {
            "rdmap16s27": ("efa", counters),
            "rdmap32s27": ("efa", {name: 7 for name in OLD_EFA_PORT_COUNTER_FILES}),  # an older kernel
            "mlx5_0": ("mlx5_core", {"tx_bytes": 5}),  # not EFA: skipped
        },
    )
    found = by_metric(efa_ports(root))
    port = (("device", "rdmap16s27"), ("port", "1"))
    assert found[r.EFA_TRANSMITTED.name, port] == counters["tx_bytes"]
    assert found[r.EFA_RETRANSMITTED_PACKETS.name, port] == counters["retrans_pkts"]
    assert found[r.EFA_UNRESPONSIVE_REMOTES.name, port] == counters["unresponsive_remote_events"]
    assert len([k for k in found if k[1] == port]) == len(EFA_PORT_COUNTERS)
    old = [name for name, labels in found if dict(labels)["device"] == "rdmap32s27"]
    assert sorted(old) == sorted(
        EFA_PORT_COUNTERS[f].name for f in EFA_PORT_COUNTERS if f in OLD_EFA_PORT_COUNTER_FILES
    )
    assert not any(dict(labels)["device"] == "mlx5_0" for _, labels in found)


def test_no_infiniband_directory_means_no_efa_samples(tmp_path):
    assert efa_ports(tmp_path / "absent") == []


def test_gpu_samples_in_base_units():
    gpus = Gpus(fake_nvml(h100(), h100(clock_events=0x40 | 0x04, remapped_rows=(3, 1, 1, 0))))
    found = by_metric(gpus.samples())
    gpu0, gpu1 = (("gpu", "0"),), (("gpu", "1"),)
    assert found[r.GPU_UTILIZATION.name, gpu0] == 0.97
    assert found[r.GPU_POWER.name, gpu0] == 612.345
    assert found[r.GPU_MEMORY_USED.name, gpu0] == 70_000 * 2**20
    assert found[r.GPU_TEMPERATURE.name, gpu0] == 64
    assert found[r.GPU_ECC_ERRORS.name, (("gpu", "0"), ("type", "corrected"))] == 2
    assert found[r.GPU_REMAPPED_ROWS.name, (("gpu", "1"), ("type", "uncorrectable"))] == 1
    assert found[r.GPU_ROW_REMAP_PENDING.name, gpu1] == 1
    throttled = {dict(k[1])["reason"] for k, v in found.items() if k[0] == r.GPU_THROTTLED.name and v == 1}
    assert throttled == {"hw_thermal_slowdown", "sw_power_cap"}  # 0x40 | 0x04 (nvmlClocksEventReason*)


def test_a_reading_the_gpu_lacks_is_left_out_not_fatal():
    no_ecc = h100()
    del no_ecc["ecc"], no_ecc["remapped_rows"]
    found = by_metric(Gpus(fake_nvml(no_ecc)).samples())
    assert not any(name in (r.GPU_ECC_ERRORS.name, r.GPU_REMAPPED_ROWS.name) for name, _ in found)
    assert found[r.GPU_TEMPERATURE.name, (("gpu", "0"),)] == 64


def test_without_the_nvml_library_there_are_no_gpus():
    try:
        pynvml.nvmlInit()
        pytest.skip("this machine has NVML; test_real_nvml_when_present covers it")
    except pynvml.NVMLError_LibraryNotFound:
        pass
    gpus = Gpus()
    assert not gpus.available and gpus.samples() == []


def test_real_nvml_when_present():
    """On a GPU machine (make bench-gpu's, the image on p5): every GPU reports its usage through the real NVML."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        pytest.skip(f"no NVML here ({error}); runs on GPU machines")
    gpus = Gpus()
    found = by_metric(gpus.samples())
    count = pynvml.nvmlDeviceGetCount()
    assert {dict(labels)["gpu"] for name, labels in found if name == r.GPU_MEMORY_TOTAL.name} == {
        str(i) for i in range(count)
    }
    assert all(0 <= v <= 1 for (name, _), v in found.items() if name == r.GPU_UTILIZATION.name)


def test_host_memory_is_in_bytes_and_below_the_total():
    found = {s.metric: s.value for s in host_memory()}
    assert 0 < found[r.HOST_MEMORY_USED] < found[r.HOST_MEMORY_TOTAL]


def test_node_readers_combine_all_sources(tmp_path):
    root = efa_sysfs(tmp_path, {"rdmap16s27": ("efa", {"tx_bytes": 9})})
    samples = NodeReaders(Gpus(fake_nvml(h100())), root).samples()
    assert {s.metric for s in samples} >= {r.HOST_MEMORY_USED, r.GPU_UTILIZATION, r.EFA_TRANSMITTED}
