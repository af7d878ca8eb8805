"""Local GPU telemetry through NVML (nvidia-ml-py) for a node agent.

Reads the same quantities dcgm-exporter exports (docs/sources.md §1) straight from
the driver. Without a driver or a GPU it degrades cleanly: one clear log line, a Frame
with every GPU signal missing (NaN) and a flag saying why — never an exception into the
controller. XID events need an NVML event set and a waiting thread; they are not read
here (dcgm-exporter's DCGM_FI_DEV_XID_ERRORS covers them), which the flags state.
"""

from __future__ import annotations

import logging

import numpy as np

from seamguard.fleet.model import Fleet, Kind
from seamguard.observe.frame import Frame, make_frame

log = logging.getLogger("seamguard.observe.nvml")

_SIGNALS = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_THERMAL_VIOLATION")


def open_nvml() -> tuple[object | None, list[object], str]:
    """(pynvml, handle per GPU index, "") or (None, [], why not): never raises.

    Shared by ``NvmlSource`` and the node agent (seamguard.agent).
    """
    try:
        import pynvml  # nvidia-ml-py (extra `nvml`)
    except ImportError:
        return None, [], "nvidia-ml-py is not installed (pip install 'seamguard[nvml]')"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # pynvml.NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, [], f"NVML unavailable: {e}"
    try:
        return pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())], ""
    except Exception as e:
        close_nvml(pynvml)
        return None, [], f"NVML unavailable: {e}"


def close_nvml(nvml: object | None) -> None:
    if nvml is not None:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def pci_bus_id(nvml, h) -> str:
    """The GPU's PCI address as the kernel log writes it ('0000:3b:00.0'); '' when unknown."""
    try:
        raw = nvml.nvmlDeviceGetPciInfo(h).busId
        raw = raw.decode() if isinstance(raw, bytes) else str(raw)
    except Exception:
        return ""
    dom, _, rest = raw.lower().partition(":")  # NVML pads the domain to 8 digits: '00000000:3B:00.0'
    return f"{dom[-4:]}:{rest}" if rest else ""


def read_gpu(nvml, h) -> dict[str, float]:
    """The dcgm-exporter quantities of one GPU; a field this GPU/driver does not support is NaN."""
    n = nvml
    out: dict[str, float] = {}

    def get(name: str, fn) -> None:
        try:
            out[name] = float(fn())
        except Exception:  # unsupported on this GPU/driver: leave it missing
            out[name] = np.nan

    get("DCGM_FI_DEV_GPU_TEMP", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
    get("DCGM_FI_DEV_SM_CLOCK", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))
    get("DCGM_FI_DEV_POWER_USAGE", lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0)  # mW -> W
    get("DCGM_FI_DEV_GPU_UTIL", lambda: n.nvmlDeviceGetUtilizationRates(h).gpu)
    get("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", lambda: n.nvmlDeviceGetTotalEccErrors(
        h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC))
    get("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", lambda: n.nvmlDeviceGetRemappedRows(h)[0])
    get("DCGM_FI_DEV_THERMAL_VIOLATION", lambda: n.nvmlDeviceGetViolationStatus(
        h, n.NVML_PERF_POLICY_THERMAL).violationTime)
    return out


class NvmlSource:
    """GPUs of ``node`` (fleet name) read through NVML, GPU i -> '<node>/gpu<i>'."""

    def __init__(self, fleet: Fleet, node: str) -> None:
        self.fleet = fleet
        self.node = node
        self.handles: list[tuple[int, object]] = []
        self.nvml, handles, self.error = open_nvml()
        try:
            for i, h in enumerate(handles):
                self.handles.append((fleet.index_of(Kind.GPU, f"{node}/gpu{i}"), h))
        except KeyError as e:
            self.error = f"NVML GPU not in the fleet: {e}"
        if self.error:
            log.warning("nvml source on %s: %s; GPU signals will be missing", node, self.error)

    def read(self, t_s: float) -> Frame:
        n_g = self.fleet.count(Kind.GPU)
        values = {s: np.full(n_g, np.nan) for s in _SIGNALS}
        if self.error:
            return make_frame(self.fleet, t_s, values, (f"nvml: {self.error}",))
        for idx, h in self.handles:
            for name, v in read_gpu(self.nvml, h).items():
                values[name][idx] = v
        return make_frame(self.fleet, t_s, values, ("nvml: XID events not read (use dcgm-exporter)",))

    def close(self) -> None:
        close_nvml(self.nvml)
        self.nvml = None
