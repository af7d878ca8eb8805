"""Failure detection from heartbeats: unresponsive, stalled and straggling workers.

Each worker's heartbeat thread writes a counter, its step, its phase and the compute
time of its last step. The coordinator feeds what it reads into a HeartbeatTracker with
its own clock (injected, so tests drive time). A SIGSTOPped process stops its counter
(unresponsive). A process whose main thread is stuck keeps beating but its step does not
move while every peer waits in the collective (stalled). A persistently slow one shows
compute times far above its peers' median (straggler). Process exits are detected by
the launcher directly and never wait for these timeouts.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Beat:
    counter: int
    step: int
    phase: str
    compute_s: float


@dataclass(frozen=True)
class Verdict:
    wid: int
    kind: str  # "unresponsive" | "stalled" | "straggler"
    evidence: str


@dataclass
class _Track:
    counter: int
    counter_since_s: float
    step: int
    step_since_s: float
    phase: str
    compute_s: float
    slow_steps: int = 0
    last_judged_step: int = -1


@dataclass
class HeartbeatTracker:
    hang_timeout_s: float
    stall_timeout_s: float
    straggler_factor: float
    straggler_window: int
    tracks: dict[int, _Track] = field(default_factory=dict)

    def forget(self, wid: int) -> None:
        self.tracks.pop(wid, None)

    def observe(self, wid: int, beat: Beat, now_s: float) -> None:
        t = self.tracks.get(wid)
        if t is None:
            self.tracks[wid] = _Track(beat.counter, now_s, beat.step, now_s, beat.phase,
                                      beat.compute_s)
            return
        if beat.counter != t.counter:
            t.counter, t.counter_since_s = beat.counter, now_s
        if beat.step != t.step:
            t.step, t.step_since_s = beat.step, now_s
        t.phase, t.compute_s = beat.phase, beat.compute_s

    def observer_paused(self, gap_s: float) -> None:
        """The observer itself was away ``gap_s`` (a starved launcher on a loaded host):
        no beat could be seen in that time, so it does not count as anyone's silence."""
        for t in self.tracks.values():
            t.counter_since_s += gap_s
            t.step_since_s += gap_s

    def verdicts(self, active: list[int], now_s: float) -> list[Verdict]:
        """Judge the workers in `active` (the current ranks) at time `now_s`."""
        out: list[Verdict] = []
        tracks = {w: self.tracks[w] for w in active if w in self.tracks}
        for wid, t in tracks.items():
            silent = now_s - t.counter_since_s
            if silent > self.hang_timeout_s:
                out.append(Verdict(wid, "unresponsive",
                                   f"heartbeat silent {silent:.2f}s > {self.hang_timeout_s}s "
                                   f"at step {t.step} phase {t.phase}"))
        flagged = {v.wid for v in out}
        waiting = [w for w, t in tracks.items() if t.phase == "collective"]
        for wid, t in tracks.items():
            if wid in flagged or t.phase != "compute" or len(waiting) != len(tracks) - 1:
                continue
            stuck = now_s - t.step_since_s
            if stuck > self.stall_timeout_s:
                out.append(Verdict(wid, "stalled",
                                   f"step {t.step} not advancing for {stuck:.1f}s while "
                                   f"{len(waiting)} peers wait in the collective"))
        out.extend(self._stragglers(tracks))
        return out

    def _stragglers(self, tracks: dict[int, _Track]) -> list[Verdict]:
        out = []
        if len(tracks) < 3:
            return out
        for wid, t in tracks.items():
            if t.step == t.last_judged_step or t.compute_s <= 0:
                continue
            t.last_judged_step = t.step
            peers = [o.compute_s for w, o in tracks.items() if w != wid and o.compute_s > 0]
            if not peers:
                continue
            median = statistics.median(peers)
            if t.compute_s > self.straggler_factor * median:
                t.slow_steps += 1
            else:
                t.slow_steps = 0
            if t.slow_steps >= self.straggler_window:
                out.append(Verdict(wid, "straggler",
                                   f"compute {t.compute_s * 1e3:.0f}ms > {self.straggler_factor}x "
                                   f"peer median {median * 1e3:.0f}ms for {t.slow_steps} steps"))
        return out


@dataclass
class NodeTracker:
    """Liveness of whole nodes from their launchers' aggregated records (multi-node, etcd).

    A node's record counter stands still when its launcher is gone: the node is lost,
    with every worker its last record listed (ranks and idle spares alike), in one
    verdict instead of one heartbeat timeout per rank, so a dead spare is never handed a
    rank. The clock is the caller's.
    """

    hang_timeout_s: float
    own_node: int | None = None
    """The observer's node: never judged by its record, which the observer's own process
    writes (a late record there is the observer late, and were that node gone, so would be
    the observer)."""
    counters: dict[int, tuple[int, float]] = field(default_factory=dict)
    members: dict[int, set[int]] = field(default_factory=dict)
    lost: set[int] = field(default_factory=set)

    def observer_paused(self, gap_s: float) -> None:
        """As `HeartbeatTracker.observer_paused`: the observer's absence is nobody's silence."""
        self.counters = {n: (c, since_s + gap_s) for n, (c, since_s) in self.counters.items()}

    def observe(self, node: int, counter: int, wids: set[int], now_s: float) -> None:
        if node in self.lost:
            return
        last = self.counters.get(node)
        if last is None or last[0] != counter:
            self.counters[node] = (counter, now_s)
        self.members[node] = set(wids)

    def link_closed(self, node: int, default_members: set[int]) -> set[int] | None:
        """The node's launcher closed its link to the coordinator without a goodbye
        (runtime/nodelink.py): lost now, with the workers its last record listed
        (``default_members`` when no record came yet). None if already judged lost."""
        if node in self.lost:
            return None
        self.lost.add(node)
        return set(self.members.get(node, default_members))

    def verdicts(self, now_s: float, spared: set[int] = frozenset()) -> list[tuple[int, set[int], float]]:
        """Nodes newly judged lost: (node, its workers, seconds silent); each reported once.
        ``spared`` are not judged this time (the observer has not read all they sent)."""
        out = []
        for node, (_, since_s) in self.counters.items():
            silent = now_s - since_s
            if node not in self.lost and node != self.own_node and node not in spared and silent > self.hang_timeout_s:
                self.lost.add(node)
                out.append((node, self.members.get(node, set()), silent))
        return out
