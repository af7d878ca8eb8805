"""Per-flap figures from a job's committed-step log: stall, regain, back-to-multirail.

Why this exists: the demo and `benchmarks/rail_failover.py` score seamguard and the
torchrun baseline the same way, from the wall-clock times at which steps committed.
Pure functions over lists; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WINDOW_S = 1.0  # throughput window for "regained 95 %"


@dataclass(frozen=True)
class FlapFigures:
    stall_s: float  # longest gap between consecutive commits from the fault to its end + 5 s
    regain_95_s: float  # fault start -> start of the first 1 s window at >= 95 % pre-fault rate
    full_multirail_s: float  # link back -> first commit that used every rail (or rate regained)


def rate(t: np.ndarray, a: float, b: float) -> float:
    return float(((t >= a) & (t < b)).sum()) / max(b - a, 1e-9)


def first_window_at(t: np.ndarray, start: float, target: float) -> float:
    """Earliest window start >= start (at a commit time) whose WINDOW_S rate reaches target."""
    for s in [start, *t[t >= start]]:
        if s + WINDOW_S > t[-1]:
            break
        if rate(t, s, s + WINDOW_S) >= target:
            return float(s)
    return float("nan")


def flap_figures(commit_t: list[float], rails_used: list[list[int]] | None, n_rails: int,
                 applied_t: float, reverted_t: float, pre_s: float = 2.0) -> FlapFigures:
    t = np.asarray(sorted(commit_t))
    pre = rate(t, applied_t - pre_s, applied_t)
    win = t[(t >= applied_t) & (t <= reverted_t + 5.0)]
    before = t[t < applied_t]
    after = t[t > reverted_t + 5.0]  # a job that stalls past the window still ends its gap here
    edges = np.concatenate([before[-1:], win, after[:1]])
    stall = float(np.diff(edges).max()) if edges.size > 1 else float("nan")
    regain = first_window_at(t, applied_t, 0.95 * pre) - applied_t
    if rails_used is not None:
        full = next((tt - reverted_t for tt, r in zip(commit_t, rails_used)
                     if tt >= reverted_t and len(r) == n_rails), float("nan"))
    else:
        full = first_window_at(t, reverted_t, 0.95 * pre) - reverted_t
    return FlapFigures(stall, max(regain, 0.0), max(full, 0.0))
