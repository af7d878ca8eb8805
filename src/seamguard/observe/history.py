"""A bounded window of past frames, for counter rates and trends.

Only the controller mutates it (one `push` per tick); assessment reads it. Memory is
fixed: each signal keeps as many rows as the longest window that reads it needs
(``depth_by_signal``), ``default_depth`` otherwise, reused as a ring.
"""

from __future__ import annotations

import math

import numpy as np

from seamguard.observe.frame import Frame


class History:
    def __init__(self, tick_s: float, default_depth: int = 4,
                 depth_by_signal: dict[str, int] | None = None) -> None:
        if tick_s <= 0:
            raise ValueError(f"tick_s must be > 0, got {tick_s}")
        if default_depth < 1:
            raise ValueError(f"default_depth must be >= 1, got {default_depth}")
        self.tick_s = tick_s
        self.default_depth = default_depth
        self.depth_by_signal = dict(depth_by_signal or {})
        self._max_depth = max([default_depth, *self.depth_by_signal.values()])
        self._rows: dict[str, np.ndarray] = {}
        self._t = np.full(self._max_depth, np.nan)
        self._pushed = 0

    def __len__(self) -> int:
        return min(self._pushed, self._max_depth)

    def ticks_for(self, window_s: float) -> int:
        """How many past frames cover ``window_s`` at this history's tick interval."""
        return max(1, math.ceil(window_s / self.tick_s - 1e-9))

    def push(self, frame: Frame) -> None:
        for name, arr in frame.values.items():
            rows = self._rows.get(name)
            if rows is None or rows.shape[1] != arr.shape[0]:
                depth = self.depth_by_signal.get(name, self.default_depth)
                rows = np.full((depth, arr.shape[0]), np.nan)
                self._rows[name] = rows
            rows[self._pushed % rows.shape[0]] = arr
        for name, rows in self._rows.items():
            if name not in frame.values:
                rows[self._pushed % rows.shape[0]] = np.nan
        self._t[self._pushed % self._max_depth] = frame.t_s
        self._pushed += 1

    def _order(self, k: int, depth: int) -> np.ndarray:
        k = min(k, depth, self._pushed)
        return (self._pushed - k + np.arange(k)) % depth

    def times(self, k: int) -> np.ndarray:
        return self._t[self._order(k, self._max_depth)]

    def window(self, name: str, k: int) -> np.ndarray | None:
        """The last ``k`` rows (oldest first), or None if the signal was never seen.

        Fewer rows come back while the history is filling or if the signal keeps
        fewer than ``k``.
        """
        rows = self._rows.get(name)
        return None if rows is None else rows[self._order(k, rows.shape[0])]

    def rows(self, name: str, k: int) -> list[np.ndarray] | None:
        """The same rows as :meth:`window`, as read-only views of the ring (no copy), or None."""
        rows = self._rows.get(name)
        if rows is None:
            return None
        out = [rows[i] for i in self._order(k, rows.shape[0]).tolist()]
        for r in out:
            r.flags.writeable = False
        return out
