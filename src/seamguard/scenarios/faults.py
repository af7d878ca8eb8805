"""Fault classes: what each one does to the hardware, scrape by scrape.

A fault has a labelled entity (kind + name), a start (the first scrape whose series it
changes), and possibly a hard failure: a scheduled event (an XID, a GPU off the bus, a
port down for good) or one the physics reaches (the first GPU past its slowdown
temperature). Each class's ``apply`` runs every scrape from the start on and changes
``Mods`` and counters of the simulation; it never looks at what a detector would see.

``warm_but_healthy`` is not here: it is a property of hardware (physics.make_warm), a
decoy that must not be flagged, and it is never labelled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from seamguard.fleet.model import Kind
from seamguard.scenarios.shifted import SXID_FATAL_LINK, SXID_NONFATAL_LINK

if TYPE_CHECKING:
    from seamguard.scenarios.generator import Sim


@dataclass
class Fault:
    cls: str
    kind: Kind
    index: int
    start_s: float  # seconds from the scenario's first scrape
    params: dict = field(default_factory=dict)
    hard_failure_s: float | None = None  # scheduled or reached
    state: dict = field(default_factory=dict)


@dataclass(frozen=True)
class FaultClass:
    name: str
    kind: Kind
    summary: str
    params: Callable[[np.random.Generator], dict]
    apply: Callable[[Sim, Fault, float, float], None]  # (sim, fault, seconds since start, dt)
    scheduled_failure: Callable[[np.random.Generator], float | None] = lambda rng: None
    physical_failure: bool = False  # hard failure = first GPU of the entity past its slowdown temperature


def _gpus_of(sim: Sim, f: Fault) -> np.ndarray:
    fl = sim.fleet
    if f.kind == Kind.GPU:
        return np.array([f.index])
    if f.kind == Kind.NODE:
        return np.flatnonzero(fl.gpu_node == f.index)
    if f.kind == Kind.COOLING_LOOP:
        return np.flatnonzero(fl.gpu_loop == f.index)
    return np.array([], dtype=np.int64)


def _poisson(sim: Sim, rate_per_s: float, dt: float) -> float:
    return float(sim.rng.poisson(max(rate_per_s, 0.0) * dt))


def _once(f: Fault, key: str) -> bool:
    """True the first time it is asked for ``key`` on this fault."""
    if f.state.get(key):
        return False
    f.state[key] = True
    return True


# ---- GPU faults ---------------------------------------------------------------------------------------
def _pcie(sim: Sim, f: Fault, t: float, dt: float) -> None:
    g = f.index
    rate = f.params["r0"] * np.exp(t / f.params["tau"])
    sim.cnt.g["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"][g] += _poisson(sim, rate, dt)
    sim.mods.compute_factor[g] *= 1.0 + 0.04 * min(1.0, t / 900.0)
    if f.hard_failure_s is not None and t >= f.hard_failure_s - f.start_s and _once(f, "off_bus"):
        sim.set_xid(g, 79)
        sim.off_bus_at(g, delay_scrapes=1)


def _thermal_interface(sim: Sim, f: Fault, t: float, dt: float) -> None:
    p = f.params
    sim.mods.tim_factor[f.index] *= 1.0 + p["a"] * (1 - np.exp(-t / p["tau"])) + p["b"] * t / 1800.0


def _ecc(sim: Sim, f: Fault, t: float, dt: float) -> None:
    g, p = f.index, f.params
    rate = p["r0"] * np.exp(t / p["tau"])
    sim.cnt.g["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"][g] += _poisson(sim, rate, dt)
    if sim.rng.random() < min(1.0, rate * dt / 400.0):
        sim.cnt.g["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"][g] += 1
    if t >= p["xid92_s"] and _once(f, "xid92"):
        sim.set_xid(g, 92)  # high single-bit ECC rate
    hf = f.hard_failure_s
    if hf is not None and t >= hf - f.start_s:
        step = f.state.get("step", 0)
        seq = p["sequence"]
        if step < len(seq):
            xid = seq[step]
            sim.set_xid(g, xid)
            if xid == 48:
                sim.cnt.g["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"][g] += 1
            elif xid == 63:
                sim.cnt.g["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"][g] += 1
                sim.cnt.g["DCGM_FI_DEV_ROW_REMAP_PENDING"][g] = 1
            elif xid == 64:
                sim.cnt.g["DCGM_FI_DEV_ROW_REMAP_FAILURE"][g] = 1
            elif xid == 79:
                sim.off_bus_at(g, delay_scrapes=1)
            f.state["step"] = step + 1


def _fail_slow(sim: Sim, f: Fault, t: float, dt: float) -> None:
    sim.mods.clock_factor[f.index] *= f.params["clock"]


def _nvlink(sim: Sim, f: Fault, t: float, dt: float) -> None:
    g, p = f.index, f.params
    rate = p["r0"] * np.exp(t / p["tau"])
    crc = _poisson(sim, rate, dt)
    sim.cnt.g["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"][g] += crc
    sim.cnt.g["DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"][g] += round(crc * 0.1)
    sim.mods.compute_factor[g] *= 1.0 + min(0.08, 0.02 + rate / 2000.0)
    if f.hard_failure_s is not None and t >= f.hard_failure_s - f.start_s and _once(f, "xid74"):
        sim.set_xid(g, 74)


def _row_remap(sim: Sim, f: Fault, t: float, dt: float) -> None:
    g = f.index
    if _once(f, "pending"):
        sim.cnt.g["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"][g] += 1
        sim.cnt.g["DCGM_FI_DEV_ROW_REMAP_PENDING"][g] = 1
        sim.cnt.g["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"][g] += 1
        sim.set_xid(g, 63)
    if f.hard_failure_s is not None and t >= f.hard_failure_s - f.start_s and _once(f, "failure"):
        sim.cnt.g["DCGM_FI_DEV_ROW_REMAP_FAILURE"][g] = 1
        sim.set_xid(g, 64)


def _power_brake(sim: Sim, f: Fault, t: float, dt: float) -> None:
    gs = _gpus_of(sim, f)
    sim.mods.power_cap_w[gs] = np.minimum(sim.mods.power_cap_w[gs], f.params["cap"] * sim.fleet.gpu_tdp_w[gs])


# ---- facility, fabric, storage faults ----------------------------------------------------------------
def _cooling(sim: Sim, f: Fault, t: float, dt: float) -> None:
    p = f.params
    sim.mods.flow_factor[f.index] *= p["first"] - (p["first"] - p["floor"]) * min(1.0, t / p["ramp_s"])


def _fabric_latency(sim: Sim, f: Fault, t: float, dt: float) -> None:
    p = f.params
    sim.mods.latency_factor[f.index] *= p["factor"] * float(np.exp(0.35 * sim.rng.standard_normal()))
    nic = int(sim.fleet.link_nic[f.index])
    if nic >= 0:
        sim.mods.comm_factor[sim.fleet.nic_node[nic]] *= p["comm"]


def _storage(sim: Sim, f: Fault, t: float, dt: float) -> None:
    p = f.params
    sim.mods.storage_factor[f.index] *= p["first"] + (p["last"] - p["first"]) * min(1.0, t / p["ramp_s"])


def _nic_flap(sim: Sim, f: Fault, t: float, dt: float) -> None:
    nic, p = f.index, f.params
    node = sim.fleet.nic_node[nic]
    nxt = f.state.get("next", 0.0)
    if t >= nxt:
        sim.mods.nic_down[nic] = True
        sim.cnt.n["node_infiniband_link_downed_total"][nic] += 1
        sim.cnt.n["node_infiniband_link_error_recovery_total"][nic] += sim.rng.integers(1, 4)
        sim.mods.comm_factor[node] *= 4.0  # the job stalls while the rail reconverges
        f.state["next"] = t + float(sim.rng.uniform(p["gap_lo_s"], p["gap_hi_s"]))
    else:
        sim.mods.comm_factor[node] *= 1.08


def _ib_symbol(sim: Sim, f: Fault, t: float, dt: float) -> None:
    nic, p = f.index, f.params
    node = sim.fleet.nic_node[nic]
    if f.hard_failure_s is not None and t >= f.hard_failure_s - f.start_s:
        sim.mods.nic_down[nic] = True
        if _once(f, "down"):
            sim.cnt.n["node_infiniband_link_downed_total"][nic] += 1
        sim.mods.comm_factor[node] *= 1.3
        return
    rate = p["r0"] * np.exp(t / p["tau"])
    sim.cnt.n["node_infiniband_symbol_error_total"][nic] += _poisson(sim, rate, dt)
    sim.cnt.n["node_infiniband_port_errors_received_total"][nic] += _poisson(sim, rate * 0.2, dt)
    sim.cnt.n["node_infiniband_link_error_recovery_total"][nic] += _poisson(sim, rate / 300.0, dt)
    sim.mods.comm_factor[node] *= 1.0 + min(0.25, 0.03 + rate / 400.0)


def _congestion(sim: Sim, f: Fault, t: float, dt: float) -> None:
    sim.mods.xmit_wait_factor[f.index] *= f.params["wait"]
    sim.mods.comm_factor[sim.fleet.nic_node[f.index]] *= f.params["comm"]


# ---- held-out classes: no detector channel of their own was written for them -----------------------------
def _pcie_downtrain(sim: Sim, f: Fault, t: float, dt: float) -> None:
    """A marginal link retrains to fewer lanes (x16 -> x8 or x4): host<->GPU copies take longer, no errors."""
    g, lanes = f.index, f.params["lanes"]
    sim.mods.pcie_width[g] = lanes
    sim.mods.compute_factor[g] *= 1.0 + f.params["copy_share"] * (16.0 / lanes - 1.0)


def _host_memory(sim: Sim, f: Fault, t: float, dt: float) -> None:
    """A DIMM corrects more and more errors (EDAC ce_count), then one it cannot (ue_count) and the host crashes."""
    node, p = f.index, f.params
    sim.node_cnt["node_edac_correctable_errors_total"][node] += _poisson(sim, p["r0"] * np.exp(t / p["tau"]), dt)
    if f.hard_failure_s is not None and t >= f.hard_failure_s - f.start_s and _once(f, "ue"):
        sim.node_cnt["node_edac_uncorrectable_errors_total"][node] += 1
        sim.crash_node_at(node, delay_scrapes=1)


def _hbm_heat(sim: Sim, f: Fault, t: float, dt: float) -> None:
    """HBM runs hotter than its die (a stack losing contact with the cold plate): only the memory
    temperature shows it until the memory throttles (clocks down)."""
    g, p = f.index, f.params
    add = p["rise_c"] * min(1.0, t / p["ramp_s"])
    sim.mods.mem_temp_add_c[g] += add
    if add >= p["throttle_at_c"]:
        sim.mods.clock_factor[g] *= p["throttle_clock"]


def _nvswitch_sxid(sim: Sim, f: Fault, t: float, dt: float) -> None:
    """An NVSwitch port on the node's baseboard degrades: the switch logs non-fatal SXids at a climbing
    rate while it corrects and retries (traffic flows); a share end in a fatal SXid: the link leaves the
    active state (logged once per link lost), the GPUs of the NVLink domain report XID 74 and their
    NVLink traffic stops — their work is aborted — until the GPUs and switches are reset."""
    node, p, fl = f.index, f.params, sim.fleet
    if f.state.get("fatal"):
        return  # the link is down: nothing crosses it to fail, nothing recovers until a reset
    sim.node_cnt[SXID_NONFATAL_LINK][node] += _poisson(sim, p["r0"] * np.exp(t / p["tau"]), dt)
    if f.hard_failure_s is not None and t >= f.hard_failure_s - f.start_s and _once(f, "fatal"):
        sim.node_cnt[SXID_FATAL_LINK][node] += float(sim.rng.integers(1, p["links_max"] + 1))
        dom = fl.node_domain
        for g in np.flatnonzero(dom[fl.gpu_node] == dom[node]).tolist():
            sim.set_xid(g, 74)
            sim.nvlink_lost[g] = True


def _half(p: float, lo: float, hi: float) -> Callable[[np.random.Generator], float | None]:
    return lambda rng: float(rng.uniform(lo, hi)) if rng.random() < p else None


G, N, L, C, S, ND = Kind.GPU, Kind.NIC, Kind.LINK, Kind.COOLING_LOOP, Kind.STORAGE, Kind.NODE

CLASSES: dict[str, FaultClass] = {c.name: c for c in (
    FaultClass("pcie_replay", G, "PCIe link replays climb (bad riser/retimer); later the GPU may fall off the bus",
               lambda rng: {"r0": float(rng.uniform(0.3, 2.0)), "tau": float(rng.uniform(500, 1000))}, _pcie,
               _half(0.5, 900, 1800)),
    FaultClass("thermal_interface", G, "thermal interface degrading: hotter than its own history at the same power",
               lambda rng: {"a": float(rng.uniform(0.2, 0.3)), "tau": float(rng.uniform(120, 300)),
                            "b": float(rng.uniform(0.25, 0.45))}, _thermal_interface, physical_failure=True),
    FaultClass("cooling_loop_flow", C, "coolant flow loss on a loop (pump, valve, filter); GPUs on it heat up",
               lambda rng: {"first": float(rng.uniform(0.9, 0.95)), "floor": float(rng.uniform(0.4, 0.5)),
                            "ramp_s": float(rng.uniform(600, 1080))}, _cooling, physical_failure=True),
    FaultClass("fabric_latency", L, "latency-toxic fabric link: no errors, probe latency several times normal",
               lambda rng: {"factor": float(rng.uniform(4, 10)), "comm": float(rng.uniform(1.3, 1.6))},
               _fabric_latency),
    FaultClass("storage_slow", S, "checkpoint storage path slowing down",
               lambda rng: {"first": float(rng.uniform(1.8, 2.5)), "last": float(rng.uniform(6, 10)),
                            "ramp_s": float(rng.uniform(600, 1500))}, _storage),
    FaultClass("ecc_sbe", G, "ECC single-bit errors climbing, then an uncorrectable error (XID 48/63/64/79)",
               lambda rng: {"r0": float(rng.uniform(0.05, 0.3)), "tau": float(rng.uniform(300, 600)),
                            "xid92_s": float(rng.uniform(240, 480)),
                            "sequence": [[48, 63], [48, 64], [48, 79]][int(rng.integers(0, 3))]}, _ecc,
               _half(0.8, 720, 1500)),
    FaultClass("nic_link_flap", N, "NIC link flapping: down for a scrape every few minutes",
               lambda rng: {"gap_lo_s": 90.0, "gap_hi_s": float(rng.uniform(200, 360))}, _nic_flap),
    FaultClass("fail_slow_gpu", G, "fail-slow GPU: clocks down with no thermal or power cause",
               lambda rng: {"clock": float(rng.uniform(0.62, 0.8))}, _fail_slow),
    FaultClass("nvlink_errors", G, "NVLink CRC and replay errors climbing; may end in XID 74",
               lambda rng: {"r0": float(rng.uniform(2, 10)), "tau": float(rng.uniform(500, 900))}, _nvlink,
               _half(0.5, 900, 1800)),
    FaultClass("row_remap", G, "row remap pending after an uncorrectable error (XID 63), then a remap failure (XID 64)",
               lambda rng: {}, _row_remap, _half(0.8, 480, 1200)),
    FaultClass("power_brake", ND, "power brake on a node (PSU/BMC): every GPU capped far below its limit",
               lambda rng: {"cap": float(rng.uniform(0.4, 0.55))}, _power_brake),
    FaultClass("ib_symbol_errors", N, "IB symbol errors and link error recoveries climbing; the port may go down",
               lambda rng: {"r0": float(rng.uniform(0.2, 1.0)), "tau": float(rng.uniform(500, 900))}, _ib_symbol,
               _half(0.5, 900, 1800)),
    FaultClass("fabric_congestion", N, "congestion: a port waits for credits many times more than normal",
               lambda rng: {"wait": float(rng.uniform(15, 40)), "comm": float(rng.uniform(1.2, 1.5))}, _congestion),
)}

HELDOUT_ONLY: dict[str, FaultClass] = {c.name: c for c in (
    FaultClass("pcie_downtrain", G, "PCIe link retrained to fewer lanes (x16 -> x8/x4): slower copies, no errors",
               lambda rng: {"lanes": float(rng.choice([8.0, 4.0])), "copy_share": float(rng.uniform(0.03, 0.08))},
               _pcie_downtrain),
    FaultClass("host_memory_ue", ND, "host DRAM correctable errors climbing, then an uncorrectable one and a crash",
               lambda rng: {"r0": float(rng.uniform(0.02, 0.1)), "tau": float(rng.uniform(300, 700))}, _host_memory,
               _half(0.7, 900, 1800)),
    FaultClass("hbm_heat", G, "HBM temperature climbing on one GPU (memory temperature only, then memory throttling)",
               lambda rng: {"rise_c": float(rng.uniform(12, 25)), "ramp_s": float(rng.uniform(300, 1200)),
                            "throttle_at_c": float(rng.uniform(10, 20)), "throttle_clock": float(rng.uniform(0.8, 0.9))},
               _hbm_heat),
    FaultClass("nvswitch_sxid", ND, "NVSwitch non-fatal SXids climbing, then a fatal one: XID 74 on the NVLink "
                                    "domain's GPUs and their work stops",
               lambda rng: {"r0": float(rng.uniform(0.001, 0.005)), "tau": float(rng.uniform(600, 1200)),
                            "links_max": int(rng.integers(1, 5))}, _nvswitch_sxid, _half(0.6, 600, 1800)),
)}

FAULT_CLASS_NAMES: tuple[str, ...] = tuple(CLASSES)
"""The development classes (seeds 0-19); each has a channel written for it."""
HELDOUT_CLASS_NAMES: tuple[str, ...] = tuple(HELDOUT_ONLY) + FAULT_CLASS_NAMES
"""Every class of the held-out histories, the ones without a channel first (a short run still has them)."""
CLASSES.update(HELDOUT_ONLY)
