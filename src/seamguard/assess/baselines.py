"""Per-entity baselines, learned online: what is normal for *this* GPU, port, link, path.

Pure data and pure update rules; the controller holds the state between ticks and
persists it with the ledger snapshot (``to_arrays`` / ``from_arrays``). Every entity
keeps a fixed number of floats (no lists, no windows), so memory is bounded at any
fleet size: 72 bytes per GPU, 32 per NIC, 8 per link, 20 per storage path, 16 per cooling loop.

Each baseline is an exponentially weighted estimate with a count-based start: the
first samples are averaged evenly (``alpha = 1 / (n + 1)``), later ones with the
half-life in seconds. A baseline gives no verdict until it has ``warm_samples``
samples: until then its entity is *warming* (reported as data, scored 0). Learning is
robust: once warm, a sample is winsorised to the baseline ± ``learn_clip_sigma``
noise before it teaches the baseline, so a fault is not learned as normal (a
persistent shift is accepted only slowly, at most a few sigma per half-life), while
downward surprises (a GPU running cooler) are learned the same way.

What is learned (docs/evidence.md):
- GPU thermal: die temperature rise over its coolant reference as ``a + b * power``
  (per-GPU intercept and slope; the slope is a ridge estimate pulled towards the
  fleet's own slope, which is itself learned across GPUs), and the noise of what is
  left once the rack's common mode is removed; plus the drift's rate of change.
- GPU clock: its clock relative to its job peers at load, and its own clock at load (what
  it is judged by when its job has fewer than 3 other GPUs at load).
- GPU and NIC error counters: each one's floor rate (errors per hour when healthy).
- NIC congestion: its transmit-wait rate, one baseline per load class (its node idle or at
  work): an idle spare's quiet port is no measure of the same port under a job.
- Storage paths: the length of the write bursts (checkpoints) they show while healthy.
- Links and storage paths: log latency (their latency floor).
- Cooling loops: log coolant flow (the flow this loop holds when healthy) and the loop's
  supply temperature over the peer-loop median (CDUs hold different setpoints).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from seamguard.assess.stats import loo_median
from seamguard.fleet.model import Fleet, Kind

F32 = np.float32


class BaselineConfig(BaseModel):
    """How baselines learn (the ``assess.baselines`` section of a policy)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    warm_samples: int = Field(15, ge=2, description="samples an entity's baseline needs before it gives verdicts")
    half_life_s: float = Field(2 * 3600.0, gt=0, description="how fast a warm baseline follows slow healthy change")
    noise_half_life_s: float = Field(3600.0, gt=0, description="how fast the learned noise follows")
    learn_clip_sigma: float = Field(3.0, gt=0, description="a warm sample is winsorised to this many sigma")
    r_th_prior_c_per_w: float = Field(0.05, gt=0, description="fleet slope of die rise per watt before it is learned")
    slope_prior_w: float = Field(40.0, gt=0, description="power spread (W) worth the fleet slope in a GPU's ridge fit")
    slope_spread: float = Field(0.10, ge=0, description="relative uncertainty of a GPU's slope before it sees power change")
    fleet_slope_min_split_w: float = Field(100.0, gt=0, description="power gap between busy and idle GPUs to learn the fleet slope")
    counter_floor_margin: float = Field(0.5, ge=0, description="share of a channel's start threshold a floor may rise by per sample")
    latency_clip: float = Field(1.3, gt=1, description="a warm latency sample is clipped to baseline × / ÷ this")
    clock_clip: float = Field(0.03, gt=0, description="a warm clock sample is clipped to baseline ± this fraction")
    offset_clip_c: float = Field(0.5, gt=0, description="a warm coolant supply offset sample is clipped to "
                                                        "baseline ± this many °C")
    die_tau_s: float = Field(30.0, gt=0, description="time constant of die temperature after a power change")
    operating_range_w: float = Field(150.0, gt=0, description="power this far (or 3 sigma) from the mean a GPU's fit "
                                                              "was learned at is an extrapolation: no drift verdict")
    busy_util_pct: float = Field(10.0, ge=0, le=100, description="utilisation below which a GPU idles (a drained "
                                                                  "node): its thermal fit neither learns nor judges")
    transient_weight: float = Field(0.5, ge=0, description="uncertainty per °C of power change not yet settled")
    burst_prior_s: float = Field(300.0, ge=0, description="how long a storage path may be slow as work (a checkpoint's "
                                                          "write burst) before it has shown a burst of its own")
    burst_margin: float = Field(1.25, ge=1, description="a learned burst length is allowed this many times over")
    burst_cap_s: float = Field(900.0, gt=0, description="a slow run longer than this is never learned as a burst")
    burst_min_count: int = Field(4, ge=1, description="bursts a path must show before its learned length replaces "
                                                      "burst_prior_s as the allowance (when shorter)")
    burst_height_margin: float = Field(2.0, ge=1, description="a slow run higher than this many times the height "
                                                              "of the path's healthy bursts is no burst")


def alpha(n: np.ndarray, dt_s: float, half_life_s: float, warm_samples: int = 0) -> np.ndarray:
    """Per-entity EW weight: 1/(n+1) while the baseline warms (an even average of what it
    has seen), the half-life once it has ``warm_samples`` (0: the half-life's floor only)."""
    decay = 1.0 - 0.5 ** (max(dt_s, 0.0) / half_life_s)
    even = 1.0 / (n.astype(np.float64) + 1.0)
    if warm_samples:
        even = np.where(n < warm_samples, even, 0.0)
    return np.maximum(even, decay)


def ew(old: np.ndarray, new: np.ndarray, a: np.ndarray, learn: np.ndarray) -> np.ndarray:
    """One EW step where ``learn`` (and the sample is finite); unchanged elsewhere."""
    ok = learn & np.isfinite(new)
    start = ~np.isfinite(old)
    with np.errstate(invalid="ignore", over="ignore"):  # where ``new`` is not finite the step is not taken
        step = old + a * (new - old)
    out = np.where(ok & start, new, np.where(ok, step, old))
    return out.astype(F32)


def _z(n: int) -> np.ndarray:
    return np.zeros(n, dtype=F32)


def _nan(n: int) -> np.ndarray:
    return np.full(n, np.nan, dtype=F32)


@dataclass(frozen=True, eq=False)
class GpuBaseline:
    n: np.ndarray  # int32 thermal samples learned
    p_filt: np.ndarray  # W, power through the die's thermal lag
    p_mean: np.ndarray  # W (effective power)
    x_mean: np.ndarray  # °C rise over the coolant reference, common mode removed
    p_var: np.ndarray  # W²
    px_cov: np.ndarray  # W·°C
    noise: np.ndarray  # mean absolute drift (°C)
    drift: np.ndarray  # last drift (°C), for its rate of change
    drift_rate: np.ndarray  # °C/s, EW
    clock_n: np.ndarray  # int32 clock samples learned (at load)
    clock_rel: np.ndarray  # clock / job-peer median, at load
    counter_n: np.ndarray  # int32 counter samples learned
    sbe_floor: np.ndarray  # /h
    pcie_floor: np.ndarray  # /h
    nvlink_floor: np.ndarray  # /h
    power_viol_floor: np.ndarray  # fraction of time power-capped
    clock_own_n: np.ndarray  # int32 own-clock samples learned (at load)
    clock_own: np.ndarray  # MHz at load, EW: the GPU's own clock when it has too few job peers
    pcie_gen_max: np.ndarray  # highest PCIe generation seen at load (NaN: never seen)
    pcie_width_max: np.ndarray  # most PCIe lanes seen at load (NaN: never seen)
    edac_floor: np.ndarray  # /h, the host memory correctable-error floor of the GPU's node

    @classmethod
    def initial(cls, n: int) -> GpuBaseline:
        zi = np.zeros(n, dtype=np.int32)
        return cls(zi, _nan(n), _nan(n), _nan(n), _z(n), _z(n), _z(n), _nan(n), _z(n), zi.copy(), _nan(n), zi.copy(),
                   _z(n), _z(n), _z(n), _z(n), zi.copy(), _nan(n), _nan(n), _nan(n), _z(n))


@dataclass(frozen=True, eq=False)
class NicBaseline:
    n: np.ndarray  # int32 samples learned
    symbol_floor: np.ndarray  # /h
    rcv_err_floor: np.ndarray  # /h
    discard_floor: np.ndarray  # /h
    wait_rate: np.ndarray  # transmit-wait ticks per second, EW, while its node is at work
    wait_busy_n: np.ndarray  # int32 samples wait_rate learned from
    wait_idle: np.ndarray  # transmit-wait ticks per second, EW, while its node idles
    wait_idle_n: np.ndarray  # int32 samples wait_idle learned from

    @classmethod
    def initial(cls, n: int) -> NicBaseline:
        zi = np.zeros(n, dtype=np.int32)
        return cls(zi, _z(n), _z(n), _z(n), _nan(n), zi.copy(), _nan(n), zi.copy())


@dataclass(frozen=True, eq=False)
class BurstBaseline:
    """How long a storage path is slow as work: its checkpoint write bursts (docs/evidence.md)."""

    run_s: np.ndarray  # how long the path has been slow now (0: not slow)
    burst_s: np.ndarray  # the burst length it has shown while healthy (EW, a longer one at once); NaN: none yet
    bursts: np.ndarray  # int32 bursts learned
    run_peak: np.ndarray | None = None  # the highest latency over its own floor in the slow run now (0: not slow)
    peak: np.ndarray | None = None  # the height its healthy bursts reached (latency over own floor); NaN: none yet

    def __post_init__(self) -> None:  # an older snapshot has no heights: they start fresh
        n = len(self.run_s)
        if self.run_peak is None:
            object.__setattr__(self, "run_peak", _z(n))
        if self.peak is None:
            object.__setattr__(self, "peak", _nan(n))

    @classmethod
    def initial(cls, n: int) -> BurstBaseline:
        return cls(_z(n), _nan(n), np.zeros(n, dtype=np.int32), _z(n), _nan(n))


@dataclass(frozen=True, eq=False)
class OffsetBaseline:
    n: np.ndarray  # int32 samples learned
    mean: np.ndarray  # EW of the offset (°C)

    @classmethod
    def initial(cls, n: int) -> OffsetBaseline:
        return cls(np.zeros(n, dtype=np.int32), _nan(n))


@dataclass(frozen=True, eq=False)
class LatencyBaseline:
    n: np.ndarray  # int32 samples learned
    log_lat: np.ndarray  # EW of log latency

    @classmethod
    def initial(cls, n: int) -> LatencyBaseline:
        return cls(np.zeros(n, dtype=np.int32), _nan(n))


@dataclass(frozen=True, eq=False)
class Baselines:
    """Every learned baseline of a fleet, plus the fleet's own die-rise slope."""

    gpu: GpuBaseline
    nic: NicBaseline
    link: LatencyBaseline
    storage: LatencyBaseline
    loop: LatencyBaseline  # log coolant flow, same update rule as a latency
    loop_supply: OffsetBaseline  # °C of supply over the peer-loop median
    r_th: float  # °C/W, the fleet's slope of die rise over power (learned across GPUs)
    r_th_n: int  # ticks it was learned from
    t_s: float  # time of the last update (NaN before the first)
    storage_burst: BurstBaseline | None = None  # None: fresh (see :meth:`bursts`)

    def bursts(self, n: int) -> BurstBaseline:
        return self.storage_burst if self.storage_burst is not None else BurstBaseline.initial(n)

    @classmethod
    def initial(cls, fleet: Fleet, cfg: BaselineConfig) -> Baselines:
        return cls(GpuBaseline.initial(fleet.count(Kind.GPU)), NicBaseline.initial(fleet.count(Kind.NIC)),
                   LatencyBaseline.initial(fleet.count(Kind.LINK)), LatencyBaseline.initial(fleet.count(Kind.STORAGE)),
                   LatencyBaseline.initial(fleet.count(Kind.COOLING_LOOP)),
                   OffsetBaseline.initial(fleet.count(Kind.COOLING_LOOP)), float(cfg.r_th_prior_c_per_w), 0,
                   float("nan"), BurstBaseline.initial(fleet.count(Kind.STORAGE)))

    def dt(self, t_s: float, default_s: float) -> float:
        """Seconds since the last update (``default_s`` for the first)."""
        return default_s if not np.isfinite(self.t_s) else max(0.0, t_s - self.t_s)

    # ---- persistence through the ledger's snapshot arrays -------------------------------
    _PARTS = ("gpu", "nic", "link", "storage", "loop", "loop_supply", "storage_burst")

    def to_arrays(self, prefix: str = "baseline") -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for part in self._PARTS:
            obj = getattr(self, part) if part != "storage_burst" else self.bursts(len(self.storage.n))
            for f in fields(obj):
                out[f"{prefix}.{part}.{f.name}"] = getattr(obj, f.name)
        out[f"{prefix}.fleet"] = np.array([self.r_th, float(self.r_th_n), self.t_s])
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], fleet: Fleet, cfg: BaselineConfig,
                    prefix: str = "baseline") -> tuple[Baselines, list[str]]:
        """Restore what matches this fleet; a part whose arrays are the wrong size (or all
        missing) starts fresh (its label is returned, so the caller can say so). A field an
        older snapshot lacks starts fresh on its own, so an upgrade keeps the rest."""
        fresh = cls.initial(fleet, cfg)
        parts, stale = {}, []
        for part in cls._PARTS:
            init = getattr(fresh, part)
            vals = {}
            for f in fields(init):
                a = arrays.get(f"{prefix}.{part}.{f.name}")
                ref = getattr(init, f.name)
                if a is not None and a.shape != ref.shape:
                    vals = None
                    break
                vals[f.name] = ref if a is None else a.astype(ref.dtype)
            if vals is not None and all(arrays.get(f"{prefix}.{part}.{f.name}") is None for f in fields(init)):
                vals = None
            if vals is None:
                stale.append(part)
                parts[part] = init
            else:
                parts[part] = type(init)(**vals)
        fl = arrays.get(f"{prefix}.fleet")
        if fl is None or fl.shape != (3,):
            return replace(fresh, **parts), stale + (["fleet"] if fl is None else [])
        return cls(parts["gpu"], parts["nic"], parts["link"], parts["storage"], parts["loop"], parts["loop_supply"],
                   float(fl[0]), int(fl[1]), float(fl[2]), parts["storage_burst"]), stale

    def warm_counts(self, cfg: BaselineConfig) -> dict[str, int]:
        """How many entities of each kind have a warm baseline (for reports and /metrics)."""
        w = cfg.warm_samples
        return {"gpu": int((self.gpu.n >= w).sum()), "nic": int((self.nic.n >= w).sum()),
                "link": int((self.link.n >= w).sum()), "storage": int((self.storage.n >= w).sum()),
                "cooling_loop": int((self.loop.n >= w).sum())}


def count_up(n: np.ndarray, learn: np.ndarray, cap: int = 1 << 30) -> np.ndarray:
    return np.where(learn, np.minimum(n + 1, cap), n).astype(np.int32)


def floor_step(floor: np.ndarray, rate: np.ndarray, a: np.ndarray, learn: np.ndarray, margin: float) -> np.ndarray:
    """Learn an error floor: a sample may lift the floor by at most ``margin`` per step,
    so a climbing counter is not taken for the new normal; lower samples pull it down."""
    r = np.nan_to_num(rate, nan=0.0)
    capped = np.minimum(r, floor + margin)
    return ew(floor, capped, a, learn)


def latency_step(base: LatencyBaseline, lat: np.ndarray, learn: np.ndarray, dt_s: float,
                 cfg: BaselineConfig) -> tuple[LatencyBaseline, np.ndarray, np.ndarray]:
    """Update a latency floor; returns (new baseline, ratio to the old floor, warm mask)."""
    warm = base.n >= cfg.warm_samples
    log = np.log(np.where(lat > 0, lat, np.nan))
    ratio = np.exp(log - base.log_lat)
    clip = np.log(cfg.latency_clip)
    sample = np.where(warm, np.clip(log, base.log_lat - clip, base.log_lat + clip), log)
    ok = learn & np.isfinite(log)
    a = alpha(base.n, dt_s, cfg.half_life_s, cfg.warm_samples)
    return LatencyBaseline(count_up(base.n, ok), ew(base.log_lat, sample, a, ok)), ratio, warm


def offset_step(base: OffsetBaseline, x: np.ndarray, learn: np.ndarray, dt_s: float,
                cfg: BaselineConfig) -> tuple[OffsetBaseline, np.ndarray, np.ndarray]:
    """Update a learned offset (°C); returns (new baseline, the sample over the old mean, warm mask)."""
    warm = base.n >= cfg.warm_samples
    over = x - base.mean
    clip = cfg.offset_clip_c
    sample = np.where(warm, np.clip(x, base.mean - clip, base.mean + clip), x)
    ok = learn & np.isfinite(x)
    a = alpha(base.n, dt_s, cfg.half_life_s, cfg.warm_samples)
    return OffsetBaseline(count_up(base.n, ok), ew(base.mean, sample, a, ok)), over, warm


def node_at_work(fleet: Fleet, util_pct: np.ndarray, busy_util_pct: float) -> np.ndarray:
    """Per node, whether it is at work (its load class): its GPUs' mean utilisation at or above
    ``busy_util_pct`` where reported, else whether a job is placed on it. Keys baselines that
    depend on load, so a node's idle hours never teach what its working hours look like."""
    n = fleet.count(Kind.NODE)
    seen = np.isfinite(util_pct)
    cnt = np.bincount(fleet.gpu_node, weights=seen, minlength=n)
    tot = np.bincount(fleet.gpu_node, weights=np.where(seen, util_pct, 0.0), minlength=n)
    mean = np.divide(tot, cnt, out=np.zeros(n), where=cnt > 0)
    return np.where(cnt > 0, mean >= busy_util_pct, fleet.node_job >= 0)


def burst_step(base: BurstBaseline, slow: np.ndarray, healthy: np.ndarray, dt_s: float,
               cfg: BaselineConfig, level: np.ndarray | None = None, seen: np.ndarray | None = None,
               min_height: float = 0.0) -> tuple[BurstBaseline, np.ndarray, np.ndarray]:
    """One tick of a path's burst length: (new baseline, within its burst allowance now, allowance s).

    A slow run counts up while the path is slow. When it ends by itself, no longer than
    ``burst_cap_s``, on a path that is healthy, its length is learned: a longer burst at
    once, a shorter one at the half-life. The allowance is ``burst_margin`` times the
    learned length (at least ``burst_prior_s`` until ``burst_min_count`` were learned); a
    path slow no longer than that is doing its work. ``level`` (per path, its latency over its own floor; NaN or
    None: unknown) is a burst's height, learned the same way: a run higher than
    ``burst_height_margin`` times the height its healthy bursts reached is not the same
    work, however short (and is never learned as a burst). ``seen`` (None: all):
    a path with no sample this tick holds its run (a missed scrape ends no burst). A run is
    learned only if it reached ``min_height`` over the path's own floor: one slow only
    against the other paths (a path on slower hardware, its floor still warming) is no burst.
    """
    lvl = np.full(len(slow), np.nan) if level is None else np.asarray(level, dtype=float)
    gone = np.zeros(len(slow), dtype=bool) if seen is None else ~seen
    run = np.where(slow, base.run_s + max(dt_s, 0.0), np.where(gone, base.run_s, 0.0))
    known = np.isfinite(base.peak)
    tall = known & np.isfinite(lvl) & (lvl > cfg.burst_height_margin * base.peak)
    run_peak = np.where(slow, np.fmax(base.run_peak, lvl), np.where(gone, base.run_peak, 0.0))
    ended = ~slow & ~gone & (base.run_s > 0) & healthy & (base.run_s <= cfg.burst_cap_s)
    ended &= base.run_peak >= min_height
    ended &= ~known | (base.run_peak <= cfg.burst_height_margin * base.peak)
    a = alpha(base.bursts, dt_s, cfg.half_life_s)
    longer = np.isfinite(base.burst_s) & (base.run_s > base.burst_s)
    burst = np.where(longer & ended, base.run_s, ew(base.burst_s, base.run_s, a, ended & ~longer))
    has_peak = ended & (base.run_peak > 0)
    higher = known & (base.run_peak > base.peak)
    peak = np.where(higher & has_peak, base.run_peak, ew(base.peak, base.run_peak, a, has_peak & ~higher))
    # One burst is one sample of a path's burst lengths (several jobs, several sizes): the prior
    # stands until ``burst_min_count`` bursts were seen, unless a learned one is longer.
    learned = np.where(np.isfinite(base.burst_s), cfg.burst_margin * base.burst_s, 0.0)
    allow = np.where(base.bursts >= cfg.burst_min_count, learned, np.maximum(learned, cfg.burst_prior_s))
    new = BurstBaseline(run.astype(F32), burst.astype(F32), count_up(base.bursts, ended), run_peak.astype(F32),
                        peak.astype(F32))
    return new, slow & (run <= allow) & ~tall, allow


def wait_ratio(b: NicBaseline, wait: np.ndarray, reporting: np.ndarray, work: np.ndarray, job: np.ndarray,
               n_jobs: int, cfg: BaselineConfig) -> tuple[np.ndarray, float]:
    """A port's transmit wait over its normal: (ratio, the smoothing constant used).

    Its normal is the smaller claim of two, each for its node's load class (``work``: at
    work or idle): its own learned wait in that class, and the median of the *other*
    reporting ports under the same load: the ports of its job (``job`` per port, -1 none)
    where it has 3 or more others, else of its load class (3 or more). A port with neither
    has no verdict (0). A spare that idled for a week and now runs a job is judged against
    the job's other ports, never against its idle hours.
    """
    fleet_med = float(np.median(wait[reporting])) if reporting.any() else 0.0
    eps = max(fleet_med, 1.0) * 0.1
    w = np.where(reporting, wait, np.nan)
    same_job = np.where(work & (job >= 0), job + 1, 0).astype(np.int64)
    med_job, k_job = loo_median(np.where(same_job > 0, w, np.nan), same_job, n_jobs + 1)
    med_cls, k_cls = loo_median(w, work.astype(np.int64), 2)
    use_job = (same_job > 0) & (k_job >= 3)
    peer_med = np.where(use_job, med_job, np.where(k_cls >= 3, med_cls, np.nan))
    r_peer = (wait + eps) / (peer_med + eps)
    own = np.where(work, b.wait_rate, b.wait_idle)
    own_warm = np.where(work, b.wait_busy_n, b.wait_idle_n) >= cfg.warm_samples
    r_own = np.where(own_warm & np.isfinite(own), (wait + eps) / (np.nan_to_num(own) + eps), np.nan)
    ratio = np.fmin(r_peer, r_own)
    return np.where(reporting, np.nan_to_num(ratio, nan=0.0), 0.0), eps


def wait_step(b: NicBaseline, wait: np.ndarray, work: np.ndarray, learn: np.ndarray, dt_s: float, eps: float,
              clip_ratio: float, cfg: BaselineConfig) -> dict[str, np.ndarray]:
    """Teach each port's wait baseline of its load class now (the other class is left as it was);
    a warm baseline takes a sample clipped to ``clip_ratio`` times itself."""
    out = {}
    for field_, n_field, mask in (("wait_rate", "wait_busy_n", work), ("wait_idle", "wait_idle_n", ~work)):
        old, n = getattr(b, field_), getattr(b, n_field)
        warm = (n >= cfg.warm_samples) & np.isfinite(old)
        sample = np.where(warm, np.minimum(wait, np.nan_to_num(old) * clip_ratio + eps), wait)
        ok = learn & mask & np.isfinite(wait)
        out[field_] = ew(old, sample, alpha(n, dt_s, cfg.half_life_s, cfg.warm_samples), ok)
        out[n_field] = count_up(n, ok)
    return out
