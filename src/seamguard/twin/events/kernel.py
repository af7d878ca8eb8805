"""Deterministic discrete-event kernel: a heap of ``(time, priority, sequence, event)``.

Why this file exists: the twin's job-level consequences are processed one event at a time
in time order; ties are broken first by an explicit priority (repairs before failures
before detections, so a node that comes back at the same instant is usable) and then by
insertion sequence, so a seed reproduces a run exactly (simpy's ``core.py`` uses the same
scheme). Bulk streams generated with numpy are loaded with one ``heapify``.
"""

from __future__ import annotations

import heapq
from typing import Any, Iterable

__all__ = ["EventQueue"]


class EventQueue:
    """A min-heap of ``(time_s, priority, seq, kind, data)`` tuples."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, int, Any]] = []
        self._seq = 0

    def push(self, time_s: float, priority: int, kind: int, data: Any = None) -> None:
        """Schedule one event."""
        heapq.heappush(self._heap, (time_s, priority, self._seq, kind, data))
        self._seq += 1

    def extend(self, events: Iterable[tuple[float, int, int, Any]]) -> None:
        """Add many ``(time_s, priority, kind, data)`` events at once (one heapify)."""
        seq = self._seq
        add = [(t, p, seq + i, k, d) for i, (t, p, k, d) in enumerate(events)]
        self._seq = seq + len(add)
        self._heap.extend(add)
        heapq.heapify(self._heap)

    def pop(self) -> tuple[float, int, int, int, Any]:
        """Remove and return the earliest event."""
        return heapq.heappop(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)
