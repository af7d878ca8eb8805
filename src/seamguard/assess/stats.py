"""Vectorized robust statistics over entity groups (peer groups), NaN-aware.

Peer comparisons use the leave-one-out forms (:func:`loo_median`, :func:`loo_robust_z`):
an entity is never its own peer (docs/evidence.md, "Peer groups and parents").
"""

from __future__ import annotations

from collections.abc import Sequence

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


def _sorted_groups(x: np.ndarray, group: np.ndarray, n_groups: int):
    """Finite values sorted by (group, value): (entity per sorted slot, counts and starts per group,
    each entity's rank in its group, -1 without a value)."""
    ok = np.flatnonzero(np.isfinite(x))
    order = ok[_group_sort(x[ok], group[ok])]
    counts = np.bincount(group[ok], minlength=n_groups)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    rank = np.full(len(x), -1, dtype=np.int64)
    rank[order] = np.arange(len(order)) - starts[group[order]]
    return order, counts, starts, rank


def _loo_pick(xs: np.ndarray, start: np.ndarray, rank: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Median of the ``m`` sorted values of a group other than the one at ``rank`` (NaN where m == 0).
    A rank past every slot (an entity without a value) excludes nothing."""
    has = m > 0
    lo, hi = np.maximum(m - 1, 0) // 2, m // 2
    i_lo = start + lo + (lo >= rank)
    i_hi = start + hi + (hi >= rank)
    out = np.full(len(m), np.nan)
    if len(xs):
        top = len(xs) - 1
        out[has] = 0.5 * (xs[np.minimum(i_lo, top)] + xs[np.minimum(i_hi, top)])[has]
    return out


_NO_RANK = np.iinfo(np.int64).max // 4


def loo_median(x: np.ndarray, group: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Per entity, the median of the *other* members of its group, and how many there are.

    An entity is never its own peer: with itself in the group a member of two sees half
    its own deviation, a member of three a third of it. An entity without a value is
    compared with every member that has one. One sort, no Python loop over groups.
    """
    order, counts, starts, rank = _sorted_groups(x, group, n_groups)
    has = rank >= 0
    others = np.where(has, counts[group] - 1, counts[group])
    return _loo_pick(x[order], starts[group], np.where(has, rank, _NO_RANK), others), others


def loo_robust_z(x: np.ndarray, group: np.ndarray, n_groups: int, floor: float,
                 min_peers: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Leave-one-out peer deviation: (x - median of the others) / (1.4826 * MAD of the others).

    Returns (z, peer median, peer count) per entity; z and the median are NaN where fewer
    than ``min_peers`` others have a value (too few to say what normal is: the caller
    falls back to the entity's own history and the design envelope). The MAD is taken
    around the others' own median, over the others only, and floored at ``floor``.
    A group's leave-one-out median takes one of three values (the entity below, at or
    above its middle); for each, the few order statistics of the whole group's deviations
    that a leave-one-out median reads are found by :func:`_kth_nearest` (no sort of the
    deviations), and each entity drops its own deviation from them by comparison.
    """
    order, counts, starts, rank = _sorted_groups(x, group, n_groups)
    has = rank >= 0
    others = np.where(has, counts[group] - 1, counts[group])
    xs = x[order]
    med = _loo_pick(xs, starts[group], np.where(has, rank, _NO_RANK), others)
    mad = np.full(len(x), np.nan)
    mad[order] = _loo_mad_sorted(xs, counts, starts, group[order])
    enough = others >= min_peers
    scale = np.maximum(1.4826 * np.nan_to_num(mad, nan=floor), floor)
    z = np.where(enough, (x - med) / scale, np.nan)
    return z, np.where(enough, med, np.nan), others


def _loo_mad_sorted(xs: np.ndarray, counts: np.ndarray, starts: np.ndarray, gs: np.ndarray) -> np.ndarray:
    """Per slot of the group-sorted ``xs`` (group ``gs``), the median absolute deviation of the
    *other* members of its group around their own median (NaN for a group of one).

    With ``m`` others the median reads ranks ``lo`` and ``hi`` of m sorted values; without one
    member those are ranks lo or lo + 1 and hi or hi + 1 of the whole group (the member's own
    deviation sits below or above them), so three order statistics per group and centre suffice."""
    if len(xs) == 0:
        return np.zeros(0)
    top = len(xs) - 1
    g = np.flatnonzero(counts > 0)
    st, cnt = starts[g], counts[g]
    m = cnt - 1
    lo, hi = np.maximum(m - 1, 0) // 2, m // 2

    def at(i: np.ndarray) -> np.ndarray:
        return xs[np.minimum(st + i, top)]
    centres = np.concatenate([0.5 * (at(lo) + at(hi)), 0.5 * (at(lo) + at(hi + 1)), 0.5 * (at(lo + 1) + at(hi + 1))])
    # kth[(v * 3 + j) * G + i]: rank lo + j (0..2, clamped to the group) of group g[i]'s deviations from centre v.
    n_g = len(g)
    k = np.tile(np.concatenate([np.minimum(lo + j, m) for j in range(3)]), 3)
    kth = _kth_nearest(xs, np.tile(st, 9), np.tile(cnt, 9), np.repeat(centres.reshape(3, n_g), 3, axis=0).ravel(), k)
    slot_of = np.full(len(counts), -1, dtype=np.int64)
    slot_of[g] = np.arange(n_g)
    i = slot_of[gs]  # each slot's group, as an index into g
    r = np.arange(len(xs)) - st[i]
    lo_i, hi_i = lo[i], hi[i]
    variant = np.where(r > hi_i, 0, np.where(r > lo_i, 1, 2))
    own = np.abs(xs - centres[variant * n_g + i])
    at_lo = variant * (3 * n_g) + i  # rank lo of the slot's centre

    def drop_own(j: np.ndarray) -> np.ndarray:  # rank lo + j (j = 0, 1) of the others' deviations
        below, above = kth[at_lo + j * n_g], kth[at_lo + (j + 1) * n_g]
        return np.where(own > below, below, above)
    out = 0.5 * (drop_own(0) + drop_own(hi_i - lo_i))  # hi is rank lo or lo + 1
    return np.where(m[i] > 0, out, np.nan)


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
    """0 below ``lo``, 1 above ``hi``, linear between; NaN reads as no evidence."""
    return np.clip((np.nan_to_num(x, nan=lo) - lo) / (hi - lo), 0.0, 1.0)


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
