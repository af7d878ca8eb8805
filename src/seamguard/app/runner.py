"""The one runner: `seamguard run`, `seamguard serve` (twin or live) and the tests drive it.

It owns a source, the controller, its ledger and its actuators, and ticks on the one
wall-clock `Schedule`. All writes to the controller (ticks, mode switches, breaker
resets, pins) happen on the runner's thread, in order: API handlers submit a command
and wait for it with a bound, so a command never lands in the middle of a tick. After
every tick (and every command) the thread builds a fresh immutable Snapshot and swaps
the reference under a lock.

``speed`` compresses simulated time: a 5 s twin tick runs every 5/speed wall seconds;
``speed=0`` ticks only when asked (`advance`), which tests and benchmarks use. A
runner built from a run config (`from_config`) reads the config's policy, mode, ledger
and events file: `run --config` and `serve --config` are the same controller.

With ``ha`` (a run config's ``ha:``, docs/ha.md) the runner is one replica of several:
an `Elector` (app/leader.py) keeps or campaigns for an etcd lease, and the runner ticks
only while its term allows acting. Taking over, it fences the shared ledger with its
token and builds its controller from the ledger (state, breaker, pins, pending actions
settled against what the actuators hold), then ticks at once; a write the ledger refuses
(a newer leader) or a term past its local deadline ends its leadership before the next
actuator call. A follower answers reads and refuses operator commands.

If the loop itself dies (a bug outside the controller's per-tick guard), the runner
records why, `healthy` turns false (`/healthz` answers 503) and `run()` re-raises, so
`seamguard run` exits non-zero instead of idling.
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
from typing import IO, Any

import numpy as np

from seamguard.app.config import RunConfig, load_policy
from seamguard.app.leader import Elector, LeaseSettings
from seamguard.app.replay import EventStream, dumps
from seamguard.app.schedule import Schedule
from seamguard.app.signal_ring import SignalRing, score_row
from seamguard.app.snapshot import (
    COOLANT_SIGNALS,
    ENTITY_KINDS,
    TICK_BUCKETS,
    Counters,
    FleetPoint,
    Snapshot,
    ThroughputPoint,
    build_views,
    fleet_point,
    state_counts_by,
)
from seamguard.app.sources import PrometheusLiveSource, Source
from seamguard.assess.overrides import Pin
from seamguard.assess.states import State
from seamguard.control import Controller, TickReport
from seamguard.decide.policy import Policy, default_policy
from seamguard.fleet.model import Kind
from seamguard.ledger import Fence, Fenced, open_ledger
from seamguard.ledger.series import SeriesTick, SeriesWriter, encode_fleet, watched
from seamguard.observe.frame import Frame, make_frame
from seamguard.observe.signals import signals_for

log = logging.getLogger("seamguard.runner")

FOLLOWER_WAKE_S = 0.05  # how often a follower looks at the elector's term (takeover latency)


class ServiceUnavailable(RuntimeError):
    """The controller thread is not running or did not answer within the bound."""


class _TickTally:
    """Counts since start for `/metrics`: ticks, failed ticks, tick time, changes, transitions."""

    def __init__(self) -> None:
        self.ticks = 0
        self.errors = 0
        self.seconds_sum = 0.0
        self.buckets = [0] * len(TICK_BUCKETS)
        self.changes: Counter[tuple[str, str, str]] = Counter()
        self.transitions: Counter[tuple[str, str]] = Counter()

    def add(self, rep: TickReport) -> None:
        self.ticks += 1
        self.seconds_sum += rep.tick_s
        for i, b in enumerate(TICK_BUCKETS):
            self.buckets[i] += rep.tick_s <= b
        self.errors += bool(rep.error)
        for ch in rep.changes:
            self.changes[(ch.verb, ch.op, ch.status)] += 1
        if rep.assessment is not None:
            for tr in rep.assessment.transitions:
                self.transitions[(tr.kind.label, tr.to_state.label)] += 1

    def counters(self) -> Counters:
        return Counters(ticks=self.ticks, tick_errors=self.errors, tick_seconds_sum=self.seconds_sum,
                        tick_buckets=tuple(self.buckets),
                        actions=tuple((v, o, s, n) for (v, o, s), n in sorted(self.changes.items())),
                        transitions=tuple((k, s, n) for (k, s), n in sorted(self.transitions.items())))


def tick_line(rep: TickReport, named: int = 3) -> str:
    """One log line for what changed in a tick (state transitions, actions applied or reverted);
    empty when nothing did. The first ``named`` of each are named, the rest counted."""
    parts = []
    trs = rep.assessment.transitions if rep.assessment is not None else []
    if trs:
        txt = ", ".join(f"{t.kind.label} {t.entity} {t.from_state.label}->{t.to_state.label}" for t in trs[:named])
        parts.append(txt + (f" (+{len(trs) - named} more)" if len(trs) > named else ""))
    if rep.changes:
        txt = ", ".join(f"{c.op} {c.key} ({c.status})" for c in rep.changes[:named])
        parts.append(txt + (f" (+{len(rep.changes) - named} more)" if len(rep.changes) > named else ""))
    return f"tick {rep.tick}: " + "; ".join(parts) if parts else ""


def series_tick(s: Snapshot, frame: Frame) -> SeriesTick | None:
    """What the ledger keeps of the tick ``s`` was built from: its fleet point, useful throughput,
    and the signals and GFS of the entities `watched` picks (None before any tick)."""
    if not s.fleet_history or s.tick < 0:
        return None
    p = s.fleet_history[-1]
    tp = s.throughput[-1] if s.throughput and s.throughput[-1].t_s == p.t_s else None
    fleet = encode_fleet(p.gpu_counts, p.node_counts, tp.useful_with if tp else None,
                         tp.useful_without if tp else None, p.loop_state, p.coolant)
    kinds = {k.label: k for k in ENTITY_KINDS}
    picks = watched({x: s.kinds[k].gfs for x, k in kinds.items()}, {x: s.kinds[k].state for x, k in kinds.items()})
    ents = []
    for label, i in picks:
        k = kinds[label]
        row = [frame.values.get(sig.name) for sig in signals_for(k)]
        vals = np.array([v[i] if v is not None and i < v.shape[0] else np.nan for v in row], dtype=np.float32)
        ents.append((label, s.kinds[k].names[i], float(np.nan_to_num(s.kinds[k].gfs[i])), vals))
    return SeriesTick(s.tick, p.t_s, p.wall_s, fleet, tuple(ents))


class Runner:
    def __init__(self, source: Source, *, policy: Policy | None = None, mode: str = "enforce",
                 speed: float = 10.0, ledger_path: str | Path | None = None, events_out: Path | None = None,
                 max_ticks: int | None = None, ring_depth: int = 240, throughput_points: int = 2000,
                 ha: LeaseSettings | None = None) -> None:
        if speed < 0:
            raise ValueError(f"speed must be >= 0 (0 = tick only when asked), got {speed}")
        self.source = source
        self.speed = float(speed)
        self.tick_s = float(getattr(source, "tick_s", 15.0))
        self.max_ticks = max_ticks
        self._tmpdir: tempfile.TemporaryDirectory | None = None
        if ledger_path is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="seamguard-serve-")
            ledger_path = Path(self._tmpdir.name) / "ledger.sqlite"
        self.ledger_path = str(ledger_path)
        self.ledger = open_ledger(ledger_path)
        fleet = source.placement()
        self._policy = policy or default_policy(mode=mode)
        self._mode = mode
        self._actuators = source.actuators()
        self.elector: Elector | None = Elector(ha) if ha is not None else None
        self._token = 0  # the fencing token of this replica's term (0: following, or not HA)
        self.controller = self._follower_view(fleet) if ha is not None else Controller(
            fleet, self._policy, self._actuators, ledger=self.ledger, tick_s=self.tick_s, mode=mode)
        self.ring = SignalRing.for_fleet(fleet, ENTITY_KINDS, depth=ring_depth)
        self._events = EventStream()
        self._events_fh: IO[str] | None = open(events_out, "a", encoding="utf-8") if events_out else None
        self._throughput: deque[ThroughputPoint] = deque(maxlen=throughput_points)
        self._fleet_history: deque[FleetPoint] = deque(maxlen=throughput_points)  # dashboard's fleet panels
        # The same panels persisted (ledger/series.py), by a thread of their own: never on the tick's path.
        self.series = SeriesWriter(lambda: open_ledger(self.ledger_path))
        self._tally = _TickTally()
        self._schedule: Schedule | None = None
        self._last_t_s: float | None = None
        self._in_effect: dict[str, set[str]] = {}
        self._started_wall = time.time()
        self._lock = threading.Lock()
        self._cmds: queue.Queue[tuple[Callable[[], Any], Future]] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.fatal: str = ""
        self._snap = self._build_snapshot(None)

    @classmethod
    def from_config(cls, cfg: RunConfig, **overrides: Any) -> Runner:
        """The live controller a run config describes: its source, actuators, policy, mode, ledger."""
        source = PrometheusLiveSource(cfg)
        kw: dict[str, Any] = dict(policy=load_policy(cfg.policy), mode=cfg.mode,
                                  speed=cfg.time_scale, ledger_path=cfg.ledger, events_out=cfg.events_out,
                                  max_ticks=cfg.max_ticks)
        if cfg.ha is not None:
            kw["ha"] = LeaseSettings(tuple(cfg.ha.etcd), cfg.ha.name, cfg.ha.lease_s, cfg.ha.key)
        kw.update(overrides)
        return cls(source, **kw)

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

    @property
    def ticks(self) -> int:
        return self._tally.ticks

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def leading(self) -> bool:
        """This replica acts: it is not HA, or it leads (its term's token fences the ledger)."""
        return self.elector is None or self._token > 0

    @property
    def healthy(self) -> bool:
        """The loop is alive and has not died of an error."""
        return self.running and not self.fatal

    # ---- the runner's thread ------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="seamguard-controller", daemon=True)
        self._thread.start()

    def run(self) -> int:
        """Tick on the calling thread until `stop()` (or ``max_ticks``); returns the ticks run."""
        self._thread = threading.current_thread()
        try:
            self._loop()
        finally:
            self._thread = None
            self.close()
        if self.fatal:
            raise RuntimeError(self.fatal)
        return self._tally.ticks

    def request_stop(self) -> None:
        """Finish the tick in progress, then leave the loop (safe from a signal handler)."""
        self._stop.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
            self._thread = None
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.elector is not None:
            self.elector.stop()  # resigns: a follower takes over without waiting for the lease to expire
        self.series.close()
        if self._events_fh is not None:
            self._events_fh.close()
        close = getattr(self.source, "close", None)
        if close is not None:
            close()
        self.ledger.close()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
        log.info("runner stopped after %d ticks; ledger closed", self._tally.ticks)

    def _loop(self) -> None:
        self._schedule = Schedule(self.tick_interval_s) if self.speed > 0 else None
        if self.elector is not None:
            self.elector.start()
        try:
            while not self._stop.is_set():
                wait = 0.25
                if self.elector is not None and not self._follow_term():
                    wait = FOLLOWER_WAKE_S
                elif self._schedule is not None:
                    t_wall = self._schedule.due()
                    if t_wall is not None:
                        self.tick_once(t_wall)
                        if self.max_ticks is not None and self._tally.ticks >= self.max_ticks:
                            break
                    wait = min(wait, self._schedule.wait_s())
                try:
                    fn, fut = self._cmds.get(timeout=wait)
                except queue.Empty:
                    continue
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except Exception as e:  # reported to the caller, never kills the loop
                        fut.set_exception(e)
        except Exception as e:  # outside the controller's per-tick guard: the loop is over
            self.fatal = f"{type(e).__name__}: {e}"
            log.critical("controller loop died: %s", self.fatal, exc_info=True)

    # ---- leadership (HA only; controller thread) ---------------------------------------------
    def _follower_view(self, fleet) -> Controller:
        """What a follower shows: the fleet and policy, no ledger (a follower writes nothing)."""
        return Controller(fleet, self._policy, self._actuators, ledger=None, tick_s=self.tick_s, mode=self._mode)

    def _follow_term(self) -> bool:
        """Take over or step down as the elector's term says; True while this replica leads."""
        assert self.elector is not None
        term = self.elector.term()
        if term.may_act(self.elector.clock()) and term.token != self._token:
            self._take_over(term.token)
        elif self._token and not self.elector.may_act(self._token):
            self._step_down(f"term {self._token} ended (lease lost or not renewed in time)")
        return self._token > 0

    def _take_over(self, token: int) -> None:
        assert self.elector is not None
        elector, name = self.elector, self.elector.settings.name
        try:
            self.ledger.take_fence(Fence(token, name, lambda: elector.may_act(token)))
            ctl = Controller(self.source.placement(), self._policy, self._actuators, ledger=self.ledger,
                             tick_s=self.tick_s, mode=self._mode)
        except Fenced as e:
            log.error("%s cannot take over: %s", name, e)
            self._step_down(str(e), resign=elector.may_act(token))
            return
        except Exception as e:  # the ledger unreachable: another replica may do better
            log.error("%s cannot take over: the ledger failed: %s: %s", name, type(e).__name__, e)
            self._step_down(str(e), resign=True)
            return
        self.controller, self._token = ctl, token
        log.warning("%s leads with token %d from tick %d of the ledger", name, token, ctl.tick_no)
        if self.speed > 0:
            self._schedule = Schedule(self.tick_interval_s)  # tick now: the fleet has waited a lease
        self._publish(self._build_snapshot(None))

    def _step_down(self, why: str, resign: bool = False) -> None:
        assert self.elector is not None
        if self._token:
            log.error("%s stops acting: %s", self.elector.settings.name, why)
        self._token = 0
        self.ledger.drop_fence()
        if resign:  # the ledger has a newer term: this lease, if it lives, only delays nobody
            self.elector.resign()
        self.controller = self._follower_view(self.controller.fleet)

    def _require_leader(self) -> None:
        if not self.leading:
            raise ServiceUnavailable("this replica follows: send commands to the leader")

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
    def _next_frame(self, wall_s: float) -> Frame:
        """The source's frame; a source that fails gives an empty, flagged frame (the controller then
        freezes for want of data instead of the loop dying)."""
        try:
            frame = self.source.next_frame(wall_s)
        except Exception as e:
            log.error("source %s failed: %s: %s", self.source.name, type(e).__name__, e)
            t_s = self._last_t_s + self.tick_s if self._last_t_s is not None else 0.0
            frame = make_frame(self.controller.fleet, t_s, {},
                               flags=(f"source:{self.source.name}: {type(e).__name__}: {e}",))
        self._last_t_s = frame.t_s
        return frame

    def _observe(self) -> set[str]:
        """What the actuators hold in effect; one that cannot say keeps its last good answer."""
        held: set[str] = set()
        for act in self.controller.actuators:
            try:
                self._in_effect[act.name] = act.observe()
            except Exception as e:
                log.warning("actuator %s cannot report what is in effect: %s: %s", act.name, type(e).__name__, e)
            held |= self._in_effect.get(act.name, set())
        return held

    def tick_once(self, wall_s: float | None = None) -> TickReport:
        self._require_leader()
        wall_s = time.time() if wall_s is None else wall_s
        frame = self._next_frame(wall_s)
        self.ring.push(frame)
        self.controller.set_fleet(self.source.placement())
        try:
            rep = self.controller.tick(frame)
        except Fenced as e:  # deposed mid-tick: nothing after the refused write happened
            token = self._token
            self._step_down(str(e), resign=self.elector is not None and self.elector.may_act(token))
            return TickReport(self.controller.tick_no, frame.t_s, None, None, error=f"Fenced: {e}")
        self._tally.add(rep)
        if rep.error:
            log.error("tick %d failed: %s", rep.tick, rep.error)
        line = tick_line(rep)
        if line:
            log.info("%s", line)
        prog = self.source.progress()
        if prog is not None:
            self._throughput.append(ThroughputPoint(frame.t_s, round(prog.useful_with, 5),
                                                    None if prog.useful_without is None else
                                                    round(prog.useful_without, 5)))
        if self._events_fh is not None:
            extra = {"wall": wall_s, **({"flags": list(frame.flags)} if frame.flags else {})}
            for ev in self._events.events(rep, extra):
                self._events_fh.write(dumps(ev) + "\n")
            self._events_fh.flush()
        snap = self._build_snapshot(rep)
        self._publish(snap)
        self._persist_series(snap, frame)
        return rep

    def _persist_series(self, snap: Snapshot, frame: Frame) -> None:
        """Hand the tick's series to the writer thread; nothing here may fail the tick."""
        try:
            st = series_tick(snap, frame)
            if st is not None:
                self.series.put(st)
        except Exception as e:
            self.series.failed += 1
            log.error("tick %d: series not persisted: %s: %s", snap.tick, type(e).__name__, e)

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
        sched = self._schedule
        skipped = sched.skipped if sched is not None else 0
        if rep is not None:
            # Dashboard history: every entity's GFS beside its signals, fleet figures per tick.
            self.ring.record({score_row(k.label): views[k].gfs for k in ENTITY_KINDS})
            self._fleet_history.append(fleet_point(views, {n: self.ring.latest(n) for n in COOLANT_SIGNALS},
                                                   rep.t_s, time.time(), skipped))
        n_loops, n_racks = fleet.count(Kind.COOLING_LOOP), fleet.count(Kind.RACK)
        loop_counts = {k: state_counts_by(views[k].loop, views[k].state, n_loops) for k in (Kind.GPU, Kind.NODE, Kind.NIC)}
        rack_counts = state_counts_by(views[Kind.GPU].rack, views[Kind.GPU].state, n_racks)
        counters = self._tally.counters()
        in_effect = self._observe()
        return Snapshot(
            tick=(rep.tick if rep is not None else -1), t_s=(rep.t_s if rep is not None else 0.0),
            wall_s=time.time(), source=self.source.name, mode=ctl.mode, speed=self.speed,
            tick_interval_s=self.tick_interval_s, fleet=fleet, assessment=a, kinds=views,
            loop_counts=loop_counts, rack_counts=rack_counts, breaker=ctl.breaker,
            pins=tuple(ctl.pins.values()), in_effect=tuple(sorted(in_effect)),
            failsafe=ctl.failsafe.frozen_scopes(),
            assess_s=rep.assess_s if rep else 0.0, decide_s=rep.decide_s if rep else 0.0,
            act_s=rep.act_s if rep else 0.0, tick_s=rep.tick_s if rep else 0.0,
            tick_error=rep.error if rep else "", ring_upto=self.ring.pushed,
            progress=self.source.progress(), throughput=tuple(self._throughput), counters=counters,
            started_wall_s=self._started_wall, fleet_history=tuple(self._fleet_history), ticks_skipped=skipped,
            schedule_lag_s=sched.lag_s() if sched is not None else 0.0)

    def _republish(self) -> Snapshot:
        """After a command: same tick, new controls (mode, breaker, pins)."""
        ctl = self.controller
        snap = replace(self.snapshot(), mode=ctl.mode, breaker=ctl.breaker, pins=tuple(ctl.pins.values()),
                       failsafe=ctl.failsafe.frozen_scopes(),
                       wall_s=time.time())
        self._publish(snap)
        return snap

    # ---- operator commands (each runs on the controller thread) -------------------------------------
    def set_mode(self, mode: str, by: str = "operator") -> Snapshot:
        """Switch dry_run/enforce (the controller validates and records it)."""
        def go() -> Snapshot:
            self._require_leader()
            self.controller.set_mode(mode, by)
            return self._republish()
        return self.submit(go)

    def reset_breaker(self, by: str = "operator", why: str = "") -> Snapshot:
        """A person resets the tripped breaker; who and why are recorded in the ledger."""
        def go() -> Snapshot:
            self._require_leader()
            self.controller.reset_breaker(by=by, why=why)
            return self._republish()
        return self.submit(go)

    def pin(self, kind: Kind, name: str, state: State, note: str, by: str = "operator") -> Pin:
        def go() -> Pin:
            self._require_leader()
            p = self.controller.pin(kind, name, state, note, by=by, since_wall_s=time.time())
            self._republish()
            return p
        return self.submit(go)

    def unpin(self, kind: Kind, name: str, by: str = "operator") -> Pin | None:
        def go() -> Pin | None:
            self._require_leader()
            p = self.controller.unpin(kind, name, by=by)
            self._republish()
            return p
        return self.submit(go)
