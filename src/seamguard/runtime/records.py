"""The records the training process's threads exchange, each swapped whole.

Three threads meet in a training process: the training thread (the step transaction and
recovery), the membership follower's heartbeat and generation threads, and the snapshot
pipeline's. They share no attributes: the training thread publishes a :class:`Progress`
(what the heartbeat sends: step, phase, the last step's split, snapshot and persist
steps), and the follower publishes :class:`Controls` (the newest generation announced and
the control counter the last heartbeat read). Each lives on a :class:`Board`: a writer
builds a new frozen record under the board's lock and swaps the reference; a reader takes
the reference once and reads a consistent record without a lock, the pattern the
controller's snapshot (app/snapshot.py) uses for its HTTP handlers.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

R = TypeVar("R")


class Board(Generic[R]):
    """One immutable record, replaced whole. Writers take the lock (several threads may
    write fields of the same record); readers read ``current`` and never block."""

    def __init__(self, record: R) -> None:
        self._record = record
        self._lock = threading.Lock()

    @property
    def current(self) -> R:
        return self._record

    def update(self, **changes) -> R:
        """Publish the current record with ``changes`` (``dataclasses.replace``)."""
        with self._lock:
            self._record = dataclasses.replace(self._record, **changes)
            return self._record

    def swap(self, change: Callable[[R], R]) -> R:
        """Publish ``change(current)``; ``change`` is pure and runs under the lock."""
        with self._lock:
            self._record = change(self._record)
            return self._record


@dataclass(frozen=True)
class Progress:
    """Where this worker is, as its heartbeat reports it (the coordinator's detectors and
    the job's metrics read these fields: runtime/detect.py, runtime/metrics.py)."""

    step: int = 0
    phase: str = "start"
    """start, compute, collective, snapshot, persist, idle, recover or done."""
    gen: int = -1
    rank: int = -1
    """-1: a spare (or not yet placed)."""
    compute_s: float = 0.0
    """The last step's compute before its gradient collective."""
    comm_s: float = 0.0
    """The last step's gradient collective."""
    stall_s: float = 0.0
    """How long the last step waited for its snapshot copy."""
    snap_step: int = -1
    """Newest step whose snapshot is complete in host memory."""
    persisted_step: int = -1
    """Newest step this rank committed to the checkpoint directory."""
    snap_cost_s: float | None = None
    """--snapshot-every auto: the snapshot's estimated cost (None: not measured yet)."""
    copies: int = 1
    """--snapshot-every auto: ranks holding this rank's state live, itself included."""

    def beat(self, n: int, host: str, local: int, auto: bool) -> dict:
        """The heartbeat's JSON body (``n``: the heartbeat counter)."""
        body = {"n": n, "step": self.step, "phase": self.phase, "compute_s": self.compute_s,
                "comm_s": self.comm_s, "stall_s": self.stall_s, "snap_step": self.snap_step,
                "persisted_step": self.persisted_step, "gen": self.gen, "host": host, "local": local}
        if auto:
            body |= {"snap_cost_s": self.snap_cost_s, "copies": self.copies}
        return body


@dataclass(frozen=True)
class Controls:
    """What the membership follower learned from the store: the newest generation
    announced, and the control counter (keys.CONTROL_N) with when it was read."""

    gen_seen: int = -1
    control_n: int | None = None
    """None: not read yet (the key may not exist)."""
    control_read_s: float = 0.0
    """The clock's monotonic reading when ``control_n`` was read."""

    def with_generation(self, gen: int) -> "Controls":
        """The record with ``gen`` seen; an older reading never moves it back."""
        return self if gen <= self.gen_seen else dataclasses.replace(self, gen_seen=gen)
