"""The hardware and facility model of a scenario: one fleet's state advanced one scrape at a time.

This model is written for evaluation and deliberately shares nothing with
``seamguard.assess`` or the twin: its own constants, its own equations.

Thermal: the die sits on a cold plate fed by the loop. Coolant at the plate =
loop supply + the rack's offset + half the loop's temperature rise (heat / (flow · ρ · c)).
The die's steady temperature = plate coolant + R_th · P, with R_th = R_cond (die, thermal
interface) + R_conv (plate to coolant, which grows as flow falls: ∝ flow^-0.8, the
turbulent-convection exponent). The die follows its steady value with a first-order
lag. Every GPU has its own R_cond and R_conv (a few per cent spread), its own full-load
power and its own load clock. A GPU above its slowdown temperature cuts its clock
(and so its power) until it sits at the slowdown point, and its thermal-violation
counter runs; below it nothing throttles, however warm.

Work: each job steps in lock step (training) or independently (inference). A rank's
compute time scales with its clock; a synchronous job's step waits for its slowest rank
plus communication, which fabric trouble stretches; ranks that wait draw less power.
Jobs pause to checkpoint (GPUs idle, storage latency up), restart, change load.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from seamguard.fleet.model import Fleet, JobClass

# ---- this model's own constants (evaluation physics, not the detector's) --------------------------
COOLANT_DENSITY_KG_L = 1.02  # propylene-glycol 25 % mix
COOLANT_CP_J_KGK = 3900.0
HEAT_PER_GPU_WATT = 1.3  # node heat into the loop per GPU watt (CPUs, NICs, VRM losses)
R_TH_MEAN = 0.061  # C/W die to plate coolant at rated flow, a liquid-cooled ~700 W part
R_COND_SHARE = 0.6  # share of R_th in the die/interface stack (the rest is plate convection)
R_TH_SPREAD = 0.04  # relative standard deviation between GPUs
FLOW_EXPONENT = 0.8  # convection coefficient ~ velocity^0.8
DIE_TAU_S = 40.0  # die temperature time constant
IDLE_CLOCK_MHZ = 345.0
MAX_CLOCK_MHZ = 1980.0
CLOCK_STEP_MHZ = 15.0
WAIT_POWER_SHARE = 0.35  # power share a rank keeps while it waits in a collective

SYNC_QUANTILE = {JobClass.HIGH_SYNC_TRAINING: 1.0, JobClass.PIPELINE_TRAINING: 0.9,
                 JobClass.ASYNC_BATCH_INFERENCE: 0.5, JobClass.LATENCY_INFERENCE: 0.5}


@dataclass
class Mods:
    """What faults and events change this scrape (reset every step)."""

    flow_factor: np.ndarray  # per loop
    tim_factor: np.ndarray  # per GPU, multiplies R_cond
    clock_factor: np.ndarray  # per GPU
    power_cap_w: np.ndarray  # per GPU
    compute_factor: np.ndarray  # per GPU, extra compute time (retries, replays)
    comm_factor: np.ndarray  # per node
    latency_factor: np.ndarray  # per link
    storage_factor: np.ndarray  # per storage path
    xmit_wait_factor: np.ndarray  # per NIC
    nic_down: np.ndarray  # per NIC bool
    pcie_width: np.ndarray  # per GPU, lanes the link trained to
    mem_temp_add_c: np.ndarray  # per GPU, HBM hotter than the die's model says (held-out classes)

    @classmethod
    def fresh(cls, f: Fleet) -> Mods:
        g, n = len(f.gpu_names), len(f.node_names)
        return cls(np.ones(len(f.loop_names)), np.ones(g), np.ones(g), np.full(g, np.inf), np.ones(g),
                   np.ones(n), np.ones(len(f.link_names)), np.ones(len(f.storage_names)),
                   np.ones(len(f.nic_names)), np.zeros(len(f.nic_names), dtype=bool), np.full(g, 16.0),
                   np.zeros(g))


@dataclass
class Hardware:
    """Per-entity draws, fixed for a scenario."""

    r_cond: np.ndarray
    r_conv: np.ndarray
    p_full: np.ndarray  # W at full load
    p_idle: np.ndarray
    clk_load: np.ndarray  # MHz under full load
    mem_offset: np.ndarray
    slowdown_c: np.ndarray
    supply_base: np.ndarray  # per loop
    diurnal_amp: np.ndarray
    diurnal_phase: np.ndarray
    flow_rated: np.ndarray
    rack_offset: np.ndarray
    link_base_us: np.ndarray
    storage_base_ms: np.ndarray
    job_base_s: np.ndarray
    job_intensity: np.ndarray
    xmit_rate: np.ndarray  # per NIC, wait ticks per second under load
    warm: np.ndarray  # bool per GPU (run warm, healthy)
    power_brush: np.ndarray  # per GPU: share of busy time at the power limit (healthy)


def draw_hardware(fleet: Fleet, rng: np.random.Generator, day_t0: float) -> Hardware:
    g = len(fleet.gpu_names)
    spread = np.exp(R_TH_SPREAD * rng.standard_normal(g))
    r = R_TH_MEAN * spread
    p_full = fleet.gpu_tdp_w * rng.uniform(0.92, 0.99, g)
    brush = np.where(p_full > 0.975 * fleet.gpu_tdp_w, rng.uniform(0.02, 0.2, g), 0.0)
    nl = len(fleet.loop_names)
    return Hardware(
        r_cond=r * R_COND_SHARE, r_conv=r * (1 - R_COND_SHARE), p_full=p_full,
        p_idle=rng.uniform(62.0, 85.0, g), clk_load=np.round(rng.uniform(1755, 1890, g) / CLOCK_STEP_MHZ)
        * CLOCK_STEP_MHZ, mem_offset=rng.uniform(2.0, 7.0, g), slowdown_c=fleet.gpu_throttle_temp_c.astype(float),
        supply_base=rng.uniform(26.5, 30.5, nl), diurnal_amp=rng.uniform(0.4, 1.5, nl),
        diurnal_phase=rng.uniform(0, 2 * np.pi, nl) + 2 * np.pi * day_t0 / 86400.0,
        flow_rated=fleet.loop_rated_flow_lpm * rng.uniform(0.96, 1.01, nl),
        rack_offset=rng.uniform(0.0, 0.7, len(fleet.rack_names)),
        link_base_us=np.where(fleet.link_nic >= 0, rng.uniform(1.8, 3.0, len(fleet.link_names)),
                              rng.uniform(2.5, 4.0, len(fleet.link_names))),
        storage_base_ms=rng.uniform(14.0, 35.0, len(fleet.storage_names)),
        job_base_s=rng.uniform(0.8, 2.6, len(fleet.job_names)),
        job_intensity=rng.uniform(0.88, 1.0, len(fleet.job_names)),
        xmit_rate=rng.uniform(2e4, 1e5, len(fleet.nic_names)),
        warm=np.zeros(g, dtype=bool), power_brush=brush)


def loop_rise_c(heat_w: np.ndarray, flow_lpm: np.ndarray) -> np.ndarray:
    """Coolant temperature rise across a loop: Q / (m_dot · c)."""
    m_dot = np.maximum(flow_lpm, 1e-3) / 60.0 * COOLANT_DENSITY_KG_L
    return heat_w / (m_dot * COOLANT_CP_J_KGK)


def pick_warm(fleet: Fleet, rng: np.random.Generator, share: float, exclude: np.ndarray) -> np.ndarray:
    """~``share`` of the allocated GPUs (not ``exclude``) that will run warm but healthy."""
    alloc = np.flatnonzero((fleet.gpu_job >= 0) & ~exclude)
    k = max(1, int(round(share * len(fleet.gpu_names))))
    return np.sort(rng.choice(alloc, size=min(k, len(alloc)), replace=False))


def make_warm(hw: Hardware, pick: np.ndarray, plate: np.ndarray, power: np.ndarray, supply_headroom: np.ndarray,
              rng: np.random.Generator) -> None:
    """Raise R_th of ``pick`` until each sits 2.5-5 C below its slowdown point under its own load, on the
    warmest coolant of the window with 7 % more power (noise, a heavier model): warm, never throttling."""
    target = hw.slowdown_c[pick] - rng.uniform(2.5, 5.0, len(pick))
    hot_plate = plate[pick] + supply_headroom + 0.4
    r_needed = (target - hot_plate) / (power[pick] * 1.07)
    scale = np.maximum(r_needed / (hw.r_cond[pick] + hw.r_conv[pick]), 1.0)
    hw.r_cond[pick] *= scale
    hw.r_conv[pick] *= scale
    hw.warm[pick] = True


@dataclass
class Counters:
    """Monotone counters and sticky gauges, per entity (reset by reboots)."""

    g: dict[str, np.ndarray] = field(default_factory=dict)
    n: dict[str, np.ndarray] = field(default_factory=dict)


GPU_COUNTERS = ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_XID_ERRORS",
                "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_THERMAL_VIOLATION",
                "DCGM_FI_DEV_POWER_VIOLATION")
NIC_COUNTERS = ("node_infiniband_link_downed_total", "node_infiniband_link_error_recovery_total",
                "node_infiniband_symbol_error_total", "node_infiniband_port_transmit_wait_total",
                "node_infiniband_port_errors_received_total")
# Row-remap state and XID are gauges cleared by a reset; the rest count since the driver loaded.


def initial_counters(fleet: Fleet, rng: np.random.Generator) -> Counters:
    g, n = len(fleet.gpu_names), len(fleet.nic_names)
    c = Counters()
    for name in GPU_COUNTERS:
        c.g[name] = np.zeros(g)
    # Hours of uptime already behind the counters: a few old events here and there.
    c.g["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] = np.where(rng.random(g) < 0.05, rng.integers(1, 40, g), 0).astype(float)
    c.g["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] = np.where(rng.random(g) < 0.08, rng.integers(1, 12, g), 0).astype(float)
    c.g["DCGM_FI_DEV_THERMAL_VIOLATION"] = np.where(rng.random(g) < 0.03, rng.integers(1, 5e6, g), 0).astype(float)
    c.g["DCGM_FI_DEV_POWER_VIOLATION"] = rng.integers(0, 3e8, g).astype(float)
    for name in NIC_COUNTERS:
        c.n[name] = np.zeros(n)
    c.n["node_infiniband_port_transmit_wait_total"] = rng.uniform(1e8, 5e10, n).round()
    c.n["node_infiniband_link_downed_total"] = np.where(rng.random(n) < 0.1, rng.integers(1, 3, n), 0).astype(float)
    c.n["node_infiniband_symbol_error_total"] = np.where(rng.random(n) < 0.15, rng.integers(1, 60, n), 0).astype(float)
    c.n["node_infiniband_link_error_recovery_total"] = np.where(rng.random(n) < 0.05, 1, 0).astype(float)
    return c
