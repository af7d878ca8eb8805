"""The time range a history request asks for, checked before anything is read.

Every history endpoint (`/history/*`, `/timeline`, `/transitions`, `/decisions`,
`/actions`, an entity's detail) takes ``since`` and ``until`` in the controller's clock
(`Snapshot.t_s`: simulated seconds for the twin, Unix seconds for a live source). Both
arrive as text so that a bad value gets one line saying which parameter and why, not a
validation tree. A range's series are thinned by `groups` (equal spans of time, each
rolled up whole) so a week never comes back as one point per tick. Pure functions: no
clock, no I/O; the handlers pass the snapshot's time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAX_SPAN_S = 31 * 86400.0  # the picker's longest range is 7 days; a month is the most one request reads
MAX_T_S = 1e11  # beyond year 5000 in Unix seconds: a typo, not a time
MAX_TEXT = 32  # characters a time may take


@dataclass(frozen=True)
class TimeRange:
    """[since_t_s, until_t_s] in controller seconds; None = that end is open."""

    since_t_s: float | None = None
    until_t_s: float | None = None

    def holds(self, t_s: float) -> bool:
        return (self.since_t_s is None or t_s >= self.since_t_s) and (self.until_t_s is None or t_s <= self.until_t_s)


ALL = TimeRange()


def _seconds(name: str, text: str | None) -> float | None:
    if text is None or text == "":
        return None
    if len(text) > MAX_TEXT:
        raise ValueError(f"{name}: {len(text)} characters; a time is a number of seconds (at most {MAX_TEXT})")
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{name}: {text!r} is not a number of seconds") from None
    if not math.isfinite(v) or not 0.0 <= v <= MAX_T_S:
        raise ValueError(f"{name}: {text!r} is outside 0..{MAX_T_S:.0e} seconds")
    return v


def parse(since: str | None, until: str | None) -> TimeRange:
    """The checked range; ValueError with one line naming the parameter when it is wrong."""
    a, b = _seconds("since", since), _seconds("until", until)
    if a is not None and b is not None:
        if a >= b:
            raise ValueError(f"since ({a:g}) must be before until ({b:g})")
        if b - a > MAX_SPAN_S:
            raise ValueError(f"since..until spans {(b - a) / 86400:.1f} days; at most {MAX_SPAN_S / 86400:.0f} "
                             "days per request")
    return TimeRange(a, b)


def groups(t_s, points: int) -> np.ndarray:
    """First index of each group of consecutive samples (oldest first) when ``t_s`` is cut into
    ``points`` equal spans of time from its first to its last sample; every sample is in one
    group, and there are at most ``points`` (one per sample when they are no more)."""
    t = np.asarray(t_s, dtype=np.float64)
    if t.size <= max(points, 1):
        return np.arange(t.size)
    span = t[-1] - t[0]
    if points <= 1 or span <= 0:
        return np.array([0])
    b = np.minimum(((t - t[0]) / span * points).astype(np.int64), points - 1)
    return np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
