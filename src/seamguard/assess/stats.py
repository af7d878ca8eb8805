"""Vectorized robust statistics over entity groups (peer groups), NaN-aware."""

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


def ramp(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """0 below ``lo``, 1 above ``hi``, linear between; NaN reads as no evidence."""
    return np.clip((np.nan_to_num(x, nan=lo) - lo) / (hi - lo), 0.0, 1.0)


def noisy_or(scores: np.ndarray) -> np.ndarray:
    """Combine independent evidence in [0, 1] along the last axis."""
    return 1.0 - np.prod(1.0 - scores, axis=-1)


def group_max(x: np.ndarray, group: np.ndarray, n_groups: int, initial: float = 0.0) -> np.ndarray:
    out = np.full(n_groups, initial, dtype=float)
    np.maximum.at(out, group, x)
    return out
