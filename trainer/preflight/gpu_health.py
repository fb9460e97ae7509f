"""GPU health through NVML (nvidia-ml-py's pynvml): memory errors that retire pages or remap rows, uncorrectable ECC
errors, and clock slowdowns that are faults rather than normal power management.

The calls and their return values are nvidia-ml-py's (pynvml.py): nvmlDeviceGetRetiredPagesPendingStatus ->
NVML_FEATURE_ENABLED/DISABLED (pre-Ampere page retirement; NVMLError_NotSupported on A100 and newer, which remap
rows instead), nvmlDeviceGetRemappedRows -> (correctable rows, uncorrectable rows, remapping pending, remapping
failure), nvmlDeviceGetTotalEccErrors(handle, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC) -> errors since
the driver loaded, nvmlDeviceGetCurrentClocksEventReasons -> a bit mask of nvmlClocksEventReason* values. NVIDIA's
guidance (GPU Memory Error Management, "Row Remapping"): a pending remap needs a GPU reset before the row is
replaced, and a remapping failure means the GPU should be serviced.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

# Slowdowns that mean a fault (hardware slowdown, thermal, power brake); power capping, idle, application clocks
# and sync boost are normal operation.
FAULT_CLOCK_EVENTS = {
    "nvmlClocksEventReasonHwSlowdown": "hardware slowdown",
    "nvmlClocksEventReasonHwThermalSlowdown": "hardware thermal slowdown",
    "nvmlClocksEventReasonHwPowerBrakeSlowdown": "power brake slowdown",
    "nvmlClocksEventReasonSwThermalSlowdown": "software thermal slowdown",
}


@dataclass(frozen=True)
class GpuReading:
    index: int
    uuid: str
    retired_pages_pending: bool | None  # None: not supported (Ampere and newer remap rows instead)
    remapped_rows: tuple[int, int, bool, bool] | None  # (correctable, uncorrectable, pending, failure)
    uncorrectable_ecc_volatile: int | None
    clock_event_reasons: int | None


def _supported(nvml: ModuleType, call, *args):
    try:
        return call(*args)
    except nvml.NVMLError_NotSupported:
        return None


def read_gpus(nvml: ModuleType) -> list[GpuReading]:
    """One reading per GPU through `nvml` (pynvml, or a replay of recorded return values)."""
    nvml.nvmlInit()
    try:
        readings = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            pending = _supported(nvml, nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
            rows = _supported(nvml, nvml.nvmlDeviceGetRemappedRows, handle)
            readings.append(
                GpuReading(
                    index=index,
                    uuid=nvml.nvmlDeviceGetUUID(handle),
                    retired_pages_pending=None if pending is None else pending == nvml.NVML_FEATURE_ENABLED,
                    remapped_rows=None if rows is None else (rows[0], rows[1], bool(rows[2]), bool(rows[3])),
                    uncorrectable_ecc_volatile=_supported(
                        nvml,
                        nvml.nvmlDeviceGetTotalEccErrors,
                        handle,
                        nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                        nvml.NVML_VOLATILE_ECC,
                    ),
                    clock_event_reasons=_supported(nvml, nvml.nvmlDeviceGetCurrentClocksEventReasons, handle),
                )
            )
        return readings
    finally:
        nvml.nvmlShutdown()


def problems(reading: GpuReading, nvml: ModuleType) -> list[str]:
    """What makes this GPU unfit to train, one phrase each."""
    found = []
    if reading.retired_pages_pending:
        found.append("retired pages pending (needs a GPU reset)")
    if reading.remapped_rows is not None:
        _, uncorrectable, pending, failure = reading.remapped_rows
        if failure:
            found.append("row remapping failed (service the GPU)")
        if pending:
            found.append(
                f"row remapping pending after {uncorrectable} uncorrectable rows (needs a GPU reset)"
            )
    if reading.uncorrectable_ecc_volatile:
        found.append(f"{reading.uncorrectable_ecc_volatile} uncorrectable ECC errors since the driver loaded")
    if reading.clock_event_reasons:
        found += [
            text
            for name, text in FAULT_CLOCK_EVENTS.items()
            if reading.clock_event_reasons & getattr(nvml, name)
        ]
    return found
