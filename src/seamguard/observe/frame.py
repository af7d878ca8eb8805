"""The Frame: one timestamp, every signal as a float array aligned to its entity kind.

The single record type that crosses from sources into assessment. NaN means the entity
did not report that signal in this frame; a signal absent from the frame altogether reads
as all-NaN. History keeps a bounded window of past frames for rates and trends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from seamguard.fleet.model import Fleet
from seamguard.observe.signals import REGISTRY


class FrameError(ValueError):
    """A frame whose arrays do not fit the fleet; the message names the signal."""


@dataclass(frozen=True, eq=False)
class Frame:
    t_s: float  # seconds on the controller's clock (Unix time for live sources)
    values: dict[str, np.ndarray]
    sizes: dict[str, int] = field(default_factory=dict)  # entity count per kind label
    flags: tuple[str, ...] = ()  # source problems this tick (failed queries, partial data)
    series: tuple = ()  # observe/unnamed.py SeriesBlock per kind: the series nobody named

    def get(self, name: str) -> np.ndarray:
        arr = self.values.get(name)
        if arr is not None:
            return arr
        sig = REGISTRY[name]
        return np.full(self.sizes.get(sig.kind.label, 0), np.nan)


def make_frame(fleet: Fleet, t_s: float, values: dict[str, np.ndarray], flags: tuple[str, ...] = (),
               series: tuple = ()) -> Frame:
    """Validate shapes against the fleet and build a frame (float64, NaN for missing)."""
    out: dict[str, np.ndarray] = {}
    for name, arr in values.items():
        sig = REGISTRY.get(name)
        if sig is None:
            raise FrameError(f"unknown signal {name!r}; register it in seamguard.observe.signals")
        a = np.asarray(arr, dtype=float)
        n = fleet.count(sig.kind)
        if a.shape != (n,):
            raise FrameError(f"signal {name!r}: expected shape ({n},) for {n} {sig.kind.label} entities, got {a.shape}")
        out[name] = a
    for b in series:
        if b.values.shape[0] != fleet.count(b.kind):
            raise FrameError(f"series block of {b.kind.label}: {b.values.shape[0]} rows for "
                             f"{fleet.count(b.kind)} entities")
    return Frame(t_s=float(t_s), values=out, sizes=fleet.summary(), flags=tuple(flags), series=tuple(series))
