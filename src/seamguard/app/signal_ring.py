"""A bounded ring of recent signal values for every entity, for the entity detail view.

The controller's own History keeps only what assessment needs (a few rows per signal);
operators want the last minutes of every signal of the entity they clicked. This ring
keeps ``depth`` rows of every signal as float32, with ``depth`` cut down so the whole
ring stays inside ``budget_bytes`` (100k GPUs keep fewer rows than 2k). Written by the
controller thread, read by API handlers: reads are bounded to what a given snapshot
had seen, so a handler never mixes a newer tick into an older snapshot.
"""

from __future__ import annotations

import threading

import numpy as np

from seamguard.observe.frame import Frame


class SignalRing:
    def __init__(self, sizes: dict[str, int], depth: int = 240, budget_bytes: int = 256 << 20) -> None:
        per_row = max(sum(sizes.values()) * 4, 1)
        self.depth = int(max(8, min(depth, budget_bytes // per_row)))
        self._sizes = dict(sizes)
        self._rows: dict[str, np.ndarray] = {}
        self._t = np.full(self.depth, np.nan)
        self._pushed = 0
        self._lock = threading.Lock()

    @property
    def pushed(self) -> int:
        return self._pushed

    def push(self, frame: Frame) -> int:
        """Record one frame; returns the push count a snapshot should remember."""
        with self._lock:
            slot = self._pushed % self.depth
            for name, arr in frame.values.items():
                rows = self._rows.get(name)
                if rows is None or rows.shape[1] != arr.shape[0]:
                    rows = np.full((self.depth, arr.shape[0]), np.nan, dtype=np.float32)
                    self._rows[name] = rows
                rows[slot] = arr
            for name, rows in self._rows.items():
                if name not in frame.values:
                    rows[slot] = np.nan
            self._t[slot] = frame.t_s
            self._pushed += 1
            return self._pushed

    def series(self, name: str, index: int, upto: int, last: int | None = None) -> tuple[list[float], list[float | None]]:
        """(times, values) of one entity's signal, oldest first, as of push count ``upto``."""
        with self._lock:
            rows = self._rows.get(name)
            # Rows written after the snapshot overwrote the oldest ones it could see.
            newer = self._pushed - upto
            avail = max(0, min(upto, self.depth - newer))
            k = avail if last is None else min(avail, last)
            if rows is None or k <= 0 or index >= rows.shape[1]:
                return [], []
            slots = (upto - k + np.arange(k)) % self.depth
            vals = rows[slots, index].astype(float)
            t = self._t[slots]
        return t.tolist(), [None if np.isnan(v) else round(float(v), 4) for v in vals]
