"""The served controller: ticks on a wall-clock schedule in one thread, publishes Snapshots.

All writes to the controller (ticks, mode switches, breaker resets, pins) happen on this
one thread, in order: API handlers submit a command and wait for it with a bound, so a
command never lands in the middle of a tick. After every tick (and every command) the
thread builds a fresh immutable Snapshot and swaps the reference under a lock.
``speed`` compresses simulated time: a 5 s twin tick runs every 5/speed wall seconds;
``speed=0`` ticks only when asked (`advance`), which tests and benchmarks use.
"""

from __future__ import annotations

import logging
import queue
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from pathlib import Path
from typing import Any

from seamguard.assess.overrides import Pin
from seamguard.assess.states import State
from seamguard.control import Controller, TickReport
from seamguard.decide.policy import Policy, default_policy
from seamguard.fleet.model import Kind
from seamguard.ledger.sqlite import Ledger
from seamguard.observe.signals import SIGNALS
from seamguard.service.signal_ring import SignalRing
from seamguard.service.snapshot import (
    TICK_BUCKETS,
    Counters,
    Snapshot,
    ThroughputPoint,
    build_views,
    state_counts_by,
)
from seamguard.service.sources import Source

log = logging.getLogger("seamguard.service")


class ServiceUnavailable(RuntimeError):
    """The controller thread is not running or did not answer within the bound."""


class ServiceRunner:
    def __init__(self, source: Source, *, policy: Policy | None = None, mode: str = "enforce",
                 speed: float = 10.0, ledger_path: str | Path | None = None, ring_depth: int = 240,
                 throughput_points: int = 2000) -> None:
        if speed < 0:
            raise ValueError(f"speed must be >= 0 (0 = tick only when asked), got {speed}")
        self.source = source
        self.speed = float(speed)
        self.tick_s = float(getattr(source, "tick_s", 15.0))
        self._tmpdir: tempfile.TemporaryDirectory | None = None
        if ledger_path is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="seamguard-serve-")
            ledger_path = Path(self._tmpdir.name) / "ledger.sqlite"
        self.ledger_path = str(ledger_path)
        self.ledger = Ledger(self.ledger_path)
        fleet = source.placement()
        self.controller = Controller(fleet, policy or default_policy(mode=mode), source.actuators(),
                                     ledger=self.ledger, tick_s=self.tick_s, mode=mode)
        self.ring = SignalRing({s.name: fleet.count(s.kind) for s in SIGNALS}, depth=ring_depth)
        self._throughput: deque[ThroughputPoint] = deque(maxlen=throughput_points)
        self._actions: Counter[tuple[str, str, str]] = Counter()
        self._transitions: Counter[tuple[str, str]] = Counter()
        self._tick_buckets = [0] * len(TICK_BUCKETS)
        self._ticks = 0
        self._tick_errors = 0
        self._tick_sum = 0.0
        self._last_report: TickReport | None = None
        self._started_wall = time.time()
        self._lock = threading.Lock()
        self._cmds: queue.Queue[tuple[Callable[[], Any], Future]] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._snap = self._build_snapshot(None)

    # ---- reading -----------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._snap

    def _publish(self, snap: Snapshot) -> None:
        with self._lock:
            self._snap = snap

    @property
    def tick_interval_s(self) -> float:
        return self.tick_s / self.speed if self.speed > 0 else 0.0

    # ---- the controller thread ------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="seamguard-controller", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self.ledger.close()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        next_due = time.monotonic()
        while not self._stop.is_set():
            wait = 0.25
            if self.speed > 0:
                now = time.monotonic()
                if now >= next_due:
                    self.tick_once()
                    # Fall behind rather than burst: a slow tick delays the schedule.
                    next_due = max(next_due + self.tick_interval_s, time.monotonic())
                wait = min(wait, max(0.0, next_due - time.monotonic()))
            try:
                fn, fut = self._cmds.get(timeout=wait)
            except queue.Empty:
                continue
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except Exception as e:  # reported to the caller, never kills the loop
                    fut.set_exception(e)

    def submit(self, fn: Callable[[], Any], timeout_s: float = 15.0) -> Any:
        """Run ``fn`` on the controller thread between ticks; wait at most ``timeout_s``."""
        if not self.running:
            raise ServiceUnavailable("the controller thread is not running")
        fut: Future = Future()
        self._cmds.put((fn, fut))
        try:
            return fut.result(timeout=timeout_s)
        except FutureTimeout:
            fut.cancel()
            raise ServiceUnavailable(f"the controller did not take the command within {timeout_s:g} s") from None

    def advance(self, ticks: int = 1, timeout_s: float = 120.0) -> Snapshot:
        """Run ``ticks`` ticks now (on the controller thread when it runs)."""
        def go() -> Snapshot:
            for _ in range(ticks):
                self.tick_once()
            return self.snapshot()
        return self.submit(go, timeout_s) if self.running else go()

    # ---- one tick (controller thread only) ------------------------------------------------------
    def tick_once(self) -> TickReport:
        frame = self.source.next_frame()
        self.ring.push(frame)
        self.controller.set_fleet(self.source.placement())
        rep = self.controller.tick(frame)
        self._ticks += 1
        self._tick_sum += rep.tick_s
        for i, b in enumerate(TICK_BUCKETS):
            if rep.tick_s <= b:
                self._tick_buckets[i] += 1
        if rep.error:
            self._tick_errors += 1
        for ch in rep.changes:
            verb = ch.action.verb.value if ch.action is not None else ch.key.split(":", 1)[0]
            self._actions[(verb, ch.op, ch.status)] += 1
        if rep.assessment is not None:
            for tr in rep.assessment.transitions:
                self._transitions[(tr.kind.label, tr.to_state.label)] += 1
        prog = self.source.progress()
        if prog is not None:
            self._throughput.append(ThroughputPoint(frame.t_s, round(prog.useful_with, 5),
                                                    None if prog.useful_without is None else
                                                    round(prog.useful_without, 5)))
        self._last_report = rep
        self._publish(self._build_snapshot(rep))
        return rep

    def _build_snapshot(self, rep: TickReport | None) -> Snapshot:
        ctl = self.controller
        fleet = ctl.fleet
        prev = self._snap.kinds if hasattr(self, "_snap") else None
        a = rep.assessment if rep is not None else None
        if rep is not None and a is None and hasattr(self, "_snap"):
            # A failed tick: keep the last good picture, report the error.
            a = self._snap.assessment
            views = self._snap.kinds
        else:
            views = build_views(fleet, a, prev)
        n_loops, n_racks = fleet.count(Kind.COOLING_LOOP), fleet.count(Kind.RACK)
        loop_counts = {k: state_counts_by(views[k].loop, views[k].state, n_loops) for k in (Kind.GPU, Kind.NODE, Kind.NIC)}
        rack_counts = state_counts_by(views[Kind.GPU].rack, views[Kind.GPU].state, n_racks)
        counters = Counters(
            ticks=self._ticks, tick_errors=self._tick_errors, tick_seconds_sum=self._tick_sum,
            tick_buckets=tuple(self._tick_buckets),
            actions=tuple((v, o, s, n) for (v, o, s), n in sorted(self._actions.items())),
            transitions=tuple((k, s, n) for (k, s), n in sorted(self._transitions.items())))
        in_effect: set[str] = set()
        for act in ctl.actuators:
            in_effect |= act.observe()
        return Snapshot(
            tick=(rep.tick if rep is not None else -1), t_s=(rep.t_s if rep is not None else 0.0),
            wall_s=time.time(), source=self.source.name, mode=ctl.mode, speed=self.speed,
            tick_interval_s=self.tick_interval_s, fleet=fleet, assessment=a, kinds=views,
            loop_counts=loop_counts, rack_counts=rack_counts, breaker=ctl.breaker,
            pins=tuple(ctl.pins.values()), in_effect=tuple(sorted(in_effect)),
            assess_s=rep.assess_s if rep else 0.0, decide_s=rep.decide_s if rep else 0.0,
            act_s=rep.act_s if rep else 0.0, tick_s=rep.tick_s if rep else 0.0,
            tick_error=rep.error if rep else "", ring_upto=self.ring.pushed,
            progress=self.source.progress(), throughput=tuple(self._throughput), counters=counters,
            started_wall_s=self._started_wall)

    def _republish(self) -> Snapshot:
        """After a command: same tick, new controls (mode, breaker, pins)."""
        ctl = self.controller
        snap = replace(self.snapshot(), mode=ctl.mode, breaker=ctl.breaker, pins=tuple(ctl.pins.values()),
                       wall_s=time.time())
        self._publish(snap)
        return snap

    # ---- operator commands (each runs on the controller thread) -------------------------------------
    def set_mode(self, mode: str) -> Snapshot:
        if mode not in ("dry_run", "enforce"):
            raise ValueError(f"mode must be 'dry_run' or 'enforce', got {mode!r}")

        def go() -> Snapshot:
            if mode != self.controller.mode:
                log.warning("mode %s -> %s by operator", self.controller.mode, mode)
            self.controller.mode = mode
            return self._republish()
        return self.submit(go)

    def reset_breaker(self) -> Snapshot:
        def go() -> Snapshot:
            self.controller.reset_breaker()
            return self._republish()
        return self.submit(go)

    def pin(self, kind: Kind, name: str, state: State, note: str, by: str = "operator") -> Pin:
        def go() -> Pin:
            p = self.controller.pin(kind, name, state, note, by=by, since_wall_s=time.time())
            self._republish()
            return p
        return self.submit(go)

    def unpin(self, kind: Kind, name: str, by: str = "operator") -> Pin | None:
        def go() -> Pin | None:
            p = self.controller.unpin(kind, name, by=by)
            self._republish()
            return p
        return self.submit(go)
