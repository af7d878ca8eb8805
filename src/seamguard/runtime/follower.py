"""The membership follower: a training process's heartbeat out, generations and controls in.

Two threads of a worker (runtime/worker.py) talk to the store it beats to (its node's
launcher when aggregated, else the job's): the heartbeat sends the worker's
:class:`~seamguard.runtime.records.Progress` every ``heartbeat_interval_s`` (the
coordinator judges liveness, stalls and stragglers from it) and reads the generation and
the control counter back; the generation thread blocks on the next generation's wake key
so a new generation is seen at once. Both publish what they learn as one
:class:`~seamguard.runtime.records.Controls` record; they read nothing of the training
thread but the Progress record it publishes.

:class:`ControlKeys` is the training thread's side: the keys ranks obey from a step
(keys.CONTROL_KEYS), read again only when the counter the heartbeat saw moved.
"""

from __future__ import annotations

import datetime
import json
import threading
from typing import Callable

import torch.distributed as dist

from seamguard.runtime import keys
from seamguard.runtime.clock import Clock
from seamguard.runtime.profile import PhaseClock
from seamguard.runtime.records import Board, Controls, Progress

SPARE_BEAT_EVERY = 4
"""An idle spare's heartbeat period, in heartbeat intervals."""


class MembershipFollower:
    """The heartbeat and generation threads of one worker (module docstring)."""

    def __init__(self, wid: int, beat_store: Callable[[], dist.Store], heartbeat_interval_s: float,
                 progress: Board[Progress], controls: Board[Controls], where: tuple[str, int],
                 clock: Clock, phases: PhaseClock, auto_cadence: bool = False,
                 idle_spare: Callable[[], None] = lambda: None) -> None:
        """``beat_store`` opens a connection of the follower's own; ``where``: (host as the
        topology names it, local GPU slot) for the job's metrics; ``auto_cadence``: the
        heartbeat carries the snapshot cost (--snapshot-every auto); ``idle_spare`` runs on
        the heartbeat thread while the worker is a spare."""
        self.wid = wid
        self._beat_store = beat_store
        self._interval_s = heartbeat_interval_s
        self.progress, self.controls = progress, controls
        self._host, self._local = where
        self._time, self._phases = clock, phases
        self._auto = auto_cadence
        self._idle_spare = idle_spare
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self.heartbeat_loop, name="sg-heartbeat", daemon=True).start()
        threading.Thread(target=self.follow_generations, name="sg-generations", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def see_generation(self, gen: int) -> None:
        """Record that generation ``gen`` was announced (both threads learn of them)."""
        self.controls.swap(lambda c: c.with_generation(gen))

    def follow_generations(self) -> None:
        """Learn of each new generation the moment it is announced: block on its wake key
        (the coordinator sets it, and a node's launcher mirrors it for its workers, after
        the generation key) in the store this worker beats to, which pushes the key when
        it appears. A rank waiting on a collective a new generation overtook is thereby
        released within one collective wake-up, not a heartbeat (and a node beat) later,
        so heartbeats can be slow: they only prove liveness and progress."""
        store = None
        while not self._stop.is_set():
            try:
                store = store or self._beat_store()
                nxt = self.controls.current.gen_seen + 1
                store.wait([keys.wake(nxt)], datetime.timedelta(seconds=keys.WAKE_WAIT_S))
                gen = int(store.get(keys.GENERATION))
            except dist.DistStoreError:
                continue   # no new generation within keys.WAKE_WAIT_S
            except (RuntimeError, ValueError, OSError):
                store = None   # the store went away (launcher restarting, job ending): retry
                self._stop.wait(self._interval_s)
                continue
            if gen < nxt:
                return   # the wake key without a generation: the job's end (JOB_DONE)
            self.see_generation(gen)

    def heartbeat_loop(self) -> None:
        store = self._beat_store()
        counter, both = 0, False   # both: the generation and the control counter exist
        while not self._stop.is_set():
            counter += 1
            w0, c0 = self._time.perf_counter(), self._time.thread_time()
            progress = self.progress.current
            try:
                both = self._beat(store, counter, progress, both)
            except (RuntimeError, ValueError, OSError):
                pass  # store unreachable: the launcher is gone or restarting; keep beating
            self._phases.add("bg_heartbeat", self._time.perf_counter() - w0, self._time.thread_time() - c0)
            spare = progress.rank < 0
            if spare:
                self._idle_spare()
            # an idle spare is not judged by its heartbeat (only ranks are) and waits for its
            # rank on a store key, not on the generation seen here: it beats less often
            self._stop.wait(self._interval_s * (SPARE_BEAT_EVERY if spare else 1))

    def _beat(self, store, counter: int, progress: Progress, both: bool) -> bool:
        """Send one heartbeat and read the generation and control counter back; returns
        whether both keys exist (never deleted: checked until seen)."""
        watched = [keys.GENERATION, keys.CONTROL_N]
        store.set(keys.heartbeat(self.wid),
                  json.dumps(progress.beat(counter, self._host, self._local, self._auto)))
        t_read = self._time.monotonic()
        both = both or store.check(watched)
        if both:
            gen, control = keys.read_existing(store, watched)
            self.controls.swap(lambda c: Controls(max(c.gen_seen, int(gen)), int(control), t_read))
        elif store.check([keys.GENERATION]):
            self.see_generation(int(store.get(keys.GENERATION)))
        return both


class ControlKeys:
    """The keys ranks obey from a step (keys.CONTROL_KEYS: step modes, persist point,
    cadence and targets) as they stand at a step boundary; the training thread's own.

    Every rank must see a change before the step it takes effect at. The coordinator
    writes a change, then bumps the counter, and fixes its start 3 steps beyond the
    furthest step any rank reported, plus the time the reports and a rank's reading may
    lag (Coordinator._ahead_step). The counter comes from the heartbeat (read with the
    generation; through the node's mirror, up to a node beat older, when aggregated) when
    that reading is from the last heartbeat interval or younger than the last step took,
    else from the store now. The coordinator's margin covers a reading that old, so a rank
    sees every change as surely as it did reading the keys at every step boundary; steps
    shorter than a heartbeat interval cost no request each (two per rank per step on etcd
    had been 47-68 requests/s for 4 ranks of 0.18 s steps, docs/benchmarks.md)."""

    def __init__(self, store, controls: Board[Controls], heartbeat_interval_s: float,
                 mirror_lag_s: float, clock: Clock) -> None:
        """``mirror_lag_s``: how much older the node's mirror of the counter may be."""
        self._store = store
        self._controls = controls
        self._interval_s = heartbeat_interval_s
        self.mirror_lag_s = mirror_lag_s
        self._time = clock
        self._read: tuple[int | None, dict[str, bytes | None]] = (None, {})   # (counter, CONTROL_KEYS)

    def at_boundary(self, last_step_s: float) -> dict[str, bytes | None]:
        """The control keys now; ``last_step_s``: wall time between the last two boundaries."""
        beat = self._controls.current
        if beat.control_n is not None and self._time.monotonic() - beat.control_read_s <= max(
                self._interval_s, last_step_s - self.mirror_lag_s):
            counter: int | None = beat.control_n
        else:
            raw = keys.peek(self._store, keys.CONTROL_N)
            counter = None if raw is None else int(raw)   # None: no counter, read every time
        if counter is None or counter != self._read[0]:
            self._read = (counter, {k: keys.peek(self._store, k) for k in keys.CONTROL_KEYS})
        return self._read[1]
