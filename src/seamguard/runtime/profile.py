"""Where a training process's failure-free time goes, phase by phase.

`PhaseClock` adds up wall time and thread CPU time per named phase: on the training
thread (the step boundary, snapshot copies it waits for, FSDP2's collectives through the
runtime's group, the commit's wait for the replica) and on the runtime's own threads
(snapshot copy, hash, push to the holder, receiving a peer's replica, heartbeats). The
worker keeps one when the launch environment sets ``SEAMGUARD_PROFILE=1`` and reports
its totals as a ``profile`` event when the job finishes; benchmarks/failover_training.py
``--profile`` turns it into the per-phase table of docs/benchmarks.md. Disabled, every
call returns at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from seamguard.runtime.clock import SYSTEM_CLOCK, Clock


class PhaseClock:
    """Totals of wall seconds, thread CPU seconds and occurrences per phase."""

    def __init__(self, enabled: bool, clock: Clock = SYSTEM_CLOCK) -> None:
        """``clock``: where the phases' wall and CPU seconds are read."""
        self.enabled = enabled
        self._time = clock
        self._lock = threading.Lock()
        self._totals: dict[str, list[float]] = {}   # phase -> [wall_s, cpu_s, count]

    def add(self, phase: str, wall_s: float, cpu_s: float = 0.0, count: int = 1) -> None:
        if not self.enabled:
            return
        with self._lock:
            t = self._totals.setdefault(phase, [0.0, 0.0, 0])
            t[0] += wall_s
            t[1] += cpu_s
            t[2] += count

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the body as ``name`` (wall and this thread's CPU)."""
        if not self.enabled:
            yield
            return
        w0, c0 = self._time.perf_counter(), self._time.thread_time()
        try:
            yield
        finally:
            self.add(name, self._time.perf_counter() - w0, self._time.thread_time() - c0)

    def report(self, steps: int) -> dict[str, dict[str, float]]:
        """Per phase: totals and milliseconds per committed step (``steps`` >= 1)."""
        per = max(1, steps)
        with self._lock:
            return {name: {"wall_s": round(w, 4), "cpu_s": round(c, 4), "count": int(n),
                           "wall_ms_per_step": round(1e3 * w / per, 3),
                           "cpu_ms_per_step": round(1e3 * c / per, 3)}
                    for name, (w, c, n) in sorted(self._totals.items())}
