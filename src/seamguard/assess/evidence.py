"""Gray-failure evidence per entity kind, combined into GFS. Pure functions.

Kinds of evidence, each a score in [0, 1] per entity and channel (docs/evidence.md):
- drift from the entity's own learned baseline (assess/baselines.py), with the common
  mode of its peers removed: a GPU hotter than its own history at the same power, a
  link or storage path slower than its own floor, an error counter above its own floor;
- peer-relative deviation (robust z against the entity's peer group at the same load);
- trends in error counters (rates over a window, never levels; resets handled);
- urgency: how close drift is to hurting (headroom to the throttle point, time to reach
  it at the drift's rate) raises the score of real drift, never flags a steady entity;
- hard events (a fatal XID or an uncorrectable ECC error appearing, a link down for
  good, a GPU gone from the bus); thermal throttling that actually happens is full evidence.
GFS is their noisy-OR. The channel matrix is kept so every score can say why; channels
with unit ``bool``/``celsius`` and score 0 (``warming``, ``headroom``) are data only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from seamguard.assess.baselines import (Baselines, BaselineConfig, GpuBaseline, NicBaseline, alpha, count_up, ew,
                                        floor_step, latency_step, node_at_work, offset_step, wait_ratio, wait_step)
from seamguard.assess.stats import counter_increase, group_median, loo_median, loo_robust_z, noisy_or, ramp
from seamguard.assess.node_channels import FLAP as NODE_FLAP_COUNTERS, RATE as NODE_RATE_COUNTERS, node_channels
from seamguard.fleet.model import Fleet, Kind
from seamguard.observe.frame import Frame
from seamguard.observe.history import History
from seamguard.observe.signals import FATAL_XIDS as _FATAL, WARNING_XIDS as _WARNING

# XIDs (NVIDIA's XID catalogue; meanings in docs/sources.md §1): fatal ones end the GPU's usefulness until reset;
# warning ones announce that a fatal one is coming.
FATAL_XIDS = np.array(_FATAL)
WARNING_XIDS = np.array(_WARNING)

# Counters read as rates over ``rate_window_s`` (and the ones over ``flap_window_s``).
RATE_COUNTERS = ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                 "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                 "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                 "DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                 "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_POWER_VIOLATION",
                 "node_infiniband_symbol_error_total", "node_infiniband_port_errors_received_total",
                 "node_infiniband_port_discards_transmitted_total", "node_infiniband_port_transmit_wait_total") \
    + NODE_RATE_COUNTERS
FLAP_COUNTERS = ("node_infiniband_link_downed_total", "node_infiniband_link_error_recovery_total",
                 "node_infiniband_local_link_integrity_errors_total", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
                 "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "seamguard_storage_probe_failures_total") \
    + NODE_FLAP_COUNTERS


class EvidenceConfig(BaseModel):
    """Where each kind of evidence starts (score 0) and saturates (score 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    thermal_warn_headroom_c: float = Field(8.0, gt=0, description="headroom to throttle where drift becomes urgent")
    thermal_crit_headroom_c: float = Field(2.0, ge=0, description="headroom to throttle where urgency saturates")
    thermal_drift_z: tuple[float, float] = Field((3.0, 6.0), description="drift over the GPU's own noise (sigma)")
    thermal_drift_c: tuple[float, float] = Field((1.0, 3.0), description="drift above own baseline (°C)")
    thermal_drift_weight: float = Field(0.65, gt=0, le=1, description="score of saturated drift with no urgency")
    time_to_throttle_s: tuple[float, float] = Field((900.0, 120.0), description="time to throttle at the drift's rate: urgency starts, saturates")
    drift_noise_floor_c: float = Field(0.5, gt=0, description="smallest thermal noise (sensor resolution)")
    throttle_fraction: tuple[float, float] = Field((0.01, 0.10), description="share of time thermally throttled, clocks down")
    clock_deficit: tuple[float, float] = Field((0.06, 0.20), description="SM clock below job-peer median (fraction)")
    clock_offset_cap: float = Field(0.04, ge=0, description="most of a GPU's own steady clock deficit that is forgiven")
    compute_excess: tuple[float, float] = Field((0.08, 0.20), description="rank compute time above job-peer median")
    power_violation: tuple[float, float] = Field((0.2, 0.5), description="share of time power-capped above own floor and job peers")
    peer_z: tuple[float, float] = Field((6.0, 10.0), description="robust z of a rack's inlet against all racks")
    peer_z_floor_c: float = Field(0.5, gt=0, description="smallest temperature MAD (sensor resolution)")
    gpu_r_th_c_per_w: float = Field(0.045, ge=0, description="die-to-coolant thermal resistance for the temp_peer_z data column")
    sbe_rate_per_h: tuple[float, float] = Field((60.0, 600.0), description="correctable ECC errors per hour above own floor")
    remapped_rows: tuple[float, float] = Field((0.0, 2.0), description="rows remapped within the rate window")
    pcie_replays_per_h: tuple[float, float] = Field((240.0, 480.0), description="PCIe replays per hour above own floor "
                                                    "(DCGM's limit is 8 per minute: counting starts at half of it)")
    nvlink_crc_per_h: tuple[float, float] = Field((60.0, 600.0), description="NVLink CRC errors per hour above own floor")
    nvlink_recoveries: tuple[float, float] = Field((1.0, 5.0), description="NVLink replays + recoveries within the "
                                                   "flap window: one is a link that recovered, a run of them is not")
    edac_ce_per_h: tuple[float, float] = Field((24.0, 240.0), description="host memory correctable errors per hour "
                                               "over the node's own floor (over the flap window)")
    host_memory_weight: float = Field(0.65, ge=0, le=1, description="most correctable host memory errors score")
    sxid_nonfatal: tuple[float, float] = Field((1.0, 4.0), description="non-fatal NVSwitch SXids in the NVLink "
                                               "domain within the flap window")
    nvswitch_weight: float = Field(0.65, ge=0, le=1, description="most non-fatal SXids score")
    pcie_bw_loss: tuple[float, float] = Field((0.1, 0.25), description="share of the PCIe link's bandwidth lost "
                                              "against its own maximum at load")
    pcie_link_weight: float = Field(0.65, ge=0, le=1, description="score of a downtrained PCIe link (degraded)")
    host_pressure_explains: float = Field(0.1, gt=0, le=1, description="PSI share (or any OOM kill) at which host "
                                          "pressure explains a straggler")
    straggler_pressure_cap: float = Field(0.65, ge=0, le=1, description="most a straggler explained by its host's "
                                          "pressure scores (degraded: the host, not the GPU)")
    pending_score: float = Field(0.6, ge=0, le=1, description="score of a pending row remap / page retirement (needs a reset)")
    rate_window_s: float = Field(60.0, gt=0, description="window for error-counter rates")
    counter_persist_steps: int = Field(2, ge=1, description="scrapes within the rate window in which an error "
                                       "counter must have risen before its rate scores (capped at the scrapes the "
                                       "window holds): one burst is a healthy background event, not a rate")
    flaps: tuple[float, float] = Field((1.0, 3.0), description="link-down events within the flap window")
    flap_window_s: float = Field(300.0, gt=0, description="window for link flap counting (dampening)")
    link_recoveries: tuple[float, float] = Field((1.0, 4.0), description="link error recoveries within the flap window")
    link_integrity: tuple[float, float] = Field((1.0, 3.0), description="local link integrity errors within the flap window")
    symbol_errors_per_h: tuple[float, float] = Field((100.0, 2000.0), description="IB symbol errors per hour above own floor")
    rcv_errors_per_h: tuple[float, float] = Field((60.0, 1200.0), description="IB received packets with errors per hour above own floor")
    discards_per_h: tuple[float, float] = Field((600.0, 6000.0), description="IB transmit discards per hour above own floor")
    congestion_ratio: tuple[float, float] = Field((4.0, 12.0), description="transmit wait over own baseline and the fleet median")
    congestion_weight: float = Field(0.65, ge=0, le=1, description="most a congested port scores (congestion is not breakage)")
    link_down_hard_ticks: int = Field(3, ge=1, description="ticks a port stays down before it counts as failed")
    latency_ratio: tuple[float, float] = Field((1.5, 3.0), description="link latency over the tier median and its own floor")
    latency_z_min: float = Field(6.0, description="robust z a link's latency must also exceed")
    flow_ratio: tuple[float, float] = Field((0.92, 0.80), description="coolant flow / rated: concern, saturation")
    flow_drop_own: tuple[float, float] = Field((0.03, 0.10), description="coolant flow below what this loop holds "
                                                                         "when healthy (fraction): concern, saturation")
    supply_excess_c: tuple[float, float] = Field((2.0, 5.0), description="loop supply temp above the peer median, "
                                                                        "over what the loop holds when healthy")
    storage_latency_ratio: tuple[float, float] = Field((2.0, 4.0), description="write latency over path median and own floor")
    storage_budget_ratio: tuple[float, float] = Field((1.0, 4.0), description="p99 write latency over the path's "
                                                      "budget (topology storage_budget_ms)")
    probe_up_min_share: float = Field(0.5, gt=0, le=1, description="share of a path's probers answering below "
                                      "which it has stopped answering (hard)")
    probe_failures: tuple[float, float] = Field((0.0, 2.0), description="failed or hung storage probes within the "
                                                "flap window")
    probers_agree_min: int = Field(2, ge=1, description="probers (and more than half of those reporting) that must "
                                   "see probes fail before the failures are the path's (fewer probers: all of them)")
    supply_over_max_c: tuple[float, float] = Field((-1.0, 3.0), description="loop supply above its design maximum "
                                                   "(topology supply_temp_max_c), °C")
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

    @cached_property
    def gfs(self) -> np.ndarray:  # read several times a tick; the arrays are not changed after construction
        return noisy_or(self.score) if self.score.shape[1] else np.zeros(self.score.shape[0])

    def column(self, channel: str) -> np.ndarray:
        return self.value[:, self.channels.index(channel)]


def _span_s(hist: History, frame: Frame, window_s: float, k: int) -> float:
    # Never divide by less than the full window: a single count just after start-up
    # must not read as a burst.
    return max(frame.t_s - float(hist.times(k)[0]), window_s) if k else window_s


def _rate_per_h(hist: History, name: str, frame: Frame, window_s: float) -> np.ndarray:
    """Counter increase per hour over ``window_s``, including the current frame."""
    cur = frame.get(name)
    w = hist.rows(name, hist.ticks_for(window_s))
    if not w:
        return np.zeros_like(cur)
    return counter_increase([*w, cur]) * 3600.0 / _span_s(hist, frame, window_s, len(w))


def _increase(w: np.ndarray | list[np.ndarray], cur: np.ndarray) -> np.ndarray:
    """Sum of increases over the rows (oldest first) and ``cur``.

    A drop is a counter reset (an exporter or driver restart): counting restarts from
    zero, so the new value is what accrued since the reset. A step across a missing
    sample is not counted at all: a series that comes back after a gap (or appears
    for the first time) at a high value is not a burst.
    """
    return counter_increase([*w, cur])


def _steps_up(hist: History, name: str, frame: Frame, window_s: float) -> np.ndarray:
    """Scrapes within ``window_s`` (the current one included) in which a counter rose; a drop
    to a value above zero (a reset that has counted since) counts as a rise, a missing side never."""
    cur = frame.get(name)
    w = hist.rows(name, hist.ticks_for(window_s))
    out = np.zeros(cur.shape)
    if not w:
        return out
    rows = [*w, cur]
    with np.errstate(invalid="ignore"):
        for a, b in zip(rows[:-1], rows[1:]):
            out += (b > a) | ((b < a) & (b > 0))
    return out


def _persistent(hist: History, frame: Frame, cfg: EvidenceConfig, *names: str) -> np.ndarray:
    """Whether any of the counters rose in enough scrapes of the rate window to be read as a rate."""
    need = min(cfg.counter_persist_steps, hist.ticks_for(cfg.rate_window_s))
    steps = np.maximum.reduce([_steps_up(hist, n, frame, cfg.rate_window_s) for n in names])
    return steps >= need


def _count(hist: History, name: str, frame: Frame, window_s: float) -> np.ndarray:
    cur = frame.get(name)
    w = hist.rows(name, hist.ticks_for(window_s))
    return counter_increase([*w, cur]) if w else np.zeros_like(cur)


def _went_missing(hist: History, name: str, cur: np.ndarray) -> np.ndarray:
    prev = hist.rows(name, 1)
    if not prev:
        return np.zeros(cur.shape, dtype=bool)
    return np.isnan(cur) & ~np.isnan(prev[-1])


def _prev(hist: History, name: str, n: int) -> np.ndarray:
    p = hist.rows(name, 1)
    return p[-1] if p else np.full(n, np.nan)


def _stack(cols: list[np.ndarray]) -> np.ndarray:
    """Columns side by side as an [N, E] array. Laid out column-major: each column is
    written whole (a row-major stack writes every column strided, most of a tick at a
    million entities) and the noisy-OR across channels reads whole columns."""
    return np.stack(cols).T if cols else np.zeros((0, 0))


def _time_fraction(hist: History, name: str, frame: Frame, window_s: float) -> np.ndarray:
    """Share of wall time a violation counter (microseconds) ran over the window; NaN if unseen."""
    cur = frame.get(name)
    w = hist.rows(name, hist.ticks_for(window_s))
    if not w or not np.isfinite(cur).any():
        return np.full_like(cur, np.nan)
    span = max(frame.t_s - float(hist.times(len(w))[0]), 1e-9)
    inc = counter_increase([*w, cur])
    seen = np.isfinite(cur) & np.logical_or.reduce([np.isfinite(r) for r in w])
    return np.where(seen, np.clip(inc / (span * 1e6), 0.0, 1.0), np.nan)


# ---- GPU -------------------------------------------------------------------------------------
def _thermal(fleet: Fleet, frame: Frame, hist: History, base: Baselines, bcfg: BaselineConfig,
             cfg: EvidenceConfig, learn: np.ndarray, dt_s: float):
    """Die temperature against its own learned rise-over-coolant, rack common mode removed.

    Returns (drift °C, z, warm mask, drift rate °C/s, updated GpuBaseline fields, fleet slope, its count).
    """
    g = base.gpu
    temp = frame.get("DCGM_FI_DEV_GPU_TEMP")
    power = frame.get("DCGM_FI_DEV_POWER_USAGE")
    # The die lags power by its thermal time constant: judge it against power passed
    # through that lag, and trust the prediction less while a power change settles.
    kf = 1.0 - np.exp(-max(dt_s, 0.0) / bcfg.die_tau_s)
    inlet = frame.get("seamguard_rack_inlet_temp_c")[fleet.gpu_rack] if fleet.count(Kind.RACK) else np.nan
    supply = frame.get("seamguard_coolant_supply_temp_c")[fleet.gpu_loop] if fleet.count(Kind.COOLING_LOOP) else np.nan
    ref = np.where(np.isfinite(inlet), inlet, np.where(np.isfinite(supply), supply, 0.0))
    x = temp - ref
    b0 = base.r_th
    lam = bcfg.slope_prior_w ** 2
    b = (g.px_cov + lam * b0) / (g.p_var + lam)
    a = g.x_mean - b * g.p_mean
    warm = (g.n >= bcfg.warm_samples) & np.isfinite(g.x_mean)
    # After a gap in its power series (a driver update, a reboot, an exporter outage) the die's
    # thermal state is unknown: it is read back from the die itself, as the power that its own
    # fit says its temperature is settled at, and the lag runs on from there.
    with np.errstate(invalid="ignore", divide="ignore"):
        p_die = np.clip((x - a) / b, 0.0, None)
    p_prev = np.where(np.isfinite(g.p_filt), g.p_filt, np.where(warm & (b > 0) & np.isfinite(p_die), p_die, np.nan))
    p_eff = np.where(np.isfinite(p_prev), p_prev + kf * (power - p_prev), power)
    p_filt = np.where(np.isfinite(power), p_eff, np.nan).astype(np.float32)
    unsettled = np.nan_to_num(np.abs(power - p_eff))
    ok = np.isfinite(x) & np.isfinite(p_eff)
    e = x - (a + b * p_eff)
    # Common mode of the GPU's rack (same coolant, same rack heat): removed, so a
    # coolant swing or a rack-wide load change is nobody's drift. A rack with fewer
    # than 3 warm GPUs borrows its loop's. This is no peer verdict (the verdict is the GPU's
    # own baseline) and the GPU is one of those the shared cause moves, so it counts in the
    # median: with it left out, half a rack of GPUs that run warm by design read as drift
    # whenever their load changed (docs/evidence.md, "Peer groups and parents").
    # A GPU still settling after a power change (more of it unsettled than a drift that counts)
    # is no sample of the common mode: with half a rack warming back up after a pause, the median
    # would sit between the halves and the other half would read as drift.
    settling = b0 * unsettled >= cfg.thermal_drift_c[0]
    ew_ = np.where(warm & ok & ~settling, e, np.nan)
    n_r, n_l = fleet.count(Kind.RACK), fleet.count(Kind.COOLING_LOOP)
    c_rack = group_median(ew_, fleet.gpu_rack, n_r) if n_r else np.zeros(0)
    cnt_rack = np.bincount(fleet.gpu_rack, weights=np.isfinite(ew_), minlength=n_r) if n_r else np.zeros(0)
    c_loop = group_median(ew_, fleet.gpu_loop, n_l) if n_l else np.zeros(0)
    c = np.where(cnt_rack[fleet.gpu_rack] >= 3, c_rack[fleet.gpu_rack], c_loop[fleet.gpu_loop]) \
        if n_r and n_l else np.zeros(len(e))
    c = np.nan_to_num(c, nan=0.0)
    d = e - c
    sb = bcfg.slope_spread * b0 * np.sqrt(lam / (g.p_var + lam))
    sd = np.maximum(1.2533 * g.noise, cfg.drift_noise_floor_c)
    sd_eff = np.sqrt(sd ** 2 + (sb * np.nan_to_num(p_eff - g.p_mean)) ** 2
                     + (bcfg.transient_weight * b0 * unsettled) ** 2)
    z = d / sd_eff
    # Far outside the operating range the fit was learned on (a drained GPU idles, a new job
    # draws more) the fit extrapolates: no verdict there until the range has been learned.
    # An idle GPU (a drained node, a job between steps) is judged and taught at load only.
    spread_w = np.sqrt(np.maximum(np.nan_to_num(g.p_var), 0.0))
    in_range = np.abs(np.nan_to_num(p_eff - g.p_mean)) <= np.maximum(3.0 * spread_w, bcfg.operating_range_w)
    util = frame.get("DCGM_FI_DEV_GPU_UTIL")
    busy = np.where(np.isfinite(util), util >= bcfg.busy_util_pct, True)
    judged = warm & in_range & busy

    # Learn: winsorised to the baseline ± k sigma once warm; the common mode is not the GPU's.
    k = bcfg.learn_clip_sigma
    d_l = np.where(warm, np.clip(d, -k * sd_eff, k * sd_eff), d)
    x_l = np.where(warm, a + b * p_eff + d_l, x - c)
    lrn = learn & ok & busy
    al = alpha(g.n, dt_s, bcfg.half_life_s, bcfg.warm_samples)
    dp = np.nan_to_num(p_eff - g.p_mean)
    dx = np.nan_to_num(x_l - g.x_mean)
    first = ~np.isfinite(g.p_mean)
    p_mean = ew(g.p_mean, p_eff, al, lrn)
    x_mean = ew(g.x_mean, x_l, al, lrn)
    upd = lrn & ~first
    p_var = np.where(upd, (1 - al) * (g.p_var + al * dp * dp), g.p_var).astype(np.float32)
    px_cov = np.where(upd, (1 - al) * (g.px_cov + al * dp * dx), g.px_cov).astype(np.float32)
    # The noise learns from ordinary samples only (an outlier is not noise).
    an = alpha(g.n, dt_s, bcfg.noise_half_life_s, bcfg.warm_samples)
    noise = ew(g.noise, np.abs(d), an, lrn & (~warm | (np.abs(d) <= k * sd_eff)))
    n_new = count_up(g.n, lrn)
    # Rate of change of the drift (°C/s), smoothed over a few samples.
    rate_now = (d - g.drift) / max(dt_s, 1e-9)
    drift_rate = np.where(np.isfinite(rate_now) & warm, g.drift_rate + 0.4 * (rate_now - g.drift_rate),
                          np.where(warm, g.drift_rate, 0.0)).astype(np.float32)
    drift_last = np.where(ok & warm, d, np.nan).astype(np.float32)

    # The fleet's slope, across GPUs: busy quartile against idle quartile.
    r_th, r_n = base.r_th, base.r_th_n
    if ok.sum() >= 8:
        pv, xv = p_eff[ok], x[ok]
        lo_q, hi_q = np.quantile(pv, [0.25, 0.75])
        lo, hi = pv <= lo_q, pv >= hi_q
        gap = float(np.median(pv[hi]) - np.median(pv[lo]))
        if gap >= bcfg.fleet_slope_min_split_w:
            s_t = float(np.median(xv[hi]) - np.median(xv[lo])) / gap
            if 0.0 < s_t < 1.0:
                af = float(alpha(np.array([r_n]), dt_s, bcfg.half_life_s, bcfg.warm_samples)[0])
                r_th, r_n = (r_th + af * (s_t - r_th)), r_n + 1
    fields = dict(n=n_new, p_filt=p_filt, p_mean=p_mean, x_mean=x_mean, p_var=p_var, px_cov=px_cov, noise=noise,
                  drift=drift_last, drift_rate=drift_rate)
    return np.where(judged, d, np.nan), np.where(judged, z, np.nan), warm, drift_rate, fields, r_th, r_n


def gpu_evidence(fleet: Fleet, frame: Frame, hist: History, cfg: EvidenceConfig,
                 loop_gfs: np.ndarray, base: Baselines | None = None,
                 bcfg: BaselineConfig | None = None, learn: np.ndarray | None = None,
                 dt_s: float | None = None) -> tuple[Evidence, GpuBaseline, float, int]:
    bcfg = bcfg or BaselineConfig()
    base = base or Baselines.initial(fleet, bcfg)
    dt_s = base.dt(frame.t_s, hist.tick_s) if dt_s is None else dt_s
    n = fleet.count(Kind.GPU)
    learn = np.ones(n, dtype=bool) if learn is None else learn
    g = base.gpu
    temp = frame.get("DCGM_FI_DEV_GPU_TEMP")
    clock = frame.get("DCGM_FI_DEV_SM_CLOCK")
    compute = frame.get("seamguard_rank_compute_seconds")
    xid = frame.get("DCGM_FI_DEV_XID_ERRORS")
    power = frame.get("DCGM_FI_DEV_POWER_USAGE")

    # Facilities first-class: a loop losing flow raises the risk of every GPU it cools.
    loop_share = cfg.facility_weight * loop_gfs[fleet.gpu_loop]
    # Root cause: thermal symptoms on a loop that is itself in trouble are the loop's,
    # not each GPU's; the loop's share stands for them.
    explained = loop_share >= 0.3

    # Peers: GPUs of the same job (idle GPUs form group 0). A clock is judged only at load,
    # against the clocks of its job's GPUs at load: an idle GPU parks its clock by design, and
    # a GPU the job has left (a requeue, a move, a drain) or not reached yet is idle whatever
    # its neighbours run at. Out of a job, or under busy utilisation where that is reported:
    # no clock verdict, and no one's peer.
    job_group = fleet.gpu_job + 1
    n_jobs = len(fleet.job_names) + 1
    util = frame.get("DCGM_FI_DEV_GPU_UTIL")
    at_load = (fleet.gpu_job >= 0) & np.where(np.isfinite(util), util >= bcfg.busy_util_pct, True)
    clock = np.where(at_load, clock, np.nan)
    # The other GPUs of the job at load (never itself); fewer than 3: no peer verdict.
    clock_med, clock_peers = loo_median(clock, job_group, n_jobs)
    clock_med = np.where(clock_peers >= 3, clock_med, np.nan)
    rel = clock / clock_med
    # Too few job peers: its own clock at load once learned (its own history).
    own_cw = g.clock_own_n >= bcfg.warm_samples
    raw_deficit = np.where(np.isfinite(rel), 1.0 - rel, np.where(own_cw, 1.0 - clock / g.clock_own, np.nan))

    # Thermal throttling that happens: the violation counter runs and the clock is down.
    viol = _time_fraction(hist, "DCGM_FI_DEV_THERMAL_VIOLATION", frame, cfg.rate_window_s)
    headroom = fleet.gpu_throttle_temp_c - temp
    clock_down = raw_deficit >= cfg.clock_deficit[0]
    throttling = np.where(np.isfinite(viol), (viol > 0) & clock_down, (headroom <= 0.5) & clock_down)
    s_throttle = np.where(throttling, np.where(np.isfinite(viol), ramp(viol, *cfg.throttle_fraction), 1.0), 0.0)
    s_throttle = np.where(throttling, np.maximum(s_throttle, 0.5), 0.0)

    # Own baseline: thermal drift. A throttling GPU or one on a loop in trouble does not teach it.
    drift, z_drift, warm, drift_rate, tfields, r_th, r_n = _thermal(
        fleet, frame, hist, base, bcfg, cfg, learn & ~throttling & ~explained, dt_s)
    # Work is not a fault: a drift the GPU's job peers share (a heavier phase of the workload, a
    # load change its power does not explain yet) is the job's, not a worn interface. Each GPU is
    # judged on the drift above the median of the other GPUs of its job (3 or more: else its own).
    peer_drift, drift_peers = loo_median(np.where(fleet.gpu_job >= 0, drift, np.nan), job_group, n_jobs)
    shared = np.where((fleet.gpu_job >= 0) & (drift_peers >= 3), np.clip(np.nan_to_num(peer_drift), 0.0, None), 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        z_drift = np.where(drift > 0, z_drift * np.clip(drift - shared, 0.0, None) / drift, z_drift)
    drift = drift - shared
    strength = np.minimum(ramp(z_drift, *cfg.thermal_drift_z), ramp(drift, *cfg.thermal_drift_c))
    u_head = ramp(cfg.thermal_warn_headroom_c - headroom, 0.0, cfg.thermal_warn_headroom_c - cfg.thermal_crit_headroom_c)
    rising = (drift_rate > 0) & (headroom > 0)
    ttt = np.where(rising, headroom / np.maximum(drift_rate, 1e-9), np.inf)
    t_warn, t_crit = cfg.time_to_throttle_s
    u_ttt = np.where(rising, ramp(t_warn - ttt, 0.0, t_warn - t_crit), 0.0)
    urgency = np.maximum(u_head, u_ttt)
    w = cfg.thermal_drift_weight
    s_drift = strength * (w + (1.0 - w) * urgency)

    # Against the rack, what power does not explain: shown as data, never scored. Without a
    # history a GPU that always runs hot cannot be told from one that just got hot; its own
    # baseline (which knows its spread) and throttling that happens are what count.
    residual = temp - cfg.gpu_r_th_c_per_w * np.nan_to_num(power, nan=0.0)
    z_temp, _, _ = loo_robust_z(residual, fleet.gpu_rack, fleet.count(Kind.RACK), floor=cfg.peer_z_floor_c)
    s_temp_peer = np.zeros(n)

    # Clocks against job peers, less the GPU's own steady offset (silicon spread) once learned.
    busy = (fleet.gpu_job >= 0) & np.isfinite(rel)
    cw = g.clock_n >= bcfg.warm_samples
    offset = np.where(cw & np.isfinite(rel),
                      np.clip(1.0 - np.nan_to_num(g.clock_rel, nan=1.0), 0.0, cfg.clock_offset_cap), 0.0)
    deficit = raw_deficit - offset
    s_clock = ramp(deficit, *cfg.clock_deficit)
    clearn = learn & busy & ~throttling & ~explained & (s_clock < 0.2)
    c_sample = np.where(cw, np.clip(rel, g.clock_rel - bcfg.clock_clip, g.clock_rel + bcfg.clock_clip), rel)
    clock_rel_new = ew(g.clock_rel, c_sample, alpha(g.clock_n, dt_s, bcfg.half_life_s, bcfg.warm_samples), clearn)
    clock_n_new = count_up(g.clock_n, clearn & np.isfinite(rel))
    olearn = learn & at_load & np.isfinite(clock) & ~throttling & ~explained & (s_clock < 0.2)
    o_lo, o_hi = g.clock_own * (1 - bcfg.clock_clip), g.clock_own * (1 + bcfg.clock_clip)
    o_sample = np.where(own_cw, np.clip(clock, o_lo, o_hi), clock)
    clock_own_new = ew(g.clock_own, o_sample, alpha(g.clock_own_n, dt_s, bcfg.half_life_s, bcfg.warm_samples), olearn)
    clock_own_n_new = count_up(g.clock_own_n, olearn)

    # Normalise compute time by the GPU's own clock: a throttled GPU is slow because of its
    # clock (thermal and clock evidence cover it); a fail-slow GPU is slow at full clock,
    # which is what this channel is for. compute x clock is the step's work in cycles, the
    # same for every rank of the job whatever its clock; it is put back in seconds at one
    # clock for the whole fleet, which cancels when a rank is compared with its job's others.
    # Never each GPU's leave-one-out median clock: with half a job throttled that median is
    # the throttled half's clock for each healthy GPU alone, and the healthy half read slow.
    seen = clock[np.isfinite(clock)]
    ref_clock = float(np.median(seen)) if seen.size else np.nan
    compute = np.where(clock_peers >= 3, compute * clock / ref_clock, np.nan)
    z_comp, comp_med, _ = loo_robust_z(compute, job_group, n_jobs, floor=1e-3)
    excess = compute / comp_med - 1.0
    s_compute = np.where(z_comp >= 4.0, ramp(excess, *cfg.compute_excess), 0.0)

    s_throttle = np.where(explained, 0.0, s_throttle)
    s_drift = np.where(explained, 0.0, s_drift)
    s_clock = np.where(explained, 0.0, s_clock)
    s_temp_peer = np.where(explained, 0.0, s_temp_peer)

    # Power capping above the GPU's own floor and its job peers', with the clock down: a
    # power brake. A job-wide cap (an operator's power limit) moves the peers too.
    cnt_warm = g.counter_n >= bcfg.warm_samples
    pv = _time_fraction(hist, "DCGM_FI_DEV_POWER_VIOLATION", frame, cfg.rate_window_s)
    pv_med, pv_peers = loo_median(pv, job_group, n_jobs)
    pv_med = np.where(pv_peers >= 3, pv_med, np.nan)  # too few peers: its own floor alone
    pv_excess = np.minimum(pv - g.power_viol_floor, pv - np.nan_to_num(pv_med, nan=0.0))
    s_power = np.where(cnt_warm & clock_down, w * ramp(pv_excess, *cfg.power_violation), 0.0)

    # Error counters: rates above the GPU's own floor (the floor counts once warm).
    def above(rate: np.ndarray, floor: np.ndarray) -> np.ndarray:
        return rate - np.where(cnt_warm, floor, 0.0)

    # A rate scores only when the counter rose in several scrapes of the window: a healthy
    # link or memory corrects a burst now and then, a failing one keeps counting.
    sbe = _rate_per_h(hist, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", frame, cfg.rate_window_s)
    s_sbe = np.where(_persistent(hist, frame, cfg, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
                     ramp(above(sbe, g.sbe_floor), *cfg.sbe_rate_per_h), 0.0)
    remap = _count(hist, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", frame, cfg.rate_window_s)
    s_remap = ramp(remap, *cfg.remapped_rows)
    pcie = _rate_per_h(hist, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", frame, cfg.rate_window_s)
    s_pcie = np.where(_persistent(hist, frame, cfg, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),
                      ramp(above(pcie, g.pcie_floor), *cfg.pcie_replays_per_h), 0.0)
    crc_names = ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL")
    crc = sum(_rate_per_h(hist, name, frame, cfg.rate_window_s) for name in crc_names)
    s_nvlink = np.where(_persistent(hist, frame, cfg, *crc_names), ramp(above(crc, g.nvlink_floor), *cfg.nvlink_crc_per_h), 0.0)
    # Replays and recoveries by persistence: one is a link that recovered (NVLink retrains by
    # design); several within the flap window are a link that keeps failing.
    recoveries = (_count(hist, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", frame, cfg.flap_window_s)
                  + _count(hist, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", frame, cfg.flap_window_s))
    s_recover = ramp(recoveries, *cfg.nvlink_recoveries)

    # What the node agent sees around the GPU, its PCIe link, why its clock is held.
    pcie_load = np.isfinite(util) & (util >= bcfg.busy_util_pct)
    nc = node_channels(fleet, frame, hist, cfg, g, learn & ~np.isnan(temp), cnt_warm, pcie_load, deficit,
                       alpha(g.counter_n, dt_s, bcfg.half_life_s, bcfg.warm_samples), bcfg.counter_floor_margin,
                       _FATAL, _WARNING)
    # A straggler on a host under pressure (PSI, OOM kills) is the host's: degraded at most.
    pressured = np.nan_to_num(nc.host_pressure) >= cfg.host_pressure_explains
    s_compute = np.where(pressured, np.minimum(s_compute, cfg.straggler_pressure_cap), s_compute)

    # Uncorrectable errors: a double-bit error (or a page retired for one) appearing is hard.
    dbe = _count(hist, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", frame, cfg.rate_window_s) + \
        _count(hist, "DCGM_FI_DEV_RETIRED_DBE", frame, cfg.rate_window_s)
    dbe_event = dbe > 0
    s_dbe = np.where(dbe_event, 1.0, 0.0)
    # Memory that needs a reset (a remap or a retirement pending, rows remapped after an
    # uncorrectable error) is degraded; a failed remap (no spare rows left) is hard.
    pending = (np.nan_to_num(frame.get("DCGM_FI_DEV_ROW_REMAP_PENDING")) >= 1) | \
        (np.nan_to_num(frame.get("DCGM_FI_DEV_RETIRED_PENDING")) >= 1) | \
        (_count(hist, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", frame, cfg.rate_window_s) > 0) | \
        (_count(hist, "DCGM_FI_DEV_RETIRED_SBE", frame, cfg.rate_window_s) > 0)
    rfail = frame.get("DCGM_FI_DEV_ROW_REMAP_FAILURE")
    remap_failed = np.nan_to_num(rfail) >= 1
    rfail_prev = _prev(hist, "DCGM_FI_DEV_ROW_REMAP_FAILURE", n)
    remap_failed_now = remap_failed & ~(np.nan_to_num(rfail_prev, nan=1.0) >= 1)
    s_row = np.where(remap_failed, 1.0, np.where(pending, cfg.pending_score, 0.0))

    # DCGM's last-XID gauge and the kernel log's XID counts, one event where both saw it.
    prev_xid = _prev(hist, "DCGM_FI_DEV_XID_ERRORS", n)
    fatal_level = np.isin(xid, FATAL_XIDS) | nc.xid_fatal_recent
    s_xid = np.where(nc.xid_warning_new, 0.7, 0.0)
    s_xid = np.where(fatal_level, 1.0, s_xid)

    # A GPU that stops reporting while the rest of its node still does fell off the bus.
    gone = np.isnan(temp)
    node_reporting = np.bincount(fleet.gpu_node, weights=~gone, minlength=fleet.count(Kind.NODE)) > 0
    off_bus = gone & node_reporting[fleet.gpu_node]
    went = _went_missing(hist, "DCGM_FI_DEV_GPU_TEMP", temp)
    s_missing = np.where(off_bus, 1.0, np.where(gone, cfg.missing_node_score, 0.0))

    # Counter floors learn from samples whose channel is quiet.
    clearn_cnt = learn & ~gone
    ac = alpha(g.counter_n, dt_s, bcfg.half_life_s, bcfg.warm_samples)
    m = bcfg.counter_floor_margin
    sbe_floor = floor_step(g.sbe_floor, sbe, ac, clearn_cnt & (s_sbe < 0.2), m * cfg.sbe_rate_per_h[0])
    pcie_floor = floor_step(g.pcie_floor, pcie, ac, clearn_cnt & (s_pcie < 0.2), m * cfg.pcie_replays_per_h[0])
    nvlink_floor = floor_step(g.nvlink_floor, crc, ac, clearn_cnt & (s_nvlink < 0.2), m * cfg.nvlink_crc_per_h[0])
    pv_floor = floor_step(g.power_viol_floor, pv, ac, clearn_cnt & (s_power < 0.2) & np.isfinite(pv),
                          m * cfg.power_violation[0])
    counter_n = count_up(g.counter_n, clearn_cnt)

    new = GpuBaseline(clock_n=clock_n_new, clock_rel=clock_rel_new, clock_own_n=clock_own_n_new,
                      clock_own=clock_own_new, counter_n=counter_n, sbe_floor=sbe_floor,
                      pcie_floor=pcie_floor, nvlink_floor=nvlink_floor, power_viol_floor=pv_floor, **tfields,
                      **nc.baseline)
    warming = (~warm).astype(float)
    cols = [
        ("thermal_throttle", "fraction", s_throttle, np.nan_to_num(viol, nan=throttling.astype(float))),
        ("thermal_drift", "celsius", s_drift, drift),
        ("cooling_loop", "gfs", loop_share, loop_gfs[fleet.gpu_loop]),
        ("clock_deficit", "fraction", s_clock, deficit),
        ("compute_excess", "fraction", s_compute, excess),
        ("temp_peer_z", "z", s_temp_peer, z_temp),
        ("power_violation", "fraction", s_power, pv_excess),
        ("sbe_rate", "per_hour", s_sbe, sbe),
        ("remapped_rows", "rows", s_remap, remap),
        ("pcie_replays", "per_hour", s_pcie, pcie),
        ("nvlink_errors", "per_hour", s_nvlink, crc),
        ("nvlink_recoveries", "events", s_recover, recoveries),
        ("ecc_uncorrectable", "errors", s_dbe, dbe),
        ("row_remap", "state", s_row, pending + 2.0 * remap_failed),
        ("xid", "xid", s_xid, xid),
        ("missing", "bool", s_missing, gone.astype(float)),
        ("headroom", "celsius", np.zeros(n), headroom),
        *nc.columns,
        ("warming", "bool", np.zeros(n), warming),
    ]
    ev = Evidence(
        kind=Kind.GPU, channels=tuple(c[0] for c in cols), units=tuple(c[1] for c in cols),
        score=_stack([c[2] for c in cols]), value=_stack([np.asarray(c[3], dtype=float) for c in cols]),
        hard_event=nc.xid_fatal_new | (off_bus & went) | dbe_event | remap_failed_now | nc.hard_event,
        hard_level=fatal_level | off_bus | dbe_event | remap_failed | nc.hard_level,
    )
    return ev, new, r_th, r_n


# ---- NIC -------------------------------------------------------------------------------------
def nic_evidence(fleet: Fleet, frame: Frame, hist: History, cfg: EvidenceConfig,
                 base: Baselines | None = None, bcfg: BaselineConfig | None = None,
                 learn: np.ndarray | None = None, dt_s: float | None = None) -> tuple[Evidence, NicBaseline]:
    bcfg = bcfg or BaselineConfig()
    base = base or Baselines.initial(fleet, bcfg)
    dt_s = base.dt(frame.t_s, hist.tick_s) if dt_s is None else dt_s
    b = base.nic
    n = fleet.count(Kind.NIC)
    learn = np.ones(n, dtype=bool) if learn is None else learn
    state = frame.get("node_infiniband_state_id")
    phys = frame.get("node_infiniband_physical_state_id")

    def is_down(st: np.ndarray, ph: np.ndarray) -> np.ndarray:
        return (~np.isnan(st) & (st != 4)) | (~np.isnan(ph) & (ph != 5))

    down = is_down(state, phys)
    k = cfg.link_down_hard_ticks - 1
    ws, wp = hist.window("node_infiniband_state_id", k), hist.window("node_infiniband_physical_state_id", k)
    if k == 0:
        down_for_good = down
    elif ws is not None and ws.shape[0] == k:
        wp = wp if wp is not None and wp.shape == ws.shape else np.full_like(ws, np.nan)
        down_for_good = down & is_down(ws, wp).all(axis=0)
    else:
        down_for_good = np.zeros_like(down)
    warm = b.n >= bcfg.warm_samples

    def above(rate: np.ndarray, floor: np.ndarray) -> np.ndarray:
        return rate - np.where(warm, floor, 0.0)

    flaps = _count(hist, "node_infiniband_link_downed_total", frame, cfg.flap_window_s)
    recov = _count(hist, "node_infiniband_link_error_recovery_total", frame, cfg.flap_window_s)
    integ = _count(hist, "node_infiniband_local_link_integrity_errors_total", frame, cfg.flap_window_s)
    symbol = _rate_per_h(hist, "node_infiniband_symbol_error_total", frame, cfg.rate_window_s)
    rcv = _rate_per_h(hist, "node_infiniband_port_errors_received_total", frame, cfg.rate_window_s)
    disc = _rate_per_h(hist, "node_infiniband_port_discards_transmitted_total", frame, cfg.rate_window_s)
    wait = _rate_per_h(hist, "node_infiniband_port_transmit_wait_total", frame, cfg.rate_window_s) / 3600.0
    s_down = np.where(down, 0.6, 0.0)
    s_flaps = ramp(flaps, *cfg.flaps)
    s_symbol = ramp(above(symbol, b.symbol_floor), *cfg.symbol_errors_per_h)
    s_errors = noisy_or(np.stack([ramp(recov, *cfg.link_recoveries), ramp(integ, *cfg.link_integrity),
                                  ramp(above(rcv, b.rcv_err_floor), *cfg.rcv_errors_per_h)], axis=1))
    # Congestion (incast, a hot spine): waiting for credits far more than its own normal and
    # than the other ports', or dropping what it cannot send. Scored as a degraded port at most.
    # Work is not a fault: both normals are those of its node's load class (idle or at work).
    reporting = np.isfinite(frame.get("node_infiniband_port_transmit_wait_total"))
    work = node_at_work(fleet, frame.get("DCGM_FI_DEV_GPU_UTIL"), bcfg.busy_util_pct)[fleet.nic_node]
    ratio, eps = wait_ratio(b, wait, reporting, work, fleet.node_job[fleet.nic_node], len(fleet.job_names), bcfg)
    s_cong = cfg.congestion_weight * np.maximum(ramp(ratio, *cfg.congestion_ratio),
                                                ramp(above(disc, b.discard_floor), *cfg.discards_per_h))
    gone = np.isnan(state)
    # A port gone while a sibling port still reports fell off its host. Every port of a node gone
    # while the node's GPUs still report is the host's exporter (a restart, a hang): a telemetry
    # gap, kept as data and never scored. A host that goes dark takes its GPUs' series too.
    nodes = fleet.count(Kind.NODE)
    ports_seen = np.bincount(fleet.nic_node, weights=~gone, minlength=nodes) > 0
    gpus_seen = np.bincount(fleet.gpu_node, weights=np.isfinite(frame.get("DCGM_FI_DEV_GPU_TEMP")),
                            minlength=nodes) > 0
    exporter_gap = gone & ~ports_seen[fleet.nic_node] & gpus_seen[fleet.nic_node]
    s_missing = np.where(gone & ~exporter_gap, cfg.missing_node_score, 0.0)

    ok = learn & ~gone & ~down
    a = alpha(b.n, dt_s, bcfg.half_life_s, bcfg.warm_samples)
    m = bcfg.counter_floor_margin
    new = NicBaseline(
        n=count_up(b.n, ok),
        symbol_floor=floor_step(b.symbol_floor, symbol, a, ok & (s_symbol < 0.2), m * cfg.symbol_errors_per_h[0]),
        rcv_err_floor=floor_step(b.rcv_err_floor, rcv, a, ok & (s_errors < 0.2), m * cfg.rcv_errors_per_h[0]),
        discard_floor=floor_step(b.discard_floor, disc, a, ok & (s_cong < 0.2), m * cfg.discards_per_h[0]),
        **wait_step(b, wait, work, ok & reporting & (s_cong < 0.2), dt_s, eps, cfg.congestion_ratio[0] / 2, bcfg),
    )
    n_w = (~warm).astype(float)
    ev = Evidence(
        kind=Kind.NIC,
        channels=("link_down", "flaps", "symbol_errors", "link_errors", "congestion", "missing", "warming"),
        units=("state", "events", "per_hour", "events", "ratio", "bool", "bool"),
        score=_stack([s_down, s_flaps, s_symbol, s_errors, s_cong, s_missing, np.zeros(n)]),
        value=_stack([state, flaps, symbol, recov + integ, ratio, gone.astype(float), n_w]),
        hard_event=down_for_good, hard_level=down_for_good,
    )
    return ev, new


# ---- links, facilities, storage ----------------------------------------------------------------
def link_evidence(fleet: Fleet, frame: Frame, cfg: EvidenceConfig, base: Baselines | None = None,
                  bcfg: BaselineConfig | None = None, learn: np.ndarray | None = None,
                  dt_s: float = 0.0):
    bcfg = bcfg or BaselineConfig()
    base = base or Baselines.initial(fleet, bcfg)
    lat = frame.get("seamguard_fabric_link_latency_us")
    n = len(lat)
    tier = (fleet.link_nic < 0).astype(np.int64)  # 0: NIC-leaf, 1: leaf-spine
    z, med, _ = loo_robust_z(lat, tier, 2, floor=0.05)
    ratio = lat / med
    peered = np.isfinite(med)
    s_peer = np.where(z >= cfg.latency_z_min, ramp(ratio, *cfg.latency_ratio), 0.0)
    learn = np.ones(n, dtype=bool) if learn is None else learn
    new, own, warm = latency_step(base.link, lat, learn & (s_peer < 0.2), dt_s, bcfg)
    # Slower than its tier *and* than its own floor: a link that was always a little
    # slower (longer cable, other optics) is its own normal. Fewer than 3 other links in
    # its tier: its own floor alone (no verdict until that is learned).
    s_own = ramp(own, *cfg.latency_ratio)
    s = np.where(warm, np.where(peered, np.minimum(s_peer, s_own), s_own), s_peer)
    none = np.zeros(n, dtype=bool)
    return Evidence(Kind.LINK, ("latency", "latency_own", "warming"), ("ratio", "ratio", "bool"),
                    _stack([s, np.zeros(n), np.zeros(n)]), _stack([ratio, own, (~warm).astype(float)]),
                    none, none), new


def loop_evidence(fleet: Fleet, frame: Frame, cfg: EvidenceConfig, base: Baselines | None = None,
                  bcfg: BaselineConfig | None = None, learn: np.ndarray | None = None, dt_s: float = 0.0):
    """Coolant flow against the loop's rating and against what it holds when healthy; supply vs peers.

    A CDU's pumps hold its flow steady, so a sustained drop below the loop's own learned
    flow is the earliest sign of a pump, valve or filter going: it is seen at the first
    sample, before the flow falls far enough below the rating to matter on its own.
    CDUs hold different supply setpoints, so a loop's supply is judged by how far its
    excess over the peer-loop median has risen above the excess it holds when healthy (no
    verdict until that is learned). Returns the evidence and the new (flow, supply) baselines.
    """
    bcfg = bcfg or BaselineConfig()
    base = base or Baselines.initial(fleet, bcfg)
    flow = frame.get("seamguard_coolant_flow_lpm")
    supply = frame.get("seamguard_coolant_supply_temp_c")
    ratio = flow / fleet.loop_rated_flow_lpm
    hi, lo = cfg.flow_ratio
    s_flow = ramp(hi - ratio, 0.0, hi - lo)
    n = len(flow)
    med, peers = loo_median(supply, np.zeros(n, dtype=np.int64), 1)
    excess = np.where(peers >= 3, supply - med, np.nan)  # the other loops' median; too few: no peer verdict
    gone = np.isnan(flow)
    s_missing = np.where(gone, cfg.missing_node_score, 0.0)
    learn = np.ones(n, dtype=bool) if learn is None else learn
    d_lo, d_hi = cfg.flow_drop_own
    # A loop teaches its baseline only while it holds its flow (no drop of concern, not below rating).
    with np.errstate(invalid="ignore"):
        held = (base.loop.n < bcfg.warm_samples) | ~(1.0 - flow / np.exp(base.loop.log_lat) >= d_lo)
    new, own, warm = latency_step(base.loop, flow, learn & held & (s_flow == 0), dt_s, bcfg)
    drop = np.where(warm, 1.0 - own, 0.0)
    s_own = ramp(drop, d_lo, d_hi)
    # A loop teaches its supply offset only while its supply is not in excess of it.
    with np.errstate(invalid="ignore"):
        calm = (base.loop_supply.n < bcfg.warm_samples) | ~(excess - base.loop_supply.mean >= cfg.supply_excess_c[0])
    new_supply, rise, s_warm = offset_step(base.loop_supply, excess, learn & calm, dt_s, bcfg)
    s_supply = ramp(np.where(s_warm, rise, 0.0), *cfg.supply_excess_c)
    # The design envelope: the supply the loop is built for (its ASHRAE class), absolute.
    over_max = supply - fleet.supply_temp_max_c
    s_limit = ramp(over_max, *cfg.supply_over_max_c)
    none = np.zeros(n, dtype=bool)
    return Evidence(Kind.COOLING_LOOP, ("flow_ratio", "flow_own", "supply_excess", "supply_limit", "missing"),
                    ("ratio", "ratio", "celsius", "celsius", "bool"),
                    _stack([s_flow, s_own, s_supply, s_limit, s_missing]),
                    _stack([ratio, own, np.where(s_warm, rise, np.nan), over_max, gone.astype(float)]), none, none), \
        (new, new_supply)


def rack_evidence(fleet: Fleet, frame: Frame, cfg: EvidenceConfig) -> Evidence:
    inlet = frame.get("seamguard_rack_inlet_temp_c")
    n = len(inlet)
    z, _, _ = loo_robust_z(inlet, np.zeros(n, dtype=np.int64), 1, floor=cfg.peer_z_floor_c)
    s = ramp(z, *cfg.peer_z)  # fewer than 3 other racks: no verdict (NaN scores 0)
    none = np.zeros(n, dtype=bool)
    return Evidence(Kind.RACK, ("inlet_peer_z",), ("z",), _stack([s]), _stack([z]), none, none)


def storage_evidence(fleet: Fleet, frame: Frame, cfg: EvidenceConfig, base: Baselines | None = None,
                     bcfg: BaselineConfig | None = None, learn: np.ndarray | None = None,
                     dt_s: float = 0.0, hist: History | None = None):
    """Write latency against the other paths, the path's own floor and its budget; the probe's answers.

    A path most of whose probers get no answer (a probe that errors or hangs past its
    timeout) has stopped answering: hard at once, whatever its latency says. Failed probes
    between scrapes count too. ``hist`` (None: no counter history) feeds the failure count.
    """
    bcfg = bcfg or BaselineConfig()
    base = base or Baselines.initial(fleet, bcfg)
    lat = frame.get("seamguard_storage_write_latency_ms")
    n = len(lat)
    med, peers = loo_median(lat, np.zeros(n, dtype=np.int64), 1)
    peered = peers >= 3
    ratio = np.where(peered, lat / med, np.nan)  # over the other paths' median
    s_peer = ramp(ratio, *cfg.storage_latency_ratio)
    over_budget = lat / fleet.storage_budget
    s_abs = ramp(over_budget, *cfg.storage_budget_ratio)
    up = frame.get("seamguard_storage_probe_up")
    down = np.nan_to_num(up, nan=1.0) < cfg.probe_up_min_share
    failures = np.zeros(n) if hist is None else _count(hist, "seamguard_storage_probe_failures_total", frame,
                                                       cfg.flap_window_s)
    # Failed probes are the path's only when a share of its probers see them: at least
    # probers_agree_min and more than half of those reporting (a path with fewer probers: all
    # of them). One prober whose own NIC or mount fails is that node's problem, not the path's.
    # Without the prober counts (a source that does not give them) every failure counts.
    probers, failing = frame.get("seamguard_storage_probers"), frame.get("seamguard_storage_probers_failing")
    known = np.isfinite(probers) & np.isfinite(failing) & (probers >= 1)
    agreed = (failing >= np.minimum(cfg.probers_agree_min, probers)) & (2.0 * failing > probers)
    s_fail = np.where(known & ~agreed, 0.0, ramp(failures, *cfg.probe_failures))
    s_probe = np.maximum(down.astype(float), s_fail)
    learn = np.ones(n, dtype=bool) if learn is None else learn
    new, own, warm = latency_step(base.storage, lat, learn & (s_peer < 0.2) & (s_abs < 0.2) & (s_probe < 0.2), dt_s,
                                  bcfg)
    # Slower than the other paths *and* than its own floor (a path on slower hardware is
    # its own normal); with fewer than 3 other paths there are no peers, so its own floor alone.
    s_own = ramp(own, *cfg.storage_latency_ratio)
    s_rel = np.where(warm, np.where(peered, np.minimum(s_peer, s_own), s_own), s_peer)
    none = np.zeros(n, dtype=bool)
    return Evidence(Kind.STORAGE, ("latency_ratio", "latency_ms", "latency_own", "probe_down", "probe_failures",
                                   "probers_failing", "warming"),
                    ("ratio", "milliseconds", "ratio", "share", "probes", "share", "bool"),
                    _stack([s_rel, s_abs, np.zeros(n), down.astype(float), s_fail, np.zeros(n), np.zeros(n)]),
                    _stack([ratio, lat, own, up, failures, np.where(known, failing / np.maximum(probers, 1.0), np.nan), (~warm).astype(float)]),
                    down, down), new
