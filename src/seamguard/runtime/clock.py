"""Where the training process's parts get the time: one small clock they are given.

The step transaction, the snapshot pipeline, the membership follower and recovery
(runtime/worker.py and its parts) read time only through a :class:`Clock`, so a test can
drive them with a clock of its own instead of patching the ``time`` module, and so every
bounded wait in them is bounded by the same clock. :data:`SYSTEM_CLOCK` is the real one.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """The four readings the runtime's parts use (the ``time`` functions of those names)."""

    def monotonic(self) -> float:
        """Seconds for deadlines and ages (never goes back)."""

    def perf_counter(self) -> float:
        """Seconds for measuring short phases (highest resolution)."""

    def thread_time(self) -> float:
        """CPU seconds of the calling thread."""

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a bounded nap in a polling wait)."""


class SystemClock:
    """The process's real clocks. Looked up at each call, not bound at import."""

    def monotonic(self) -> float:
        return time.monotonic()

    def perf_counter(self) -> float:
        return time.perf_counter()

    def thread_time(self) -> float:
        return time.thread_time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM_CLOCK: Clock = SystemClock()
