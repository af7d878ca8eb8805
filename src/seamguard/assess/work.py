"""Work is not a fault: a storage path's write bursts are judged against its own burst length.

A synchronous checkpoint writes for a minute or two, and every path it writes to is slow
for that long: latency many times its floor, on schedule, every interval. Read as evidence
it moves the path to ``checkpoint_unsafe`` (and the planner to ``avoid_storage``) on the
burst's second scrape. Here the latency evidence of a path counts only once its slow run
outlasts the burst length the path itself has shown while healthy (learned per path,
assess/baselines.py :func:`burst_step`); a path that stops answering or fails its probes is
judged by those channels, which no burst excuses. Pure (docs/evidence.md, "Work is not a fault").

Called by assess/assessment.py on the storage evidence.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from seamguard.assess.baselines import BaselineConfig, BurstBaseline, burst_step
from seamguard.assess.evidence import Evidence

# The storage channels that a write burst moves (and that a burst within its length excuses).
BURST_CHANNELS = ("latency_ratio", "latency_ms")


def storage_bursts(e: Evidence, base: BurstBaseline, healthy: np.ndarray, dt_s: float,
                   cfg: BaselineConfig, min_height: float = 0.0) -> tuple[Evidence, BurstBaseline]:
    """The storage evidence with latency inside a path's burst allowance unscored, and the
    new burst baselines. Adds two data columns: ``burst`` (how long it has been slow, s) and
    ``burst_allowance`` (how long it may be, s). ``min_height``: the latency over its own
    floor a slow run must reach to be learned as a burst."""
    cols = [e.channels.index(c) for c in BURST_CHANNELS if c in e.channels]
    slow = (e.score[:, cols] > 0).any(axis=1) if cols else np.zeros(e.score.shape[0], dtype=bool)
    level = e.value[:, e.channels.index("latency_own")] if "latency_own" in e.channels else None
    seen = np.isfinite(e.value[:, e.channels.index("latency_ms")]) if "latency_ms" in e.channels else None
    new, within, allow = burst_step(base, slow, healthy, dt_s, cfg, level, seen, min_height)
    score = e.score.copy()
    if cols:
        score[:, cols] = np.where(within[:, None], 0.0, score[:, cols])
    n = score.shape[0]
    return replace(e, channels=e.channels + ("burst", "burst_allowance"), units=e.units + ("seconds", "seconds"),
                   score=np.concatenate([score, np.zeros((n, 2))], axis=1),
                   value=np.concatenate([e.value, np.stack([new.run_s, allow], axis=1).astype(float)], axis=1)), new

