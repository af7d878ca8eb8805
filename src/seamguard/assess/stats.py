"""Vectorized robust statistics over entity groups (peer groups), NaN-aware.

Peer comparisons use the leave-one-out forms (:func:`loo_median`, :func:`loo_robust_z`):
an entity is never its own peer (docs/evidence.md, "Peer groups and parents").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def group_median(x: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """Median of the non-NaN values of each group (NaN for an empty group).

    One sort for all groups: O(N log N), no Python loop over groups.
    """
    ok = ~np.isnan(x)
    xs, gs = x[ok], group[ok]
    out = np.full(n_groups, np.nan)
    if xs.size == 0:
        return out
    order = _group_sort(xs, gs)
    xs, gs = xs[order], gs[order]
    counts = np.bincount(gs, minlength=n_groups)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    has = counts > 0
    lo = starts + (counts - 1) // 2
    hi = starts + counts // 2
    out[has] = 0.5 * (xs[lo[has]] + xs[hi[has]])
    return out


def robust_z(x: np.ndarray, group: np.ndarray, n_groups: int, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """Peer-relative deviation: (x - median) / (1.4826 * MAD), MAD floored at ``floor``.

    Returns (z, peer median per entity). The floor keeps a perfectly uniform group
    from turning sensor noise into huge scores.
    """
    med = group_median(x, group, n_groups)
    m = med[group]
    mad = group_median(np.abs(x - m), group, n_groups)
    scale = np.maximum(1.4826 * np.nan_to_num(mad[group], nan=floor), floor)
    return (x - m) / scale, m


def _group_sort(v: np.ndarray, group: np.ndarray, stable: bool = False) -> np.ndarray:
    """Order of finite ``v`` by (group, value): one argsort of a combined key (group offsets
    wider than the values' span), much cheaper than a two-key lexsort. ``stable``: timsort,
    which merges the presorted runs a deviation array is made of in about linear time.
    Order is exact up to float rounding of the combined key (1e-11 of the span at 10^5 groups)."""
    lo = float(v.min()) if v.size else 0.0
    span = (float(v.max()) - lo) if v.size else 0.0
    if not np.isfinite(span):  # an infinite value: the two-key sort
        return np.lexsort((v, group))
    key = group.astype(np.float64) * (2.0 * span + 1.0) + (v - lo)
    return np.argsort(key, kind="stable" if stable else "quicksort")


# A group this large has its few order statistics selected (np.partition, linear) rather than
# sorted; smaller groups are sorted together in one argsort. At most n / _SELECT_MIN groups are
# walked in Python.
_SELECT_MIN = 4096


@dataclass(frozen=True, eq=False)
class _Ranks:
    """The order statistics of each group's values that every median here reads.

    ``mid[j, g]``: rank ``base[g] + j`` (j = 0, 1, 2; clamped to the group's last) of group g's
    values, NaN for an empty group, with base = max(count - 2, 0) // 2. The group's own median
    reads ranks (count - 1) // 2 and count // 2; the median of one member's others reads ranks
    base and (count - 1) // 2 of the others, that is, of the whole group, those or one past
    each: all within base .. base + 2. Small groups keep their values sorted (``xs`` from each
    group's ``starts``); large ones their values unsorted, one array each (``large``)."""

    counts: np.ndarray
    base: np.ndarray
    mid: np.ndarray
    xs: np.ndarray
    starts: np.ndarray
    large: tuple[tuple[int, np.ndarray], ...]

    def at(self, j: np.ndarray, group: np.ndarray) -> np.ndarray:
        """``mid[j, group]`` element-wise."""
        return self.mid.ravel()[j * self.mid.shape[1] + group]


def _ranks(x: np.ndarray, group: np.ndarray, n_groups: int, ok: np.ndarray) -> _Ranks:
    """:class:`_Ranks` of the values ``x[ok]`` by ``group``: small groups by one sort of a
    combined key, each large one by a partition."""
    idx = np.flatnonzero(ok)
    v, g = x[idx], group[idx]
    counts = np.bincount(g, minlength=n_groups)
    base = np.maximum(counts - 2, 0) // 2
    mid = np.full((3, n_groups), np.nan)
    large_g = np.flatnonzero(counts >= _SELECT_MIN)
    in_large = np.zeros(n_groups, dtype=bool)
    in_large[large_g] = True
    big = in_large[g] if large_g.size else np.zeros(len(g), dtype=bool)
    vs, gs = (v[~big], g[~big]) if large_g.size else (v, g)
    n_small = int(np.count_nonzero(counts[~in_large]))
    # Members already laid out group by group (a rack's GPUs, a node's NICs): timsort merges
    # each group's run in about n log(group size).
    grouped = len(gs) < 2 or (len(gs) <= 256 * n_small and bool(np.all(gs[1:] >= gs[:-1])))
    xs = vs[_group_sort(vs, gs, stable=grouped)]
    small_counts = np.where(in_large, 0, counts)
    starts = np.concatenate([[0], np.cumsum(small_counts)[:-1]]).astype(np.int64)
    has = small_counts > 0
    for j in range(3):
        mid[j, has] = xs[(starts + np.minimum(base + j, counts - 1))[has]]
    large = []
    if large_g.size:
        dense = np.zeros(n_groups, dtype=np.int64)
        dense[large_g] = np.arange(large_g.size)
        d = dense[g[big]]
        vl = v[big][np.argsort(d.astype(np.uint16) if large_g.size < 1 << 16 else d, kind="stable")]
        ends = np.cumsum(counts[large_g])
        for gid, e in zip(large_g.tolist(), ends.tolist()):
            seg = vl[e - counts[gid]:e]
            ranks = np.minimum(base[gid] + np.arange(3), counts[gid] - 1)
            mid[:, gid] = np.partition(seg, np.unique(ranks))[ranks]
            large.append((gid, seg))
    return _Ranks(counts, base, mid, xs, starts, tuple(large))


def _leave_out(r: _Ranks, x: np.ndarray, group: np.ndarray, ok: np.ndarray):
    """Per entity: (median of the other members of its group, how many there are, its group's
    ranks lo and hi as (lo, hi)).

    With ``m`` others a median reads ranks lo = (m - 1) // 2 and hi = m // 2 of them; a member
    with a value (``ok``) reads, of the whole group, each rank where its own value is below
    that rank's (by value: a tie of it is the same value), else the one past it. A member
    without one reads the whole group's median. Each per-group figure is gathered as its own
    contiguous column (a stacked [N, 5] gather read back column by column cost a 1M-GPU tick
    twice the time)."""
    n_g = r.mid.shape[1]
    g, c = np.arange(n_g), r.counts
    jh = np.maximum(c - 1, 0) // 2 - r.base  # hi of a member with a value (lo is base), less base
    whole = 0.5 * (r.at(np.maximum(c - 1, 0) // 2 - r.base, g) + r.at(c // 2 - r.base, g))
    lo0, lo1 = r.mid[0][group], r.mid[1][group]
    hi0, hi1 = r.at(jh, g)[group], r.at(np.minimum(jh + 1, 2), g)[group]
    med = np.where(x > lo0, lo0, lo1)
    med += np.where(x > hi0, hi0, hi1)
    med *= 0.5
    med = np.where(ok, med, whole[group])
    others = c[group] - ok
    return np.where(others > 0, med, np.nan), others, (lo0, hi0)


def loo_median(x: np.ndarray, group: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Per entity, the median of the *other* members of its group, and how many there are.

    An entity is never its own peer: with itself in the group a member of two sees half
    its own deviation, a member of three a third of it. An entity without a value is
    compared with every member that has one. Three order statistics per group (one sort of
    the small groups, a partition of each large one), then each entity leaves itself out by
    comparison; no Python loop over small groups.
    """
    ok = np.isfinite(x)
    return _leave_out(_ranks(x, group, n_groups, ok), x, group, ok)[:2]


def loo_median_hinted(x: np.ndarray, group: np.ndarray, n_groups: int,
                      hint: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`loo_median`, its sort started from ``hint`` (an order of the same entities from a
    previous call, e.g. last tick's): values that moved little leave the keys nearly sorted, and
    a stable sort (timsort) finishes in about linear time. An entity without a value sorts at
    the end of its group. Returns (median of the others, their count, this call's order)."""
    fin = np.isfinite(x)
    lo = float(x[fin].min()) if fin.any() else 0.0
    span = float(x[fin].max()) - lo if fin.any() else 0.0
    key = group * (2.0 * span + 1.0) + np.where(fin, x - lo, 2.0 * span + 0.5)
    if hint is not None and hint.size == key.size:
        order = hint[np.argsort(key[hint], kind="stable")]
    else:
        order = np.argsort(key, kind="stable")
    total = np.bincount(group, minlength=n_groups)
    starts = np.concatenate([[0], np.cumsum(total)[:-1]]).astype(np.int64)
    counts = np.bincount(group, weights=fin, minlength=n_groups).astype(np.int64)
    base = np.maximum(counts - 2, 0) // 2
    mid = np.full((3, n_groups), np.nan)
    has = counts > 0
    for j in range(3):
        mid[j, has] = x[order[(starts + np.minimum(base + j, counts - 1))[has]]]
    med, others, _ = _leave_out(_Ranks(counts, base, mid, np.zeros(0), starts, ()), x, group, fin)
    return med, others, order


def loo_robust_z(x: np.ndarray, group: np.ndarray, n_groups: int, floor: float,
                 min_peers: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Leave-one-out peer deviation: (x - median of the others) / (1.4826 * MAD of the others).

    Returns (z, peer median, peer count) per entity; z and the median are NaN where fewer
    than ``min_peers`` others have a value (too few to say what normal is: the caller
    falls back to the entity's own history and the design envelope). The MAD is taken
    around the others' own median, over the others only, and floored at ``floor``.
    A group's leave-one-out median takes one of three values (the entity below, at or
    above its middle); for each, the few order statistics of the whole group's deviations
    that a leave-one-out median reads are found (:func:`_kth_nearest` in a sorted small
    group, a partition in a large one; no sort of the deviations), and each entity drops
    its own deviation from them by comparison.
    """
    ok = np.isfinite(x)
    r = _ranks(x, group, n_groups, ok)
    med, others, rows = _leave_out(r, x, group, ok)
    mad = _loo_mad(r, x, group, ok, rows)
    enough = others >= min_peers
    scale = np.maximum(1.4826 * np.nan_to_num(mad, nan=floor), floor)
    z = np.where(enough, (x - med) / scale, np.nan)
    return z, np.where(enough, med, np.nan), others


def _loo_mad(r: _Ranks, x: np.ndarray, group: np.ndarray, ok: np.ndarray,
             rows: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per entity with a value, the median absolute deviation of the *other* members of its group
    around their own median (NaN for a group of one, or without a value); ``rows``: its group's
    ranks lo and hi, from :func:`_leave_out`.

    The centre is one of three per group: that of a member at or below rank lo of the group,
    between lo and hi, or above hi (a comparison of values). For each centre, ranks base ..
    base + 2 of the whole group's deviations; each member then drops its own deviation as for
    the median."""
    n_g = r.mid.shape[1]
    g, c = np.arange(n_g), r.counts
    jh = np.maximum(c - 1, 0) // 2 - r.base
    m0, m1, mh, mh1 = r.mid[0], r.mid[1], r.at(jh, g), r.at(np.minimum(jh + 1, 2), g)
    centres = np.stack([0.5 * (m0 + mh), 0.5 * (m0 + mh1), 0.5 * (m1 + mh1)])  # [3, G]
    ranks = np.minimum(r.base[None, :] + np.arange(3)[:, None], np.maximum(c - 1, 0)[None, :])  # [3, G]
    dev = np.full((3, 3, n_g), np.nan)  # dev[v, j, g]: rank base + j of the deviations from centre v
    small = np.flatnonzero((c >= 2) & (c < _SELECT_MIN))
    if small.size:
        kth = _kth_nearest(r.xs, np.tile(r.starts[small], 9), np.tile(c[small], 9),
                           np.repeat(centres[:, small], 3, axis=0).ravel(), np.tile(ranks[:, small].ravel(), 3))
        dev[:, :, small] = kth.reshape(3, 3, small.size)
    for gid, seg in r.large:
        ks = ranks[:, gid]
        for v in range(3):
            dev[v, :, gid] = np.partition(np.abs(seg - centres[v, gid]), np.unique(ks))[ks]
    # Per (centre, group): the centre, ranks lo and lo + 1, hi and hi + 1 of the deviations,
    # each gathered per entity as its own column.
    table = (centres, dev[:, 0], dev[:, 1], dev[:, jh, g], dev[:, np.minimum(jh + 1, 2), g])
    lo, hi = rows
    at = np.where(x > hi, 0, np.where(x > lo, 1, 2)) * n_g + group
    t0, t1, t2, t3, t4 = (np.ascontiguousarray(col).ravel()[at] for col in table)
    own = np.abs(x - t0)
    mad = np.where(own > t1, t1, t2)
    mad += np.where(own > t3, t3, t4)
    mad *= 0.5
    return np.where(ok & (c[group] >= 2), mad, np.nan)


def _kth_nearest(xs: np.ndarray, start: np.ndarray, count: np.ndarray, c: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Per query, the ``k``-th smallest (from 0) of |v - c| over the sorted slice
    ``xs[start : start + count]`` (k < count). The k + 1 values nearest ``c`` are a contiguous
    window of a sorted slice, and whether its left end lies past ``a`` is one comparison of the
    values at ``a`` and ``a + k + 1``: a bisection on that end, all queries at once, in
    log2(largest count) array steps."""
    width = k + 1
    a = np.zeros(len(start), dtype=np.int64)
    b = count - width
    top = len(xs) - 1
    for _ in range(int(b.max()).bit_length() if len(b) else 0):
        live = a < b
        mid = (a + b) >> 1
        s = start + mid
        right = live & ((c - xs[s]) > (xs[np.minimum(s + width, top)] - c))  # the value past the window is nearer
        a = np.where(right, mid + 1, a)
        b = np.where(live & ~right, mid, b)
    return np.maximum(np.abs(xs[start + a] - c), np.abs(xs[start + a + width - 1] - c))


_CHUNK = 1 << 15  # columns per block: a block's few rows stay in cache while the rows are walked


def counter_increase(rows: Sequence[np.ndarray]) -> np.ndarray:
    """Sum of a counter's increases between consecutive rows (oldest first, one value per entity).

    A drop is a counter reset (an exporter or driver restart): counting restarts from zero,
    so the new value is what accrued since the reset. A step to or from a missing sample
    counts nothing. Walked a block of columns at a time, row pair by row pair: no
    ``rows x entities`` temporaries (at a million entities and a 21-row window those were
    most of a tick). Needs at least two rows.
    """
    n = rows[-1].shape[0]
    out = np.empty(n)
    for s in range(0, n, _CHUNK):
        e = min(s + _CHUNK, n)
        prev, acc = rows[0][s:e], None
        for row in rows[1:]:
            cur = row[s:e]
            d = cur - prev
            np.copyto(d, cur, where=d < 0)
            np.copyto(d, 0.0, where=np.isnan(d))
            if acc is None:
                acc = d
            else:
                acc += d
            prev = cur
        out[s:e] = acc
    return out


def ramp(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """0 below ``lo``, 1 above ``hi``, linear between; NaN reads as no evidence (as ``lo`` does).

    The same values as ``clip((nan_to_num(x, nan=lo) - lo) / (hi - lo), 0, 1)`` in three passes
    instead of eight: an infinity clips to 0 or 1 either way, and only a NaN x (or 0 / 0 where
    lo == hi) is NaN before the clip, which then takes what ``lo`` would give."""
    x = np.asarray(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.clip((x - lo) / (hi - lo), 0.0, 1.0)
        at_lo = np.clip((np.full((), lo, dtype=y.dtype) - lo) / (hi - lo), 0.0, 1.0)  # in x's precision
    if y.ndim == 0:
        return at_lo if np.isnan(y) else y
    np.copyto(y, at_lo, where=np.isnan(y))
    return y


def noisy_or(scores: np.ndarray) -> np.ndarray:
    """Combine independent evidence in [0, 1] along the last axis.

    An [N, E] array is folded one channel at a time (the same products, in the same order,
    as ``1 - prod(1 - scores)``, without an [N, E] temporary)."""
    if scores.ndim != 2 or scores.shape[1] == 0:
        return 1.0 - np.prod(1.0 - scores, axis=-1)
    acc = 1.0 - scores[:, 0]
    for j in range(1, scores.shape[1]):
        acc *= 1.0 - scores[:, j]
    return 1.0 - acc
