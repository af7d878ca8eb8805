"""Faults nobody named: every other series of an entity against its own past and its peers.

Called by assess/assessment.py once per kind that has a :class:`SeriesBlock` on the frame
(observe/unnamed.py). One matrix per kind, entities x series; every step is an array
operation over the whole matrix (no Python loop over entities or series). Pure: the
state it learns comes in and goes out as :class:`UnnamedState`.

Per series and entity (docs/evidence.md, "Series nobody named"):
- a gauge is read as its level, a counter as its rate (a drop is a reset: no rate that tick);
- the peer median is that of the *other* entities of the same load class (leave-one-out,
  assess/stats.py), so a fleet-wide change (a driver update, a cooler day) moves the
  median with it and is nobody's deviation;
- the entity's own baseline is of its residual from that median, so an entity that always
  sat apart (another board revision, a longer cable) is its own normal;
- a deviation counts only when it is far from both, in the same direction, in ``k`` of
  the last ``n`` ticks (sustained: a one- or two-scrape spike never counts), and only
  where no named channel already explains the entity (its named GFS below ``explain_gfs``);
- a counter that has moved before and now stays still while its peers move, and a series
  seen before that vanishes while the entity's host still reports and its peers still
  have it, are telemetry faults of that entity.
The result is low-weight evidence: one column that names the worst series. Its weight and
``explain_gfs`` are bounded so that it can reach ``degraded`` and never ``quarantine`` on
its own: 1 - (1 - explain_gfs) * (1 - max weight) stays below 0.8, the lowest
quarantine threshold of the default policy (checked in the config).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from seamguard.assess.baselines import alpha
from seamguard.assess.evidence import Evidence
from seamguard.assess.stats import _SELECT_MIN, loo_median, loo_median_hinted, ramp
from seamguard.fleet.model import Kind
from seamguard.observe.unnamed import SeriesBlock

_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)
# The lowest quarantine threshold of the default policy: unnamed evidence alone stays below it.
_QUARANTINE_FLOOR = 0.8


class UnnamedJudgeConfig(BaseModel):
    """How series nobody named are judged (the `assess.unnamed:` section of a policy)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    z: tuple[float, float] = Field((6.0, 12.0), description="robust z against both own past and peers: "
                                   "concern, saturation (the peer-z bar of the named channels)")
    weight: float = Field(0.6, gt=0, le=1, description="score of a saturated, sustained deviation (degraded at most)")
    telemetry_score: float = Field(0.55, gt=0, le=1, description="score of a stuck counter or a vanished series")
    sustain_k: int = Field(4, ge=1, le=8, description="deviating ticks of the last sustain_n that make it sustained")
    sustain_n: int = Field(6, ge=1, le=8, description="ticks the persistence rule looks back over")
    stuck_ticks: int = Field(6, ge=2, description="ticks a counter stays still while its peers move")
    vanish_ticks: int = Field(3, ge=1, description="ticks a series stays gone while its host reports")
    explain_gfs: float = Field(0.2, ge=0, lt=1, description="named GFS at or above which the entity is "
                               "explained already: unnamed evidence is not added")
    min_peers: int = Field(3, ge=2, description="other same-load entities a series needs for a peer verdict")
    rel_floor: float = Field(0.01, ge=0, description="smallest spread as a share of the peer median (sensor "
                             "resolution of a series whose unit nobody told us)")
    half_life_s: float = Field(2 * 3600.0, gt=0, description="how fast the own baseline follows slow healthy change")
    warm_samples: int = Field(15, ge=2, description="samples the own baseline needs before it gives verdicts")
    max_series: int = Field(128, ge=1, le=4096, description="series judged per kind (the first seen); memory "
                            "is 33 bytes per entity and series")

    @model_validator(mode="after")
    def _bounded(self) -> UnnamedJudgeConfig:
        if self.sustain_k > self.sustain_n:
            raise ValueError(f"sustain_k ({self.sustain_k}) must not exceed sustain_n ({self.sustain_n})")
        top = 1.0 - (1.0 - self.explain_gfs) * (1.0 - max(self.weight, self.telemetry_score))
        if top >= _QUARANTINE_FLOOR:
            raise ValueError(f"unnamed evidence could reach GFS {top:.2f} on its own (>= {_QUARANTINE_FLOOR}): "
                             "lower weight, telemetry_score or explain_gfs")
        return self


@dataclass(frozen=True, eq=False)
class UnnamedState:
    """What the judge learns per entity and series of one kind (columns follow ``names``)."""

    names: tuple[str, ...]
    counter: np.ndarray  # bool [S]
    prev: np.ndarray  # float64 [N, S] last raw value (counter rates)
    prev_t_s: float
    mu: np.ndarray  # float32 [N, S] EW mean of the residual from the peer median
    dev: np.ndarray  # float32 [N, S] EW mean absolute deviation of that residual
    n: np.ndarray  # uint16 [N, S] samples learned
    bits: np.ndarray  # uint8 [N, S] deviation of each of the last 8 ticks, newest in bit 0
    still: np.ndarray  # uint16 [N, S] ticks a counter has not moved
    moved: np.ndarray  # bool [N, S] the counter has moved at least once
    gone: np.ndarray  # uint16 [N, S] ticks the series has been missing
    seen: np.ndarray  # bool [N, S] the series has reported for this entity
    order: np.ndarray | None = None  # int64 [N * S] last tick's peer sort order (a hint, not state)

    @classmethod
    def empty(cls, n: int) -> UnnamedState:
        return _widen(cls((), np.zeros(0, bool), *_cells(n, 0)), (), np.zeros(0, bool))

    @property
    def bytes(self) -> int:
        return sum(getattr(self, f).nbytes for f in _CELL_FIELDS) + (self.order.nbytes if self.order is not None else 0)


_CELL_FIELDS = ("prev", "mu", "dev", "n", "bits", "still", "moved", "gone", "seen")
_CELL_DTYPES = (np.float64, np.float32, np.float32, np.uint16, np.uint8, np.uint16, bool, np.uint16, bool)


def _cells(n: int, s: int) -> tuple:
    prev = np.full((n, s), np.nan)
    rest = [np.zeros((n, s), dtype=d) for d in _CELL_DTYPES[1:]]
    return (prev, np.nan, *rest)


def _widen(st: UnnamedState, names: tuple[str, ...], counter: np.ndarray, cap: int = 1 << 16) -> UnnamedState:
    """The state with columns for every name it had plus ``names`` (new ones fresh), at most
    ``cap`` in all: once full, a series never seen before is not taken (memory stays bounded)."""
    had = set(st.names)
    new = tuple(x for x in names if x not in had)[:max(cap - len(st.names), 0)]
    if not new and st.names:
        return st
    n = st.prev.shape[0] if st.prev.ndim == 2 else 0
    fresh = _cells(n, len(new))
    cat = {f: np.concatenate([getattr(st, f), fresh[i if i == 0 else i + 1]], axis=1)
           for i, f in enumerate(_CELL_FIELDS)}
    where = {x: i for i, x in enumerate(names)}
    cnt = np.concatenate([st.counter, np.array([counter[where[x]] for x in new], dtype=bool)])
    return replace(st, names=st.names + new, counter=cnt, **cat)


def _align(block: SeriesBlock, st: UnnamedState) -> np.ndarray:
    """The block's values in the state's column order (NaN for a series not reported now)."""
    x = np.full((block.values.shape[0], len(st.names)), np.nan)
    col = {name: i for i, name in enumerate(st.names)}
    src = [j for j, name in enumerate(block.names) if name in col]
    x[:, [col[block.names[j]] for j in src]] = block.values[:, src]
    return x


def _cells_of(group: np.ndarray, s: int) -> np.ndarray:
    """Group id of every cell: one group per (load class, series)."""
    return (group[:, None] * s + np.arange(s)[None, :]).ravel()


def _peer_median(v: np.ndarray, g: np.ndarray, n_groups: int, hint: np.ndarray | None):
    """stats.loo_median over the flattened matrix. Returns (median of the others, their count,
    this tick's order or None).

    Where most cells are in groups of ``stats._SELECT_MIN`` or more (a job's GPUs on one series),
    each group's few order statistics are selected (a partition each): a large group's values
    are noise around one level and are never nearly sorted, so last tick's order saves nothing
    there (3x the CPU of the partitions). Otherwise the sort starts from last tick's order
    (small groups' values move little from one tick to the next: a nearly linear stable
    sort). Both give the same medians (exact order statistics)."""
    counts = np.bincount(g, minlength=n_groups)
    if 2 * int(counts[counts >= _SELECT_MIN].sum()) >= v.size:
        med, cnt = loo_median(v, g, n_groups)
        return med, cnt, None
    return loo_median_hinted(v, g, n_groups, hint)


def _column_spread(a: np.ndarray) -> np.ndarray:
    """Median of each column's non-NaN values (NaN for a column without one): np.nanmedian's
    values, from one transposed copy and a partition per column (nanmedian walked strided
    columns and copied each twice)."""
    cols = np.ascontiguousarray(a.T)
    out = np.full(cols.shape[0], np.nan)
    for j, col in enumerate(cols):
        x = col[~np.isnan(col)]
        k = x.size // 2
        if x.size % 2:
            out[j] = np.partition(x, k)[k]
        elif x.size:
            lo_hi = np.partition(x, (k - 1, k))
            out[j] = (lo_hi[k - 1] + lo_hi[k]) / 2.0
    return out


def _drift(v: np.ndarray, g: np.ndarray, n_groups: int, st: UnnamedState, cfg: UnnamedJudgeConfig):
    """Each cell's departure from its own past, the common mode of its peers removed.

    The residual from the leave-one-out median of the same-load others takes out what moves
    every peer (a driver update, the weather); its own learned mean takes out where this
    entity always sits (a board revision); what is left is scaled by the largest of the
    entity's own noise, the spread of every entity's departure on that series (a median
    over the column: a partition, no sort) and a share of the peer median. Returns (z,
    residual, peer median, peer count, the sort order for the next tick), each [N, S]."""
    n, s = v.shape
    med, cnt, order = _peer_median(v.ravel(), g, n_groups, st.order)
    med, cnt = med.reshape(n, s), cnt.reshape(n, s)
    resid = v - med
    delta = np.where(st.n >= cfg.warm_samples, resid - st.mu, np.nan)
    spread = 1.4826 * _column_spread(np.abs(delta)) if n else np.zeros(s)  # a column with no warm cell: NaN
    scale = np.fmax(np.fmax(1.25 * st.dev, spread[None, :]), cfg.rel_floor * np.abs(np.nan_to_num(med)))
    z = delta / np.maximum(scale, 1e-9)
    return np.where((cnt >= cfg.min_peers), z, np.nan), resid, med, cnt, order


def judge(block: SeriesBlock, st: UnnamedState | None, t_s: float, group: np.ndarray, named_gfs: np.ndarray,
          learn: np.ndarray, host: np.ndarray | None, cfg: UnnamedJudgeConfig) -> tuple[np.ndarray, np.ndarray,
                                                                                        np.ndarray, UnnamedState]:
    """One tick over a kind's block: (score [N, S], value [N, S], is-telemetry [N, S], new state).

    ``group``: each entity's load class (int); ``learn``: entities whose baselines may learn
    (not failed, not held); ``host``: each entity's node index, or None where the entity is its
    own host (its other series are its host's report). Scores are 0 where not sustained,
    not unexplained, or not warm.
    """
    n = block.values.shape[0]
    st = _widen(st if st is not None and st.prev.shape[0] == n else UnnamedState.empty(n), block.names, block.counter,
                cfg.max_series)
    x = _align(block, st)
    present = np.isfinite(x)
    dt_s = t_s - st.prev_t_s if np.isfinite(st.prev_t_s) and t_s > st.prev_t_s else np.nan
    with np.errstate(invalid="ignore"):
        rate = np.where(x >= st.prev, (x - st.prev) / dt_s, np.nan)  # a drop is a reset: no rate this tick
    v = np.where(st.counter[None, :], rate, x)
    n_groups = (int(group.max()) + 1 if n else 1) * max(len(st.names), 1)
    g = _cells_of(group, len(st.names))
    z, resid, med, cnt, order = _drift(v, g, n_groups, st, cfg)
    peered = cnt >= cfg.min_peers
    with np.errstate(invalid="ignore"):  # only a move away from the peers: one back towards them is a repair
        strength = np.where(np.sign(z) == np.sign(resid), np.abs(z), 0.0)
    hit = np.nan_to_num(strength) >= cfg.z[0]
    bits = ((st.bits.astype(np.uint16) << 1) | hit).astype(np.uint8) & np.uint8((1 << cfg.sustain_n) - 1)
    sustained = _POPCOUNT[bits] >= cfg.sustain_k
    s_dev = np.where(sustained, cfg.weight * ramp(strength, *cfg.z), 0.0)

    stuck, vanished, tel = _telemetry(st, rate, present, med, peered, cnt, host, cfg)
    tele = stuck | vanished
    score = np.where(tele, cfg.telemetry_score, s_dev)
    explained = named_gfs >= cfg.explain_gfs
    score = np.where(explained[:, None], 0.0, score)
    value = np.where(tele, np.where(stuck, tel["still"], tel["gone"]), strength).astype(float)

    ok = learn[:, None] & np.isfinite(resid) & ~tele & ~explained[:, None] & ((st.n >= cfg.warm_samples) | ~hit)
    new = replace(st, order=order, prev=np.where(present, x, st.prev), prev_t_s=t_s, bits=bits,
                  **_learn(st, resid, ok, ok & ~hit, dt_s, cfg), **tel)
    return score, value, tele, new


def _telemetry(st: UnnamedState, rate: np.ndarray, present: np.ndarray, med: np.ndarray, peered: np.ndarray,
               cnt: np.ndarray, host: np.ndarray | None, cfg: UnnamedJudgeConfig):
    """(stuck, vanished, the counters they carry to the next tick): a counter that moved before
    and is still now while its same-load peers move; a series seen before that is gone while
    its host reports and at least ``min_peers`` peers still have it."""
    n = present.shape[0]
    is_c = st.counter[None, :]
    with np.errstate(invalid="ignore"):
        still = np.where(is_c & (rate == 0), st.still + 1, np.where(np.isfinite(rate), 0, st.still))
        moved = st.moved | (is_c & (rate > 0))
        stuck = is_c & st.moved & (still >= cfg.stuck_ticks) & (np.nan_to_num(med) > 0) & peered
    gone = np.where(present, 0, st.gone + 1)
    seen = st.seen | present
    reports = present.any(axis=1)
    if host is not None:
        node_reports = np.bincount(host, weights=reports, minlength=int(host.max()) + 1 if n else 0) > 0
        reports = node_reports[host]
    vanished = seen & (gone >= cfg.vanish_ticks) & reports[:, None] & (cnt >= cfg.min_peers)
    return stuck, vanished, {"still": np.minimum(still, 65535).astype(np.uint16), "moved": moved,
                             "gone": np.minimum(gone, 65535).astype(np.uint16), "seen": seen}


def _learn(st: UnnamedState, resid: np.ndarray, ok: np.ndarray, quiet: np.ndarray, dt_s: float,
           cfg: UnnamedJudgeConfig) -> dict[str, np.ndarray]:
    """The own baseline after this tick. Its mean learns from every cell ``ok`` (reports, is
    peered, not explained, not a telemetry fault), at its half-life even while it deviates: a
    new level that lasts (a firmware rolled out node by node) becomes the entity's normal
    within hours, while a fault that keeps getting worse stays ahead of it; warming (an even
    average) takes quiet cells only. The noise learns from ``quiet`` cells only: a deviation
    must not widen its own bar."""
    a = alpha(st.n, dt_s if np.isfinite(dt_s) else 0.0, cfg.half_life_s, cfg.warm_samples)
    r = np.nan_to_num(resid)
    return {"mu": np.where(ok, st.mu + a * (r - st.mu), st.mu).astype(np.float32),
            "dev": np.where(quiet, st.dev + a * (np.abs(r - st.mu) - st.dev), st.dev).astype(np.float32),
            "n": np.where(ok, np.minimum(st.n.astype(np.int64) + 1, 65535), st.n).astype(np.uint16)}


def add_columns(e: Evidence, names: tuple[str, ...], score: np.ndarray, value: np.ndarray,
                tele: np.ndarray) -> Evidence:
    """``e`` with one scored column per series that is the worst of some entity this tick
    (``series:<name>`` for a deviation, ``telemetry:<name>`` for a telemetry fault), so the
    evidence names the series. Only each entity's worst series scores: many deviating series
    of one entity are one piece of low-weight evidence, not a noisy-OR of many."""
    if score.size == 0 or not (score > 0).any():
        return e
    rows = np.arange(score.shape[0])
    top = np.argmax(score, axis=1)
    top_s = score[rows, top]
    flagged = np.flatnonzero(top_s > 0)
    keys = top[flagged] * 2 + tele[flagged, top[flagged]]
    chans, units, s_cols, v_cols = [], [], [], []
    for key in np.unique(keys).tolist():
        s, is_tele = divmod(key, 2)
        mine = flagged[keys == key]
        col_s = np.zeros(score.shape[0])
        col_s[mine] = top_s[mine]
        col_v = np.full(score.shape[0], np.nan)
        col_v[mine] = value[mine, s]
        chans.append(f"{'telemetry' if is_tele else 'series'}:{names[s]}")
        units.append("ticks" if is_tele else "z")
        s_cols.append(col_s)
        v_cols.append(col_v)
    return replace(e, channels=e.channels + tuple(chans), units=e.units + tuple(units),
                   score=np.concatenate([e.score, np.stack(s_cols, axis=1)], axis=1),
                   value=np.concatenate([e.value, np.stack(v_cols, axis=1)], axis=1))


def series_evidence(e: Evidence, block: SeriesBlock, st: UnnamedState | None, t_s: float, group: np.ndarray,
                    learn: np.ndarray, host: np.ndarray | None, cfg: UnnamedJudgeConfig) -> tuple[Evidence,
                                                                                                  UnnamedState]:
    """A kind's evidence with its unnamed series judged and added, and the state after this tick."""
    if block.kind != e.kind:
        raise ValueError(f"series block of {block.kind.label} given to {e.kind.label} evidence")
    score, value, tele, new = judge(block, st, t_s, group.astype(np.int64), e.gfs, learn, host, cfg)
    return add_columns(e, new.names, score, value, tele), new


def host_of(kind: Kind, fleet) -> np.ndarray | None:
    """Each entity's node (its host), for the kinds a node's exporters report; None otherwise."""
    return {Kind.GPU: fleet.gpu_node, Kind.NIC: fleet.nic_node}.get(kind)
