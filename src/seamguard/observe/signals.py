"""The signal registry: every signal seamguard reads, with unit, domain and direction.

Names are the real exporter names (dcgm-exporter, node_exporter's infiniband collector)
where a standard exists (docs/sources.md §1) and seamguard's own documented names
(`seamguard_*`) where none does (facilities, storage paths, runtime progress), so a
Prometheus source and the twin fill the same frame. A signal that is an aggregate of an
exporter's series (the node agent's per-controller EDAC counts summed per node, its
kernel-log XID counts joined onto their GPU) carries its default PromQL in ``query``;
what each one means and how it is judged: docs/evidence.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from seamguard.fleet.model import Kind


class Domain(str, Enum):
    FACILITIES = "facilities"
    COMPUTE = "compute"
    FABRIC = "fabric"
    STORAGE = "storage"
    RUNTIME = "runtime"
    ECONOMICS = "economics"


@dataclass(frozen=True)
class Signal:
    """One signal: a float per entity of ``kind`` per frame."""

    name: str
    kind: Kind
    unit: str
    domain: Domain
    direction: int  # +1: higher is worse, -1: lower is worse, 0: context only
    counter: bool = False  # monotonically increasing; assess uses rates, never levels
    help: str = ""
    query: str = ""  # default PromQL when the signal is not one series per entity; "{sel}" takes the selector
    # False: only some entities report it by design (the node agent runs where it is deployed;
    # a path has probers only where an agent probes it), so a share missing is no input failure.
    coverage_judged: bool = True


# NVIDIA's XID catalogue (docs/sources.md §1): fatal XIDs end the GPU's usefulness until a
# reset; warning ones announce that a fatal one is coming. Shared by the default queries
# below (kernel-log XIDs by class) and the assessment (DCGM's last-XID gauge).
FATAL_XIDS = (48, 74, 79, 94, 95, 119, 120)
WARNING_XIDS = (63, 64, 92)


def _codes(codes: tuple[int, ...]) -> str:
    return "|".join(str(c) for c in codes)


# The agent's kernel-log counters carry `node` and the GPU's PCI address; its
# DCGM_FI_DEV_XID_ERRORS gauge carries `Hostname`, `gpu` and the same address (kernel
# form, lower case, 4-digit domain; dcgm-exporter's own gauge writes 8 digits and never
# matches). The join puts each kernel-log count on its GPU; `or ... 0 *` reports 0 for
# every GPU the agent maps, so a first event is an increase from 0, not a series appearing.
_AGENT_GPUS = 'DCGM_FI_DEV_XID_ERRORS{pci_bus_id=~"[0-9a-f]{4}:.+"{sel}}'


def _per_gpu(counts: str) -> str:
    return (f'(sum by (Hostname, gpu) (label_replace({counts}, "Hostname", "$1", "node", "(.+)") '
            f'* on (Hostname, pci_bus_id) group_left (gpu) group by (Hostname, pci_bus_id, gpu) ({_AGENT_GPUS}))) '
            f'or (0 * group by (Hostname, gpu) ({_AGENT_GPUS}))')


def _per_node(counts: str, agg: str = "sum") -> str:
    return f'({agg} by (node) ({counts})) or (0 * group by (node) (seamguard_agent_info{{node!=""{{sel}}}}))'


def _host_counts(name: str) -> str:
    """``name``'s per-controller counts with a `node` label whoever exports them.

    The agent labels its host series `node`; node_exporter's edac collector has only the
    scrape target's `instance` (``host.domain:9100``), which names the same node once port and
    domain are dropped, as the default mapping does for every node-level series
    (observe/prommap.py). Where both export a controller, one copy counts (`max`), not the sum.
    """
    return f'max by (node, controller, csrow) ({_node_named(name)})'


def _node_named(name: str) -> str:
    """``name``'s series, node_exporter's (only `instance`) given the `node` the mapping reads."""
    theirs = f'label_replace({name}{{node=""{{sel}}}}, "node", "$1", "instance", "([^.:]+)[^:]*(:[0-9]+)?")'
    return f'{name}{{node!=""{{sel}}}} or {theirs}'


def _host_value(name: str) -> str:
    """One value per node of a host series the agent and node_exporter may both export (the
    same kernel counter: the two copies are equal, and one is kept, not reported twice)."""
    return f'max by (node) ({_node_named(name)})'


_G, _N, _L, _C, _R, _S, _J = Kind.GPU, Kind.NIC, Kind.LINK, Kind.COOLING_LOOP, Kind.RACK, Kind.STORAGE, Kind.JOB
_NO = Kind.NODE
F, C, FB, ST, RT = Domain.FACILITIES, Domain.COMPUTE, Domain.FABRIC, Domain.STORAGE, Domain.RUNTIME

SIGNALS: tuple[Signal, ...] = (
    # dcgm-exporter
    Signal("DCGM_FI_DEV_GPU_TEMP", _G, "celsius", C, +1, help="GPU die temperature"),
    Signal("DCGM_FI_DEV_SM_CLOCK", _G, "MHz", C, -1, help="SM clock"),
    Signal("DCGM_FI_DEV_POWER_USAGE", _G, "watts", C, 0, help="board power draw"),
    Signal("DCGM_FI_DEV_GPU_UTIL", _G, "percent", C, 0, help="GPU utilisation"),
    Signal("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", _G, "errors", C, +1, counter=True,
           help="volatile single-bit (correctable) ECC errors"),
    Signal("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", _G, "rows", C, +1, counter=True,
           help="HBM rows remapped after correctable errors"),
    Signal("DCGM_FI_DEV_XID_ERRORS", _G, "xid", C, +1,
           help="value of the last XID error (a gauge: changes matter, not levels)"),
    Signal("DCGM_FI_DEV_THERMAL_VIOLATION", _G, "us", C, +1, counter=True,
           help="time spent clock-limited by thermal constraints"),
    Signal("DCGM_FI_DEV_POWER_VIOLATION", _G, "us", C, +1, counter=True,
           help="time spent clock-limited by power constraints"),
    Signal("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", _G, "replays", C, +1, counter=True,
           help="PCIe retries (replays) of the GPU's link"),
    Signal("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", _G, "errors", C, +1, counter=True,
           help="NVLink flow-control CRC errors, all links"),
    Signal("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", _G, "errors", C, +1, counter=True,
           help="NVLink data CRC errors, all links"),
    Signal("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", _G, "errors", C, +1, counter=True,
           help="NVLink retries, all links"),
    Signal("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", _G, "errors", C, +1, counter=True,
           help="NVLink recovery errors, all links"),
    Signal("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", _G, "errors", C, +1, counter=True,
           help="volatile double-bit (uncorrectable) ECC errors"),
    Signal("DCGM_FI_DEV_RETIRED_SBE", _G, "pages", C, +1, counter=True,
           help="pages retired after single-bit errors (pre-Ampere)"),
    Signal("DCGM_FI_DEV_RETIRED_DBE", _G, "pages", C, +1, counter=True,
           help="pages retired after double-bit errors (pre-Ampere)"),
    Signal("DCGM_FI_DEV_RETIRED_PENDING", _G, "pages", C, +1,
           help="pages pending retirement (needs a GPU reset)"),
    Signal("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", _G, "rows", C, +1, counter=True,
           help="HBM rows remapped after uncorrectable errors"),
    Signal("DCGM_FI_DEV_ROW_REMAP_PENDING", _G, "bool", C, +1,
           help="a row remap waits for a GPU reset"),
    Signal("DCGM_FI_DEV_ROW_REMAP_FAILURE", _G, "bool", C, +1,
           help="a row remap failed (no spare rows left)"),
    Signal("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", _G, "ratio", C, 0,
           help="share of cycles the tensor pipe is active (context: load, not health)"),
    Signal("DCGM_FI_DEV_PCIE_LINK_GEN", _G, "generation", C, -1,
           help="PCIe generation the GPU's link runs at now (downtrains at idle by design)"),
    Signal("DCGM_FI_DEV_PCIE_LINK_WIDTH", _G, "lanes", C, -1, help="PCIe lanes the GPU's link runs with now"),
    Signal("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", _G, "bitmask", C, 0,
           help="why the clocks are held down now (NVML clocks-event reasons; context for a clock deficit)"),
    # the node agent's kernel log, per GPU (joined on the PCI address; docs/agent.md)
    Signal("seamguard_xid_fatal_total", _G, "events", C, +1, counter=True,
           coverage_judged=False, help="kernel-log fatal XIDs and 'fallen off the bus' messages of the GPU",
           query=_per_gpu(f'(seamguard_xid_errors_total{{xid=~"{_codes(FATAL_XIDS)}"{{sel}}}} '
                          'or seamguard_gpu_fallen_off_bus_total{pci_bus_id!=""{sel}})')),
    Signal("seamguard_xid_warning_total", _G, "events", C, +1, counter=True,
           coverage_judged=False, help="kernel-log warning XIDs of the GPU",
           query=_per_gpu(f'seamguard_xid_errors_total{{xid=~"{_codes(WARNING_XIDS)}"{{sel}}}}')),
    # runtime progress, per rank (one rank per GPU)
    Signal("seamguard_rank_compute_seconds", _G, "seconds", RT, +1,
           help="compute time of the rank's last step before its collective"),
    # node_exporter infiniband collector, one series per {device,port}
    Signal("node_infiniband_state_id", _N, "state", FB, -1, help="port state, 4 = ACTIVE"),
    Signal("node_infiniband_link_downed_total", _N, "events", FB, +1, counter=True,
           help="times the link went down"),
    Signal("node_infiniband_symbol_error_total", _N, "errors", FB, +1, counter=True,
           help="physical-layer symbol errors"),
    Signal("node_infiniband_port_transmit_wait_total", _N, "ticks", FB, +1, counter=True,
           help="ticks with data to send but no credits (congestion)"),
    Signal("node_infiniband_physical_state_id", _N, "state", FB, -1, help="physical port state, 5 = LinkUp"),
    Signal("node_infiniband_link_error_recovery_total", _N, "events", FB, +1, counter=True,
           help="times the link recovered from an error state (a retrain)"),
    Signal("node_infiniband_local_link_integrity_errors_total", _N, "events", FB, +1, counter=True,
           help="times local physical errors exceeded the LocalPhyErrors threshold"),
    Signal("node_infiniband_port_errors_received_total", _N, "packets", FB, +1, counter=True,
           help="received packets containing an error"),
    Signal("node_infiniband_port_discards_transmitted_total", _N, "packets", FB, +1, counter=True,
           help="outbound packets discarded because the port was down or congested"),
    # fabric path probes (seamguard's own; no standard exporter name exists)
    Signal("seamguard_fabric_link_latency_us", _L, "microseconds", FB, +1,
           help="probe round-trip latency across the link"),
    # facilities (Redfish CoolingUnit fields under seamguard's names)
    Signal("seamguard_coolant_flow_lpm", _C, "litres/min", F, -1, help="Redfish FlowLitersPerMinute"),
    Signal("seamguard_coolant_supply_temp_c", _C, "celsius", F, +1, help="Redfish SupplyTemperatureCelsius"),
    Signal("seamguard_coolant_return_temp_c", _C, "celsius", F, +1, help="Redfish ReturnTemperatureCelsius"),
    Signal("seamguard_rack_inlet_temp_c", _R, "celsius", F, +1, help="rack coolant inlet temperature"),
    # storage paths
    Signal("seamguard_storage_write_latency_ms", _S, "milliseconds", ST, +1,
           help="p99 write latency of the path as seen by checkpoint writers"),
    # the node agent's host and NVSwitch series, per node (docs/agent.md)
    Signal("node_edac_correctable_errors_total", _NO, "errors", C, +1, counter=True,
           coverage_judged=False, help="host memory correctable errors, all memory controllers (Linux EDAC ce_count)",
           query=_per_node(_host_counts("node_edac_correctable_errors_total"))),
    Signal("node_edac_uncorrectable_errors_total", _NO, "errors", C, +1, counter=True,
           coverage_judged=False, help="host memory uncorrectable errors, all memory controllers (Linux EDAC ue_count)",
           query=_per_node(_host_counts("node_edac_uncorrectable_errors_total"))),
    Signal("seamguard_sxid_fatal_total", _NO, "events", C, +1, counter=True,
           coverage_judged=False, help="kernel-log fatal NVSwitch SXids on the node",
           query=_per_node('seamguard_sxid_errors_total{severity="fatal"{sel}}')),
    Signal("seamguard_sxid_nonfatal_total", _NO, "events", C, +1, counter=True,
           coverage_judged=False, help="kernel-log non-fatal (or unstated) NVSwitch SXids on the node",
           query=_per_node('seamguard_sxid_errors_total{severity!="fatal"{sel}}')),
    Signal("node_vmstat_oom_kill", _NO, "kills", C, 0, counter=True,
           coverage_judged=False, help="OOM-killer invocations since boot (context: host pressure, never a fault)",
           query=_host_value("node_vmstat_oom_kill")),
    Signal("node_pressure_memory_stalled_seconds_total", _NO, "seconds", C, 0, counter=True,
           coverage_judged=False, help="PSI memory 'full': time every task stalled on memory (context)",
           query=_host_value("node_pressure_memory_stalled_seconds_total")),
    Signal("node_pressure_io_stalled_seconds_total", _NO, "seconds", C, 0, counter=True,
           coverage_judged=False, help="PSI io 'full': time every task stalled on I/O (context)",
           query=_host_value("node_pressure_io_stalled_seconds_total")),
    Signal("node_pressure_cpu_waiting_seconds_total", _NO, "seconds", C, 0, counter=True,
           coverage_judged=False, help="PSI cpu 'some': time some task waited for a CPU (context)",
           query=_host_value("node_pressure_cpu_waiting_seconds_total")),
    # the node agent's storage probe, per path (several nodes may probe one path)
    Signal("seamguard_storage_probe_up", _S, "share", ST, -1,
           coverage_judged=False, help="share of the path's probers whose last probe answered within the timeout",
           query='avg by (storage) (seamguard_storage_probe_up{storage!=""{sel}})'),
    Signal("seamguard_storage_probe_failures_total", _S, "probes", ST, +1, counter=True,
           coverage_judged=False, help="storage probes that failed (error) or hung past the timeout, all probers",
           query='sum by (storage) (seamguard_storage_probe_failures_total{storage!=""{sel}})'),
    # Who saw the failures: a path's failed probes count only when a share of its probers
    # agree (one prober's own NIC or mount is that node's problem); 5 min is the flap window.
    Signal("seamguard_storage_probers", _S, "probers", ST, 0,
           coverage_judged=False, help="probers of the path that report (agents probing it)",
           query='count by (storage) (seamguard_storage_probe_up{storage!=""{sel}})'),
    Signal("seamguard_storage_probers_failing", _S, "probers", ST, +1,
           coverage_judged=False, help="probers of the path with a probe that failed or hung in the last 5 min",
           query=('count by (storage) (sum by (storage, node) (increase(seamguard_storage_probe_failures_total'
                  '{storage!=""{sel}}[5m])) > 0) '
                  'or (0 * count by (storage) (seamguard_storage_probe_up{storage!=""{sel}}))')),
    # jobs
    Signal("seamguard_job_step_seconds", _J, "seconds", RT, +1, help="wall time of the job's last step"),
    Signal("seamguard_job_uncommitted_seconds", _J, "seconds", RT, +1,
           help="training a restart from storage would redo (the runtime's rollback exposure)"),
    Signal("seamguard_job_step", _J, "steps", RT, 0,
           help="the furthest step any rank has reached (progress, for schedule-slip risk)"),
)

REGISTRY: dict[str, Signal] = {s.name: s for s in SIGNALS}


def default_query(sig: Signal, selector: str = "") -> str:
    """The PromQL the Prometheus source sends for ``sig`` unless the run config overrides it."""
    if sig.query:
        return sig.query.replace("{sel}", f",{selector}" if selector else "")
    return f"{sig.name}{{{selector}}}" if selector else sig.name


def signals_for(kind: Kind) -> list[Signal]:
    return [s for s in SIGNALS if s.kind == kind]
