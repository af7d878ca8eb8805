"""Vectorized robust statistics over entity groups (peer groups), NaN-aware.

Peer comparisons use the leave-one-out forms (:func:`loo_median`, :func:`loo_robust_z`):
an entity is never its own peer (docs/evidence.md, "Peer groups and parents").
"""

from __future__ import annotations

import numpy as np


def group_median(x: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """Median of the non-NaN values of each group (NaN for an empty group).

    One lexsort for all groups: O(N log N), no Python loop over groups.
    """
    ok = ~np.isnan(x)
    xs, gs = x[ok], group[ok]
    out = np.full(n_groups, np.nan)
    if xs.size == 0:
        return out
    order = np.lexsort((xs, gs))
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


def _sorted_groups(x: np.ndarray, group: np.ndarray, n_groups: int):
    """Finite values sorted by (group, value): (entity of each sorted slot, its group's start, its group's count,
    counts per group, starts per group)."""
    ok = np.flatnonzero(np.isfinite(x))
    order = ok[np.lexsort((x[ok], group[ok]))]
    counts = np.bincount(group[ok], minlength=n_groups)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    return order, counts, starts


def _loo_pick(xs: np.ndarray, start: np.ndarray, rank: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Median of the ``m`` sorted values of a group other than the one at ``rank`` (NaN where m == 0)."""
    has = m > 0
    lo, hi = np.maximum(m - 1, 0) // 2, m // 2
    i_lo = start + lo + (lo >= rank)
    i_hi = start + hi + (hi >= rank)
    top = max(len(xs) - 1, 0)
    out = np.full(len(m), np.nan)
    if len(xs):
        out[has] = 0.5 * (xs[np.minimum(i_lo, top)] + xs[np.minimum(i_hi, top)])[has]
    return out


def loo_median(x: np.ndarray, group: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Per entity, the median of the *other* members of its group, and how many there are.

    An entity is never its own peer: with itself in the group a member of two sees half
    its own deviation, a member of three a third of it. An entity without a value is
    compared with every member that has one. One lexsort, no Python loop over groups.
    """
    n = len(x)
    order, counts, starts = _sorted_groups(x, group, n_groups)
    xs = x[order]
    rank = np.full(n, -1, dtype=np.int64)  # -1: not in the sorted set (no value), excluded from nothing
    rank[order] = np.arange(len(order)) - starts[group[order]]
    g_start, g_count = starts[group], counts[group]
    others = np.where(rank >= 0, g_count - 1, g_count)
    # Ranks above every slot (an entity without a value) shift nothing.
    eff_rank = np.where(rank >= 0, rank, np.iinfo(np.int64).max // 4)
    return _loo_pick(xs, g_start, eff_rank, others), others


def loo_robust_z(x: np.ndarray, group: np.ndarray, n_groups: int, floor: float,
                 min_peers: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Leave-one-out peer deviation: (x - median of the others) / (1.4826 * MAD of the others).

    Returns (z, peer median, peer count) per entity; z and the median are NaN where fewer
    than ``min_peers`` others have a value (too few to say what normal is: the caller
    falls back to the entity's own history and the design envelope). The MAD is taken
    around the others' own median, over the others only, and floored at ``floor``.
    Exact: a group's leave-one-out median takes one of at most three values (the entity
    below, at or above the middle), so the MAD is computed once for each of them.
    """
    med, peers = loo_median(x, group, n_groups)
    mad = np.full(len(x), np.nan)
    # Group members share their leave-one-out median by which side of the middle they sit on.
    finite = np.isfinite(x)
    side = np.sign(np.nan_to_num(x - group_median(x, group, n_groups)[group]))
    for s in (-1.0, 0.0, 1.0):
        sel = (side == s) & finite
        if not sel.any():
            continue
        centre = np.full(n_groups, np.nan)
        centre[group[sel]] = med[sel]
        dv = np.abs(x - centre[group])
        loo_mad, _ = loo_median(dv, group, n_groups)
        mad = np.where(sel, loo_mad, mad)
    enough = peers >= min_peers
    scale = np.maximum(1.4826 * np.nan_to_num(mad, nan=floor), floor)
    z = np.where(enough, (x - med) / scale, np.nan)
    return z, np.where(enough, med, np.nan), peers


def ramp(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """0 below ``lo``, 1 above ``hi``, linear between; NaN reads as no evidence."""
    return np.clip((np.nan_to_num(x, nan=lo) - lo) / (hi - lo), 0.0, 1.0)


def noisy_or(scores: np.ndarray) -> np.ndarray:
    """Combine independent evidence in [0, 1] along the last axis."""
    return 1.0 - np.prod(1.0 - scores, axis=-1)
