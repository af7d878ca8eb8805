"""A bounded ring of recent signal values for every entity, for the entity detail view.

The controller's own History keeps only what assessment needs (a few rows per signal);
operators want the last minutes of every signal of the entity they clicked. This ring
keeps ``depth`` rows of every signal as float32, with ``depth`` cut down so the whole
ring stays inside ``budget_bytes`` (100k GPUs keep fewer rows than 2k). Beside the raw
signals it keeps every entity's GFS per tick (rows named ``gfs:<kind>``, written with
`record` after the tick's assessment), so the dashboard can draw a score against its
thresholds over time. Written by the controller thread, read by API handlers: reads are
bounded to what a given snapshot had seen, so a handler never mixes a newer tick into an
older snapshot.
"""

from __future__ import annotations

import threading

import numpy as np

from seamguard.fleet.model import Fleet
from seamguard.observe.frame import Frame
from seamguard.observe.signals import SIGNALS

SCORE_PREFIX = "gfs:"


def score_row(kind_label: str) -> str:
    """The ring row holding the GFS of every entity of a kind."""
    return SCORE_PREFIX + kind_label


class SignalRing:
    def __init__(self, sizes: dict[str, int], depth: int = 240, budget_bytes: int = 256 << 20) -> None:
        per_row = max(sum(sizes.values()) * 4, 1)
        self.depth = int(max(8, min(depth, budget_bytes // per_row)))
        self._sizes = dict(sizes)
        self._rows: dict[str, np.ndarray] = {}
        self._t = np.full(self.depth, np.nan)
        self._pushed = 0
        self._lock = threading.Lock()

    @classmethod
    def for_fleet(cls, fleet: Fleet, kinds, depth: int = 240, budget_bytes: int = 256 << 20) -> SignalRing:
        """Every signal of the registry plus a GFS row per kind in ``kinds``."""
        sizes = {s.name: fleet.count(s.kind) for s in SIGNALS}
        sizes.update({score_row(k.label): fleet.count(k) for k in kinds})
        return cls(sizes, depth=depth, budget_bytes=budget_bytes)

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

    def record(self, values: dict[str, np.ndarray]) -> None:
        """Add rows (e.g. the tick's GFS) to the frame pushed last, so they share its time."""
        with self._lock:
            if self._pushed == 0:
                return
            slot = (self._pushed - 1) % self.depth
            for name, arr in values.items():
                if name not in self._sizes:
                    continue  # only rows the depth was budgeted for
                rows = self._rows.get(name)
                if rows is None or rows.shape[1] != arr.shape[0]:
                    rows = np.full((self.depth, arr.shape[0]), np.nan, dtype=np.float32)
                    self._rows[name] = rows
                rows[slot] = arr

    def latest(self, name: str) -> np.ndarray | None:
        """A copy of the last pushed row of ``name`` (None before the first push)."""
        with self._lock:
            rows = self._rows.get(name)
            if rows is None or self._pushed == 0:
                return None
            return rows[(self._pushed - 1) % self.depth].copy()

    def _slots(self, upto: int, last: int | None) -> np.ndarray:
        # Rows written after the snapshot overwrote the oldest ones it could see.
        newer = self._pushed - upto
        avail = max(0, min(upto, self.depth - newer))
        k = avail if last is None else min(avail, last)
        return (upto - max(k, 0) + np.arange(max(k, 0))) % self.depth

    def matrix(self, name: str, cols: np.ndarray, upto: int, last: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(times [k], values [k, len(cols)]) of several entities' signal, oldest first."""
        with self._lock:
            rows = self._rows.get(name)
            slots = self._slots(upto, last)
            if rows is None or slots.size == 0:
                return np.empty(0), np.empty((0, len(cols)))
            cols = cols[cols < rows.shape[1]]
            return self._t[slots].copy(), rows[np.ix_(slots, cols)].astype(float)

    def series(self, name: str, index: int, upto: int, last: int | None = None) -> tuple[list[float], list[float | None]]:
        """(times, values) of one entity's signal, oldest first, as of push count ``upto``."""
        with self._lock:
            rows = self._rows.get(name)
            slots = self._slots(upto, last)
            if rows is None or slots.size == 0 or index >= rows.shape[1]:
                return [], []
            vals = rows[slots, index].astype(float)
            t = self._t[slots]
        return t.tolist(), [None if np.isnan(v) else round(float(v), 4) for v in vals]
