"""What a node reports about itself: GPUs through NVML, EFA ports through sysfs, host memory through psutil.

Each reader returns plain samples `(metric, labels, value)` so that both exporters (Prometheus at scrape time,
CloudWatch at a log line) use the same values. A reader finds nothing where its hardware is absent (no NVML
library, no /sys/class/infiniband) and then returns no samples; that is the CPU laptop's case, not an error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.contract import metrics as registry

# Linux efa driver (drivers/infiniband/hw/efa/efa_verbs.c, EFA_DEFINE_PORT_STATS): port counter file -> metric.
# Older kernels lack the rdma_write_* and retrans_* files; a missing file is skipped.
EFA_PORT_COUNTERS = {
    "tx_bytes": registry.EFA_TRANSMITTED,
    "rx_bytes": registry.EFA_RECEIVED,
    "rdma_read_bytes": registry.EFA_RDMA_READ,
    "rdma_write_bytes": registry.EFA_RDMA_WRITE,
    "retrans_pkts": registry.EFA_RETRANSMITTED_PACKETS,
    "retrans_bytes": registry.EFA_RETRANSMITTED_BYTES,
    "retrans_timeout_events": registry.EFA_RETRANSMIT_TIMEOUTS,
    "rx_drops": registry.EFA_RECEIVE_DROPS,
    "unresponsive_remote_events": registry.EFA_UNRESPONSIVE_REMOTES,
    "impaired_remote_conn_events": registry.EFA_IMPAIRED_REMOTES,
}
SYSFS_INFINIBAND = Path("/sys/class/infiniband")
# EFA devices are named rdmap<bus>s<slot> (efa driver, efa_main.c ib_register_device "efa_%d" renamed by udev).
EFA_DRIVER_NAME = "efa"

# nvidia-ml-py 13.615 (pynvml.py): clock event reasons (nvmlClocksEventReason*), the ones that slow a training run.
CLOCK_EVENT_REASONS = {
    "sw_power_cap": 0x04,  # nvmlClocksEventReasonSwPowerCap
    "hw_slowdown": 0x08,  # nvmlClocksEventReasonHwSlowdown
    "sw_thermal_slowdown": 0x20,  # nvmlClocksEventReasonSwThermalSlowdown
    "hw_thermal_slowdown": 0x40,  # nvmlClocksEventReasonHwThermalSlowdown
    "hw_power_brake_slowdown": 0x80,  # nvmlClocksEventReasonHwPowerBrakeSlowdown
}


@dataclass(frozen=True)
class Sample:
    metric: registry.Metric
    labels: dict[str, str]
    value: float


def host_memory() -> list[Sample]:
    import psutil  # a trainer requirement; infra/ imports this package without it

    memory = psutil.virtual_memory()
    return [
        Sample(registry.HOST_MEMORY_USED, {}, float(memory.total - memory.available)),
        Sample(registry.HOST_MEMORY_TOTAL, {}, float(memory.total)),
    ]


def efa_ports(root: Path = SYSFS_INFINIBAND) -> list[Sample]:
    """Every EFA port's counters under `root/<device>/ports/<port>/hw_counters/`; none where EFA is absent."""
    samples = []
    for device in sorted(root.glob("*")) if root.is_dir() else ():
        if not _is_efa(device):
            continue
        for port in sorted((device / "ports").glob("*")):
            counters = port / "hw_counters"
            for file, metric in EFA_PORT_COUNTERS.items():
                path = counters / file
                if path.is_file():
                    labels = {"device": device.name, "port": port.name}
                    samples.append(Sample(metric, labels, float(path.read_text().strip())))
    return samples


def _is_efa(device: Path) -> bool:
    """The device's driver is efa (`device/driver` links to .../drivers/efa); other RDMA devices are skipped."""
    driver = device / "device" / "driver"
    return driver.exists() and driver.resolve().name == EFA_DRIVER_NAME


class Gpus:
    """NVML's view of this node's GPUs; `available` is False where the NVML library or a GPU is missing."""

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml  # nvidia-ml-py

            nvml = pynvml
        self.nvml = nvml
        try:
            nvml.nvmlInit()
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except nvml.NVMLError:
            self.handles = []

    @property
    def available(self) -> bool:
        return bool(self.handles)

    def samples(self) -> list[Sample]:
        return [
            sample for index, handle in enumerate(self.handles) for sample in self._gpu(str(index), handle)
        ]

    def _gpu(self, gpu: str, handle: Any) -> Iterator[Sample]:
        nvml, labels = self.nvml, {"gpu": gpu}
        for read in (self._usage, self._ecc, self._remapped_rows, self._clock_events):
            # A reading the GPU lacks (ECC or row remapping on some models) gives no sample; it is not an error.
            with contextlib.suppress(nvml.NVMLError_NotSupported):
                yield from read(handle, labels)

    def _usage(self, handle: Any, labels: dict[str, str]) -> Iterator[Sample]:
        nvml = self.nvml
        utilization = nvml.nvmlDeviceGetUtilizationRates(handle)  # c_nvmlUtilization_t: percent
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)  # c_nvmlMemory_t: bytes
        yield Sample(registry.GPU_UTILIZATION, labels, utilization.gpu / 100)
        yield Sample(registry.GPU_MEMORY_USED, labels, float(memory.used))
        yield Sample(registry.GPU_MEMORY_TOTAL, labels, float(memory.total))
        yield Sample(registry.GPU_POWER, labels, nvml.nvmlDeviceGetPowerUsage(handle) / 1000)  # milliwatts
        temperature = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        yield Sample(registry.GPU_TEMPERATURE, labels, float(temperature))

    def _ecc(self, handle: Any, labels: dict[str, str]) -> Iterator[Sample]:
        nvml = self.nvml
        for kind, error_type in (
            ("corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            count = nvml.nvmlDeviceGetTotalEccErrors(handle, error_type, nvml.NVML_VOLATILE_ECC)
            yield Sample(registry.GPU_ECC_ERRORS, {**labels, "type": kind}, float(count))

    def _remapped_rows(self, handle: Any, labels: dict[str, str]) -> Iterator[Sample]:
        corrected, uncorrected, pending, failed = self.nvml.nvmlDeviceGetRemappedRows(handle)
        yield Sample(registry.GPU_REMAPPED_ROWS, {**labels, "type": "correctable"}, float(corrected))
        yield Sample(registry.GPU_REMAPPED_ROWS, {**labels, "type": "uncorrectable"}, float(uncorrected))
        yield Sample(registry.GPU_ROW_REMAP_PENDING, labels, float(bool(pending)))
        yield Sample(registry.GPU_ROW_REMAP_FAILED, labels, float(bool(failed)))

    def _clock_events(self, handle: Any, labels: dict[str, str]) -> Iterator[Sample]:
        reasons = self.nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
        for reason, bit in CLOCK_EVENT_REASONS.items():
            yield Sample(registry.GPU_THROTTLED, {**labels, "reason": reason}, float(bool(reasons & bit)))


class NodeReaders:
    """Everything this node reports; built once per process (NVML is initialised once)."""

    def __init__(self, gpus: Gpus | None = None, sysfs: Path = SYSFS_INFINIBAND) -> None:
        self.gpus = gpus if gpus is not None else Gpus()
        self.sysfs = sysfs

    def samples(self) -> list[Sample]:
        return [*host_memory(), *self.gpus.samples(), *efa_ports(self.sysfs)]
