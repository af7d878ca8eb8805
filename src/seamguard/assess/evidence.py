"""Gray-failure evidence per entity kind, combined into GFS. Pure functions.

Four kinds of evidence, each a score in [0, 1] per entity and channel:
- peer-relative deviation (robust z against the entity's peer group),
- trends in error counters (rates over a window, never levels; resets handled),
- physical headroom (GPU temperature to its throttle point, coolant flow to rated),
- hard events (a fatal XID appearing, a link down for good, a GPU gone from the bus).
GFS is their noisy-OR. The channel matrix is kept so every score can say why.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from seamguard.assess.stats import noisy_or, ramp, robust_z
from seamguard.fleet.model import Fleet, Kind
from seamguard.observe.frame import Frame
from seamguard.observe.history import History

# XIDs (NVIDIA's XID catalogue; meanings in docs/sources.md §1): fatal ones end the GPU's usefulness until reset;
# warning ones announce that a fatal one is coming.
FATAL_XIDS = np.array([48, 74, 79, 94, 95, 119, 120])
WARNING_XIDS = np.array([63, 64, 92])


class EvidenceConfig(BaseModel):
    """Where each kind of evidence starts (score 0) and saturates (score 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    thermal_warn_headroom_c: float = Field(8.0, gt=0, description="GPU headroom to throttle where concern starts")
    thermal_crit_headroom_c: float = Field(2.0, ge=0, description="GPU headroom to throttle where evidence saturates")
    clock_deficit: tuple[float, float] = Field((0.06, 0.20), description="SM clock below job-peer median (fraction)")
    compute_excess: tuple[float, float] = Field((0.08, 0.20), description="rank compute time above job-peer median")
    peer_z: tuple[float, float] = Field((6.0, 10.0), description="robust z of a temperature against its peers")
    peer_z_floor_c: float = Field(0.5, gt=0, description="smallest temperature MAD (sensor resolution)")
    gpu_r_th_c_per_w: float = Field(0.045, ge=0, description="die-to-coolant thermal resistance of the GPU model")
    sbe_rate_per_h: tuple[float, float] = Field((60.0, 600.0), description="correctable ECC errors per hour")
    remapped_rows: tuple[float, float] = Field((0.0, 2.0), description="rows remapped within the rate window")
    rate_window_s: float = Field(60.0, gt=0, description="window for error-counter rates")
    flaps: tuple[float, float] = Field((1.0, 3.0), description="link-down events within the flap window")
    flap_window_s: float = Field(300.0, gt=0, description="window for link flap counting (dampening)")
    symbol_errors_per_h: tuple[float, float] = Field((100.0, 2000.0), description="IB symbol errors per hour")
    link_down_hard_ticks: int = Field(3, ge=1, description="ticks a port stays down before it counts as failed")
    latency_ratio: tuple[float, float] = Field((1.5, 3.0), description="link latency over the tier median")
    latency_z_min: float = Field(6.0, description="robust z a link's latency must also exceed")
    flow_ratio: tuple[float, float] = Field((0.92, 0.80), description="coolant flow / rated: concern, saturation")
    supply_excess_c: tuple[float, float] = Field((2.0, 5.0), description="loop supply temp above peer median")
    storage_latency_ratio: tuple[float, float] = Field((2.0, 4.0), description="write latency over path median")
    storage_latency_ms: tuple[float, float] = Field((100.0, 400.0), description="absolute p99 write latency")
    facility_weight: float = Field(0.75, ge=0, le=1, description="share of a loop's GFS its GPUs inherit")
    missing_node_score: float = Field(0.6, ge=0, le=1, description="score of an entity that stopped reporting")


@dataclass(frozen=True, eq=False)
class Evidence:
    """Evidence of one kind of entity. Rows are entities, columns channels."""

    kind: Kind
    channels: tuple[str, ...]
    units: tuple[str, ...]
    score: np.ndarray  # [N, E] in [0, 1]
    value: np.ndarray  # [N, E] the measured quantity behind each score
    hard_event: np.ndarray  # [N] bool: a hard failure appeared this tick
    hard_level: np.ndarray  # [N] bool: a hard condition is present now

    @property
    def gfs(self) -> np.ndarray:
        return noisy_or(self.score) if self.score.shape[1] else np.zeros(self.score.shape[0])


def _rate_per_h(hist: History, name: str, frame: Frame, window_s: float) -> np.ndarray:
    """Counter increase per hour over ``window_s``, including the current frame."""
    cur = frame.get(name)
    k = hist.ticks_for(window_s)
    w = hist.window(name, k)
    if w is None or w.shape[0] == 0:
        return np.zeros_like(cur)
    # Never divide by less than the full window: a single count just after start-up
    # must not read as a burst.
    span_s = max(frame.t_s - float(hist.times(w.shape[0])[0]), window_s)
    return _increase(w, cur) * 3600.0 / span_s


def _increase(w: np.ndarray, cur: np.ndarray) -> np.ndarray:
    rows = np.vstack([w, cur[None, :]])
    d = np.diff(rows, axis=0)
    d = np.where(d < 0, rows[1:], d)  # a drop is a counter reset: count from zero
    return np.nansum(d, axis=0)


def _count(hist: History, name: str, frame: Frame, window_s: float) -> np.ndarray:
    cur = frame.get(name)
    w = hist.window(name, hist.ticks_for(window_s))
    return np.zeros_like(cur) if w is None or w.shape[0] == 0 else _increase(w, cur)


def _went_missing(hist: History, name: str, cur: np.ndarray) -> np.ndarray:
    prev = hist.window(name, 1)
    if prev is None or prev.shape[0] == 0:
        return np.zeros(cur.shape, dtype=bool)
    return np.isnan(cur) & ~np.isnan(prev[-1])


def _stack(cols: list[np.ndarray]) -> np.ndarray:
    return np.stack(cols, axis=1) if cols else np.zeros((0, 0))


def gpu_evidence(fleet: Fleet, frame: Frame, hist: History, cfg: EvidenceConfig,
                 loop_gfs: np.ndarray) -> Evidence:
    n = fleet.count(Kind.GPU)
    temp = frame.get("DCGM_FI_DEV_GPU_TEMP")
    clock = frame.get("DCGM_FI_DEV_SM_CLOCK")
    compute = frame.get("seamguard_rank_compute_seconds")
    xid = frame.get("DCGM_FI_DEV_XID_ERRORS")

    headroom = fleet.gpu_throttle_temp_c - temp
    s_headroom = ramp(cfg.thermal_warn_headroom_c - headroom, 0.0,
                      cfg.thermal_warn_headroom_c - cfg.thermal_crit_headroom_c)

    # Peers: GPUs of the same job (idle GPUs form group 0); a rack for temperatures.
    job_group = fleet.gpu_job + 1
    n_jobs = len(fleet.job_names) + 1
    _, clock_med = robust_z(clock, job_group, n_jobs, floor=5.0)
    deficit = 1.0 - clock / clock_med
    s_clock = ramp(deficit, *cfg.clock_deficit)
    # Normalise compute time by the GPU's clock against its peers': a throttled GPU is
    # slow because of its clock (thermal evidence covers it); a fail-slow GPU is slow at
    # full clock, which is what this channel is for.
    compute = compute * (clock / clock_med)
    z_comp, comp_med = robust_z(compute, job_group, n_jobs, floor=1e-3)
    excess = compute / comp_med - 1.0
    s_compute = np.where(z_comp >= 4.0, ramp(excess, *cfg.compute_excess), 0.0)
    # Compare what power does not explain: die temperature minus the rise its own power
    # causes, against the rest of its rack (same coolant). A bad thermal interface or a
    # blocked cold plate stands out; a busy GPU next to an idle one does not.
    power = frame.get("DCGM_FI_DEV_POWER_USAGE")
    residual = temp - cfg.gpu_r_th_c_per_w * np.nan_to_num(power, nan=0.0)
    z_temp, _ = robust_z(residual, fleet.gpu_rack, fleet.count(Kind.RACK), floor=cfg.peer_z_floor_c)
    s_temp_peer = ramp(z_temp, *cfg.peer_z)

    # Facilities first-class: a loop losing flow raises the risk of every GPU it cools.
    loop_share = cfg.facility_weight * loop_gfs[fleet.gpu_loop]
    # Root cause: thermal symptoms on a loop that is itself in trouble are the loop's,
    # not each GPU's; the loop's share stands for them, so a failing loop degrades its
    # GPUs (and moves critical work away) without quarantining every node on it.
    explained = loop_share >= 0.3
    s_headroom = np.where(explained, 0.0, s_headroom)
    s_clock = np.where(explained, 0.0, s_clock)
    s_temp_peer = np.where(explained, 0.0, s_temp_peer)

    sbe = _rate_per_h(hist, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", frame, cfg.rate_window_s)
    s_sbe = ramp(sbe, *cfg.sbe_rate_per_h)
    remap = _count(hist, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", frame, cfg.rate_window_s)
    s_remap = ramp(remap, *cfg.remapped_rows)

    prev = hist.window("DCGM_FI_DEV_XID_ERRORS", 1)
    prev_xid = prev[-1] if prev is not None and prev.shape[0] else np.full(n, np.nan)
    changed = (xid != prev_xid) & ~np.isnan(xid)
    fatal_level = np.isin(xid, FATAL_XIDS)
    s_xid = np.where(np.isin(xid, WARNING_XIDS) & changed, 0.7, 0.0)
    s_xid = np.where(fatal_level, 1.0, s_xid)

    # A GPU that stops reporting while the rest of its node still does fell off the bus.
    gone = np.isnan(temp)
    node_reporting = np.bincount(fleet.gpu_node, weights=~gone, minlength=fleet.count(Kind.NODE)) > 0
    off_bus = gone & node_reporting[fleet.gpu_node]
    went = _went_missing(hist, "DCGM_FI_DEV_GPU_TEMP", temp)
    s_missing = np.where(off_bus, 1.0, np.where(gone, cfg.missing_node_score, 0.0))

    score = _stack([s_headroom, loop_share, s_clock, s_compute, s_temp_peer, s_sbe, s_remap, s_xid, s_missing])
    value = _stack([headroom, loop_gfs[fleet.gpu_loop], deficit, excess, z_temp, sbe, remap, xid,
                    gone.astype(float)])
    return Evidence(
        kind=Kind.GPU,
        channels=("thermal_headroom", "cooling_loop", "clock_deficit", "compute_excess", "temp_peer_z",
                  "sbe_rate", "remapped_rows", "xid", "missing"),
        units=("celsius", "gfs", "fraction", "fraction", "z", "per_hour", "rows", "xid", "bool"),
        score=score, value=value,
        hard_event=(changed & fatal_level) | (off_bus & went),
        hard_level=fatal_level | off_bus,
    )


def nic_evidence(fleet: Fleet, frame: Frame, hist: History, cfg: EvidenceConfig) -> Evidence:
    state = frame.get("node_infiniband_state_id")
    down = ~np.isnan(state) & (state != 4)
    w = hist.window("node_infiniband_state_id", cfg.link_down_hard_ticks - 1)
    if w is not None and w.shape[0] == cfg.link_down_hard_ticks - 1:
        rows = np.vstack([w, state[None, :]])
        down_for_good = (~np.isnan(rows) & (rows != 4)).all(axis=0)
    else:
        down_for_good = np.zeros_like(down) if cfg.link_down_hard_ticks > 1 else down
    flaps = _count(hist, "node_infiniband_link_downed_total", frame, cfg.flap_window_s)
    symbol = _rate_per_h(hist, "node_infiniband_symbol_error_total", frame, cfg.rate_window_s)
    s_down = np.where(down, 0.6, 0.0)
    s_flaps = ramp(flaps, *cfg.flaps)
    s_symbol = ramp(symbol, *cfg.symbol_errors_per_h)
    gone = np.isnan(state)
    s_missing = np.where(gone, cfg.missing_node_score, 0.0)
    return Evidence(
        kind=Kind.NIC,
        channels=("link_down", "flaps", "symbol_errors", "missing"),
        units=("state", "events", "per_hour", "bool"),
        score=_stack([s_down, s_flaps, s_symbol, s_missing]),
        value=_stack([state, flaps, symbol, gone.astype(float)]),
        hard_event=down_for_good, hard_level=down_for_good,
    )


def link_evidence(fleet: Fleet, frame: Frame, cfg: EvidenceConfig) -> Evidence:
    lat = frame.get("seamguard_fabric_link_latency_us")
    tier = (fleet.link_nic < 0).astype(np.int64)  # 0: NIC-leaf, 1: leaf-spine
    z, med = robust_z(lat, tier, 2, floor=0.05)
    ratio = lat / med
    s = np.where(z >= cfg.latency_z_min, ramp(ratio, *cfg.latency_ratio), 0.0)
    none = np.zeros(len(lat), dtype=bool)
    return Evidence(Kind.LINK, ("latency",), ("ratio",), _stack([s]), _stack([ratio]), none, none)


def loop_evidence(fleet: Fleet, frame: Frame, cfg: EvidenceConfig) -> Evidence:
    flow = frame.get("seamguard_coolant_flow_lpm")
    supply = frame.get("seamguard_coolant_supply_temp_c")
    ratio = flow / fleet.loop_rated_flow_lpm
    hi, lo = cfg.flow_ratio
    s_flow = ramp(hi - ratio, 0.0, hi - lo)
    n = len(flow)
    med = np.nanmedian(supply) if np.isfinite(supply).any() else np.nan
    excess = supply - med
    s_supply = ramp(excess, *cfg.supply_excess_c) if n >= 3 else np.zeros(n)
    gone = np.isnan(flow)
    s_missing = np.where(gone, cfg.missing_node_score, 0.0)
    none = np.zeros(n, dtype=bool)
    return Evidence(Kind.COOLING_LOOP, ("flow_ratio", "supply_excess", "missing"),
                    ("ratio", "celsius", "bool"),
                    _stack([s_flow, s_supply, s_missing]), _stack([ratio, excess, gone.astype(float)]),
                    none, none)


def rack_evidence(fleet: Fleet, frame: Frame, cfg: EvidenceConfig) -> Evidence:
    inlet = frame.get("seamguard_rack_inlet_temp_c")
    n = len(inlet)
    z, _ = robust_z(inlet, np.zeros(n, dtype=np.int64), 1, floor=cfg.peer_z_floor_c)
    s = ramp(z, *cfg.peer_z)
    none = np.zeros(n, dtype=bool)
    return Evidence(Kind.RACK, ("inlet_peer_z",), ("z",), _stack([s]), _stack([z]), none, none)


def storage_evidence(fleet: Fleet, frame: Frame, cfg: EvidenceConfig) -> Evidence:
    lat = frame.get("seamguard_storage_write_latency_ms")
    n = len(lat)
    med = np.nanmedian(lat) if np.isfinite(lat).any() else np.nan
    ratio = lat / med
    s_rel = ramp(ratio, *cfg.storage_latency_ratio) if n >= 3 else np.zeros(n)
    s_abs = ramp(lat, *cfg.storage_latency_ms)
    none = np.zeros(n, dtype=bool)
    return Evidence(Kind.STORAGE, ("latency_ratio", "latency_ms"), ("ratio", "milliseconds"),
                    _stack([s_rel, s_abs]), _stack([ratio, lat]), none, none)
