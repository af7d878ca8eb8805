"""The series a scenario writes: real exporter names, their entity kind and how to print them.

Names follow what dcgm-exporter and node_exporter's infiniband collector expose (the
public field lists in docs/sources.md §1); the ones seamguard reads are taken from its
signal registry so the two can never drift apart by a typo. Many series here are ones
the detector may not read at all (PCIe replays, NVLink CRC, row-remap state, power
violation, link error recovery): a real fleet exports them whether or not anyone looks.

Only names and label conventions come from ``seamguard.observe``; nothing about how a
signal is judged does.
"""

from __future__ import annotations

from dataclasses import dataclass

from seamguard.fleet.model import Kind
from seamguard.observe.signals import REGISTRY
from seamguard.scenarios.shifted import SXID_SERIES


def _known(name: str) -> str:
    assert name in REGISTRY, name  # seamguard reads it: the registry is the spelling
    return name


@dataclass(frozen=True)
class Series:
    name: str
    kind: Kind
    exporter: str  # which exporter serves it: "dcgm", "node", "agent", "facility", "probe", "storage", "runtime"
    integer: bool = False  # printed as a whole number (counters, temperatures, states)
    help: str = ""
    family: str = ""  # the exported name when several series share one family (their labels tell them apart)
    labels: tuple[tuple[str, str], ...] = ()  # constant labels of this series within its family

    @property
    def exported(self) -> str:
        return self.family or self.name


G, N, L, C, R, S, J, ND = (Kind.GPU, Kind.NIC, Kind.LINK, Kind.COOLING_LOOP, Kind.RACK, Kind.STORAGE, Kind.JOB,
                           Kind.NODE)

SERIES: tuple[Series, ...] = (
    # dcgm-exporter (default and DCP field lists)
    Series(_known("DCGM_FI_DEV_GPU_TEMP"), G, "dcgm", True, "GPU temperature (C)"),
    Series("DCGM_FI_DEV_MEMORY_TEMP", G, "dcgm", True, "HBM temperature (C)"),
    Series(_known("DCGM_FI_DEV_SM_CLOCK"), G, "dcgm", True, "SM clock (MHz)"),
    Series(_known("DCGM_FI_DEV_POWER_USAGE"), G, "dcgm", False, "power draw (W)"),
    Series(_known("DCGM_FI_DEV_GPU_UTIL"), G, "dcgm", True, "GPU utilization (%)"),
    Series(_known("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"), G, "dcgm", True, "single-bit volatile ECC errors"),
    Series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", G, "dcgm", True, "double-bit volatile ECC errors"),
    Series(_known("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"), G, "dcgm", True, "rows remapped for correctable errors"),
    Series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", G, "dcgm", True, "rows remapped for uncorrectable errors"),
    Series("DCGM_FI_DEV_ROW_REMAP_PENDING", G, "dcgm", True, "a row remap waits for a GPU reset"),
    Series("DCGM_FI_DEV_ROW_REMAP_FAILURE", G, "dcgm", True, "a row remap failed"),
    Series(_known("DCGM_FI_DEV_XID_ERRORS"), G, "dcgm", True, "value of the last XID error"),
    Series("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", G, "dcgm", True, "PCIe replays"),
    Series("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", G, "dcgm", True, "NVLink flow-control CRC errors"),
    Series("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", G, "dcgm", True, "NVLink replays"),
    Series("DCGM_FI_DEV_PCIE_LINK_GEN", G, "dcgm", True, "PCIe link generation"),
    Series("DCGM_FI_DEV_PCIE_LINK_WIDTH", G, "dcgm", True, "PCIe link width (lanes)"),
    Series(_known("DCGM_FI_DEV_THERMAL_VIOLATION"), G, "dcgm", True, "throttled for thermal limits (us)"),
    Series("DCGM_FI_DEV_POWER_VIOLATION", G, "dcgm", True, "throttled for power limits (us)"),
    # the training runtime's own per-rank and per-job progress
    Series(_known("seamguard_rank_compute_seconds"), G, "runtime", False, "last step's compute time (s)"),
    Series(_known("seamguard_job_step_seconds"), J, "runtime", False, "last step's wall time (s)"),
    # node_exporter infiniband collector
    Series(_known("node_infiniband_state_id"), N, "node", True, "port state (4 = ACTIVE)"),
    Series("node_infiniband_physical_state_id", N, "node", True, "physical state (5 = LinkUp)"),
    Series(_known("node_infiniband_link_downed_total"), N, "node", True, "link down events"),
    Series("node_infiniband_link_error_recovery_total", N, "node", True, "link error recoveries"),
    Series(_known("node_infiniband_symbol_error_total"), N, "node", True, "symbol errors"),
    Series(_known("node_infiniband_port_transmit_wait_total"), N, "node", True, "ticks waiting for credits"),
    Series("node_infiniband_port_errors_received_total", N, "node", True, "received packets with errors"),
    # node_exporter edac collector (held-out histories only)
    Series("node_edac_correctable_errors_total", ND, "node", True, "correctable memory errors"),
    Series("node_edac_uncorrectable_errors_total", ND, "node", True, "uncorrectable memory errors"),
    # the node agent (held-out histories only): its roster gauge and kernel-log NVSwitch SXid counter
    Series("seamguard_agent_info", ND, "agent", True, "the node agent runs here"),
    *(Series(name, ND, "agent", True, "NVSwitch SXID lines in the kernel log", family="seamguard_sxid_errors_total",
             labels=(("pci_bus_id", "0000:05:00.0"), ("severity", sev), ("sxid", code)))
      for name, code, sev in SXID_SERIES),
    # fabric probes, facilities, storage (seamguard's documented names)
    Series(_known("seamguard_fabric_link_latency_us"), L, "probe", False, "probe round trip (us)"),
    Series(_known("seamguard_coolant_flow_lpm"), C, "facility", False, "coolant flow (l/min)"),
    Series(_known("seamguard_coolant_supply_temp_c"), C, "facility", False, "coolant supply temperature (C)"),
    Series(_known("seamguard_coolant_return_temp_c"), C, "facility", False, "coolant return temperature (C)"),
    Series(_known("seamguard_rack_inlet_temp_c"), R, "facility", False, "rack coolant inlet temperature (C)"),
    Series(_known("seamguard_storage_write_latency_ms"), S, "storage", False, "p99 checkpoint write latency (ms)"),
)

BY_NAME: dict[str, Series] = {s.name: s for s in SERIES}
