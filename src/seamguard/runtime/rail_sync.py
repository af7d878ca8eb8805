"""The runtime's gradient all-reduce over the host's rails, one RailGroup per generation.

A job launched with ``--rails rail0,rail1`` gets rail failover for its gradient
collective: every generation (membership) builds a ``RailGroup`` (runtime/rails.py: one
gloo group per rail interface, fixed chunks, a rail given up on carrier loss, a peer's
announcement, a missed deadline or a gray bandwidth, and rebuilt when it is back) under
its own store prefix, with the generation's ranks. A rail flap then costs a few chunks
re-run on the other rail, never a recovery; losing a rank still goes through the
runtime's recovery, and the next generation builds its own RailGroup.

The collective runs on a private copy of the buffer in a helper thread, so the training
thread can give up on it when a new generation appears (a peer died) without anything
writing into the buffer later; the abandoned RailGroup is closed and kept until exit.

The control plane can ask the job to stay off rails (an ``avoid_rails`` hint, fixed from a
step every rank agrees on: runtime/stepmodes.py); each collective is passed the rails
avoided at its step, so the change happens between collectives, never inside one. Every
change is logged with the rails the first collective under it actually used.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

from seamguard.runtime import keys
from seamguard.runtime.clock import SYSTEM_CLOCK, Clock
from seamguard.runtime.rails import CollectiveReport, RailGroup, RailSettings, RailsError


def rail_prefix(gen: int) -> str:
    return f"{keys.ROOT}/rails/{gen}"


class RailSync:
    """``allreduce(flat, step, cancelled)`` on this generation's rails; ``close()`` when it ends."""

    def __init__(self, store: dist.Store, gen: int, rank: int, world: int, interfaces: tuple[str, ...],
                 start_timeout_s: float, clock: Clock = SYSTEM_CLOCK, chunks: int = 0) -> None:
        settings = RailSettings(interfaces=interfaces, start_timeout_s=start_timeout_s, chunks=chunks)
        self.group = RailGroup(store, rank, world, settings, prefix=rail_prefix(gen))
        self.interfaces = interfaces
        self.last: CollectiveReport | None = None
        self.broken = False
        self._time = clock
        self._seen = 0
        self._avoided: tuple[str, ...] = ()  # what the last successful collective stayed off
        self._own_events: list[dict] = []

    def allreduce(self, flat: torch.Tensor, step: int, cancelled: Callable[[], bool],
                  timeout_s: float, avoid: tuple[str, ...] = ()) -> str:
        """Sum ``flat`` over the ranks in place, off the rails named in ``avoid`` while another
        is usable. Returns "" on success, else why it failed ("cancelled", "timeout" or the
        RailsError); after a failure this group is done."""
        if self.broken:
            return "rail group abandoned"
        buf = flat.clone()
        out: dict[str, object] = {}
        avoid_ids = frozenset(i for i, name in enumerate(self.interfaces) if name in avoid)

        def run() -> None:
            try:
                out["report"] = self.group.allreduce_(buf, step, avoid_ids)
            except (RailsError, RuntimeError) as exc:
                out["error"] = str(exc)

        worker = threading.Thread(target=run, name="sg-rail-allreduce", daemon=True)
        worker.start()
        deadline = self._time.monotonic() + timeout_s
        nap_s = 0.0002
        while worker.is_alive():
            if cancelled() or self._time.monotonic() > deadline:
                self.broken = True
                return "cancelled" if cancelled() else "timeout"
            worker.join(nap_s)
            nap_s = min(0.005, nap_s * 1.5)
        if "error" in out:
            self.broken = True
            return str(out["error"])
        flat.copy_(buf)
        self.last = out["report"]  # type: ignore[assignment]
        self._note_avoidance(tuple(n for n in self.interfaces if n in avoid), step)
        return ""

    def _note_avoidance(self, avoided: tuple[str, ...], step: int) -> None:
        """An event per rail whose avoidance changed at this step, with the rails it used."""
        used = list(self.last.rails_used) if self.last is not None else []
        for name in self.interfaces:
            if (name in avoided) != (name in self._avoided):
                self._own_events.append({"event": "avoided" if name in avoided else "restored", "step": step,
                                         "rail": self.interfaces.index(name), "rails_used": used,
                                         "reason": "control-plane hint (avoid_rails)"})
        self._avoided = avoided

    def new_events(self) -> list[dict]:
        """Rail transitions (out, probe, in; avoided, restored) since the last call, for the job's log."""
        group = self.group.events[self._seen:]
        self._seen += len(group)
        own, self._own_events = self._own_events, []
        return group + own

    def close(self) -> None:
        # the generation is over (a peer may be gone): do not wait for the last vote
        self.group.close(settle=False)
