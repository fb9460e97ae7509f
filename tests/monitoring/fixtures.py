"""Node fixtures built from their sources: an EFA sysfs tree with the Linux efa driver's port counter names, and
NVML answers in nvidia-ml-py's own return types."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pynvml

# Linux drivers/infiniband/hw/efa/efa_verbs.c, EFA_DEFINE_PORT_STATS (with the rdma_write_* and network stats the
# driver added later): every port counter file a current kernel creates under ports/<n>/hw_counters/.
EFA_PORT_COUNTER_FILES = (
    "tx_bytes", "tx_pkts", "rx_bytes", "rx_pkts", "rx_drops", "send_bytes", "send_wrs", "recv_bytes", "recv_wrs",
    "rdma_read_wrs", "rdma_read_bytes", "rdma_read_wr_err", "rdma_read_resp_bytes", "rdma_write_wrs",
    "rdma_write_bytes", "rdma_write_wr_err", "rdma_write_recv_bytes", "retrans_bytes", "retrans_pkts",
    "retrans_timeout_events", "unresponsive_remote_events", "impaired_remote_conn_events",
)  # fmt: skip
# The older driver (before rdma_write and network stats): only the first 13.
OLD_EFA_PORT_COUNTER_FILES = EFA_PORT_COUNTER_FILES[:13]


def efa_sysfs(root: Path, devices: dict[str, tuple[str, dict[str, int]]]) -> Path:
    """`/sys/class/infiniband` as the kernel lays it out: <dev>/device/driver -> .../drivers/<driver>,
    <dev>/ports/1/hw_counters/<counter> holding the value and a newline."""
    infiniband = root / "class" / "infiniband"
    for name, (driver, counters) in devices.items():
        drivers = root / "bus" / "pci" / "drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        device = infiniband / name / "device"
        device.mkdir(parents=True)
        (device / "driver").symlink_to(drivers)
        hw_counters = infiniband / name / "ports" / "1" / "hw_counters"
        hw_counters.mkdir(parents=True)
        for counter, value in counters.items():
            (hw_counters / counter).write_text(f"{value}\n")
    return infiniband


class FakeNvml(SimpleNamespace):
    """pynvml's interface over recorded answers: its constants and error classes, its ctypes structures.

    `gpus` holds per GPU: utilization (c_nvmlUtilization_t, percent), memory (c_nvmlMemory_t, bytes), power
    (milliwatts), temperature (C), ecc {(error type, counter type): count}, remapped_rows (corrected,
    uncorrected, pending, failure) and clock event reasons (bitmask); a missing key raises NVMLError_NotSupported.
    """

    def __init__(self, gpus: list[dict]) -> None:
        super().__init__(
            **{name: getattr(pynvml, name) for name in dir(pynvml) if name.startswith(("NVML_", "NVMLError"))}
        )
        self.gpus = gpus

    def _get(self, handle, key):
        if key not in self.gpus[handle]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.gpus[handle][key]

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetUtilizationRates(self, handle):
        return self._get(handle, "utilization")

    def nvmlDeviceGetMemoryInfo(self, handle):
        return self._get(handle, "memory")

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._get(handle, "power_mw")

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._get(handle, "temperature")

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter_type):
        return self._get(handle, "ecc")[error_type, counter_type]

    def nvmlDeviceGetRemappedRows(self, handle):
        return self._get(handle, "remapped_rows")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self._get(handle, "clock_events")


def h100(**changes) -> dict:
    """One H100 80GB HBM3 under load, in NVML's types (81559 MiB as nvidia-smi reports its memory)."""
    total = 81559 * 2**20
    gpu = {
        "utilization": pynvml.c_nvmlUtilization_t(gpu=97, memory=61),
        "memory": pynvml.c_nvmlMemory_t(total=total, free=total - 70_000 * 2**20, used=70_000 * 2**20),
        "power_mw": 612_345,
        "temperature": 64,
        "ecc": {
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC): 2,
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 0,
        },
        "remapped_rows": (0, 0, 0, 0),
        "clock_events": pynvml.nvmlClocksEventReasonNone,
    }
    return {**gpu, **changes}


def fake_nvml(*gpus: dict) -> SimpleNamespace:
    return FakeNvml(list(gpus))


def emf_to_cloudwatch(cloudwatch, lines: list[str]) -> None:
    """What CloudWatch Logs does with EMF lines (the specification's extraction): each metric of each directive,
    under each dimension set, becomes datapoints of the values on the root."""
    for document in map(json.loads, lines):
        aws = document["_aws"]
        for directive in aws["CloudWatchMetrics"]:
            for dimension_set in directive["Dimensions"]:
                for definition in directive["Metrics"]:
                    value = document[definition["Name"]]
                    cloudwatch.put_metric_data(
                        Namespace=directive["Namespace"],
                        MetricData=[
                            {
                                "MetricName": definition["Name"],
                                "Dimensions": [{"Name": k, "Value": document[k]} for k in dimension_set],
                                "Timestamp": datetime.fromtimestamp(aws["Timestamp"] / 1000, UTC),
                                "Values": value if isinstance(value, list) else [value],
                                "Unit": definition["Unit"],
                            }
                        ],
                    )
