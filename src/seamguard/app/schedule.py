"""The one wall-clock schedule every loop in seamguard ticks on.

A fixed grid ``start + k * period_s``. What happens when a loop falls behind is the
caller's choice, made once here rather than re-implemented per loop:

- ``late="skip"`` (the controller): grid points already in the past are dropped and the
  loop takes the latest one — a frame of the present beats a backlog of stale ones. The
  dropped count is kept (``skipped``) so the loop can say it is not keeping up.
- ``late="catch_up"`` (the twin exporter, whose simulated time is wall time x speed):
  every grid point runs, back to back, until the loop is on time again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Literal


class Schedule:
    def __init__(self, period_s: float, *, start_s: float | None = None, first_at_start: bool = True,
                 late: Literal["skip", "catch_up"] = "skip", clock: Callable[[], float] = time.time) -> None:
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.period_s = float(period_s)
        self.clock = clock
        self.start_s = clock() if start_s is None else float(start_s)
        self.late = late
        self.k = 0 if first_at_start else 1
        self.skipped = 0

    @property
    def next_s(self) -> float:
        return self.start_s + self.k * self.period_s

    def due(self) -> float | None:
        """The grid time of the tick to run now (and advance), or None if none is due yet."""
        now = self.clock()
        if now < self.next_s:
            return None
        if self.late == "skip":
            latest = math.floor((now - self.start_s) / self.period_s)
            if latest > self.k:
                self.skipped += latest - self.k
                self.k = latest
        t = self.next_s
        self.k += 1
        return t

    def wait_s(self) -> float:
        """Seconds until the next tick is due (0 when one is due now)."""
        return max(0.0, self.next_s - self.clock())

    def lag_s(self) -> float:
        """How far behind the grid the loop is now (0 when on time)."""
        return max(0.0, self.clock() - self.next_s)
