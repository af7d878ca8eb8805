"""Multi-rail collectives that survive NIC/link flaps: the step commits exactly once.

Why this exists: with one network path, a link flap stalls a synchronous job until the
collective times out and then kills it. Here every rail (NIC) of a host has its own gloo
process group, bound to that rail's interface, all created from one shared store on the
management network under distinct prefixes. A collective is split into a *fixed* number
of chunks (independent of rail health, so the sums are bit-identical whatever rail
carried them) and the chunks run concurrently on the usable rails.

A rail is given up when
  * its carrier drops (a watcher thread polls ``/sys/class/net/<if>/carrier``),
  * a peer announced that it gave the rail up (`announce`: numbered store keys, each
    claimed by a compare-and-set; a follower thread waits inside the store for the next
    number, so a healthy job sends the store nothing for them),
  * a chunk on it misses its deadline (silent failures: a dead switch). The deadline counts
    once a chunk on another rail has finished (until then a late chunk most likely waits
    for a slow peer, and waits up to the ceiling) and adapts to the rail's recent chunk
    times (`overdue`, `op_deadline`: a multiple of the slowest recent one, clamped to a
    floor and a ceiling), so a loaded host does not fail healthy rails, and a rail that
    never finishes is given up within the ceiling; or
  * it is gray: its measured bandwidth is far below its peers' for two steps in a row, and
    its chunks took well longer than theirs (more than a loaded host's scheduling noise).
The in-flight chunk is abandoned (its buffer is a private copy; gloo cannot cancel an op,
so the broken group is parked until its own timeout ends the op) and re-run on a healthy
rail. After each attempt every rank votes over the store (keyed by step and attempt);
all ranks apply the same pure `decide()` (runtime/rail_decide.py) to the same votes, so
they agree on which chunks succeeded, which rails are out, and when a rail is rebuilt (a
new group under a new generation prefix, then a bandwidth probe) and taken back into use. The chunk times that
set the deadlines travel in the same votes, so every rank applies the same deadline.

The votes travel over a connection of their own too (`vote_connection`): on a TCPStore it
carries the vote timeout, so one ``multi_get`` (which waits for the keys itself) reads every
rank's vote: two round trips to rank 0's store per attempt instead of three. The chunks'
private buffers are reused from one collective to the next unless an op on one was
abandoned, and the training thread waits for a chunk inside gloo's own ``wait(timeout)``
(no interpreter lock held, woken by its completion) instead of napping 1 ms at a time.

One synchronisation a step in the steady state: an all-reduce whose chunks all finished on
this rank at the first attempt returns at once, and its vote is read on a helper thread
while the caller computes (`_return_early`, `_settle`). A finished chunk already holds every
rank's contribution, so the sum cannot change; what a peer may still need is this rank's
part in a re-run of a chunk it could not finish, which the helper runs from a kept copy of
the input. The next collective waits for the helper first, so every rank still votes in the
same rounds and applies the same decisions in the same order; the rare re-run shows in the
next report (its attempts and failed rails). The ring's wait for the slowest rank is then
the step's one wait: the vote's second barrier in rank 0's store overlaps the next compute.

Every group is built over a store connection of its own (`build_gloo_group`): building
blocks in the store until every peer has published its address, and a TCPStore client
serves one request at a time, so builds sharing the job's connection would wait on each
other and on the votes (a failed start-up build, a probe timed across a vote).

The groups, connections, buffers and the carrier file are runtime/rail_transport.py's.
Called by training code (see `seamguard/testbed/rails_job.py`) through `RailGroup.allreduce_`
and `RailGroup.broadcast_`; uses only the public torch.distributed gloo API.
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

# the pure core (settings, deadlines, votes, decide) lives in rail_decide.py; its names
# stay importable from here
from seamguard.runtime.rail_decide import (  # noqa: F401
    BUILDING,
    DEAD,
    LIVE,
    Agreed,
    Decision,
    OpDeadline,
    RailSettings,
    RailsError,
    RailState,
    Vote,
    decide,
    op_deadline,
    overdue,
)
from seamguard.runtime.rail_chunks import Attempt, ChunkRunner
# the transport it stands on (groups, connections, buffers, carrier) lives in
# rail_transport.py; the names tests and callers used stay importable from here
from seamguard.runtime.rail_transport import (  # noqa: F401
    ChunkBuffers,
    build_gloo_group,
    nap,
    own_connection,
    probe_bandwidth,
    read_carrier,
    vote_connection,
)

_Buffers = ChunkBuffers
# how long the follower waits inside the store for the next announcement before it waits
# again; `close` wakes it sooner (each expiry logs a warning in torch's TCPStore client)
_FOLLOW_WAIT = datetime.timedelta(hours=1)
_FOLLOW_RETRY_S = 0.5  # after a failed wait: the votes carry every give-up meanwhile


# ---- the shell: process groups, watcher, chunk execution, votes ---------------------------

@dataclass
class CollectiveReport:
    """What one collective cost; the job logs it per step."""

    step: int
    attempts: int
    rails_used: list[int]
    failed_rails: list[int]
    elapsed_s: float
    bytes_per_rail: dict[int, int] = field(default_factory=dict)
    deadline_s: dict[int, float] = field(default_factory=dict)  # per rail, first attempt
    # agreed chunk time per rail, first attempt; this rank's own when the collective returned
    # before its vote (`RailGroup.allreduce_`)
    chunk_s: dict[int, float] = field(default_factory=dict)


@dataclass
class _Open:
    """A collective until every rank committed every chunk: what its next attempt needs."""

    kind: str
    step: int
    src: int
    avoid: frozenset[int]
    chunks: list[torch.Tensor]  # the caller's buffer; kept inputs once it returned early
    wants_sums: bool = True  # False once returned early: the caller holds the sums already
    t_start: float = field(default_factory=time.monotonic)
    attempt: int = 0
    done: list[bool] = field(default_factory=list)
    used: set[int] = field(default_factory=set)
    failed_all: set[int] = field(default_factory=set)
    report: CollectiveReport = field(init=False)

    def __post_init__(self) -> None:
        self.done = self.done or [False] * len(self.chunks)
        self.report = CollectiveReport(self.step, 0, [], [], 0.0)


class RailGroup:
    """One process group per rail, chunked collectives with failover and agreement."""

    def __init__(self, store: dist.Store, rank: int, world: int, settings: RailSettings,
                 prefix: str = "rails") -> None:
        self.store, self.rank, self.world, self.s, self.prefix = store, rank, world, settings, prefix
        n = len(settings.interfaces)
        self.agreed = Agreed([RailState() for _ in range(n)])
        self.pgs: list[dist.ProcessGroup | None] = [None] * n
        self._graveyard: list[object] = []  # broken groups keep their threads until gloo times out
        self._lock = threading.Lock()
        self._local_fail = [-1] * n  # gen of each rail this rank has seen fail
        self._carrier = [read_carrier(i) for i in settings.interfaces]
        now = time.monotonic()
        self._carrier_since = [now] * n
        self._built: dict[int, tuple[int, bool, float]] = {}
        self._builders: dict[int, threading.Thread] = {}
        self._round = 0
        self._stop = threading.Event()
        self._watch_store = own_connection(store)  # the watcher's writes while the votes wait
        self._follow_store = own_connection(store)  # blocked in the store until a peer announces
        self._announced = 0  # how many announcements (numbered from 1) the follower has read
        self._vote_store, self._get_waits = vote_connection(store, settings.vote_timeout_s)
        self._bufs = ChunkBuffers(keep=2 * settings.n_chunks)
        self._runner = ChunkRunner(settings, self._bufs, self._rail_now,
                                   lambda r, gen: self._local_fail[r] >= gen,
                                   lambda r, gen: self._announce(r, gen, self.store))
        self._stale_votes: list[str] = []  # this rank's spent vote keys; the watcher deletes them
        # an early-returned collective's vote, settled by one long-lived helper thread (`_settle`):
        # handing it over wakes the thread, where starting one a step waited for it to be scheduled
        self._settle_jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._settle_done = threading.Event()
        self._settle_done.set()
        self._settler: threading.Thread | None = None
        self._settle_error: Exception | None = None
        self._late: tuple[int, set[int]] = (0, set())  # its extra attempts and failed rails
        self.events: list[dict] = []  # rail transitions, for the job's log
        self.causes: list[dict] = self._runner.causes  # why this rank abandoned chunks (carrier, peer flag, timeout)
        # Processes start with seconds of skew; gloo's connect timeout is short by design,
        # so meet on the store first.
        store.set(f"{prefix}/arrived/{rank}", "1")
        store.wait([f"{prefix}/arrived/{r}" for r in range(world)],
                   datetime.timedelta(seconds=settings.start_timeout_s))
        for r in range(n):
            self._start_build(r, 0, probe=False)
        for t in list(self._builders.values()):
            t.join(self.s.gloo_timeout_s + 5.0)
        self._watcher = threading.Thread(target=self._watch, name="rail-watcher", daemon=True)
        self._watcher.start()
        self._follower = threading.Thread(target=self._follow, name="rail-follower", daemon=True)
        self._follower.start()
        # agree on the starting set of rails
        self._agree(-1, 0, [True] * self.s.n_chunks, [], {}, {})

    # ---- groups ----------------------------------------------------------------------
    def _make_pg(self, rail: int, gen: int) -> dist.ProcessGroup:
        return build_gloo_group(self.store, f"{self.prefix}/pg/{rail}/{gen}/", self.rank, self.world,
                                self.s.interfaces[rail], self.s.gloo_timeout_s)

    def _start_build(self, rail: int, gen: int, probe: bool) -> None:
        def run() -> None:
            result = (gen, False, 0.0)
            try:
                pg = self._make_pg(rail, gen)
                bw = probe_bandwidth(pg, self.s.probe_bytes, self.s.probe_rounds) if probe else 0.0
                with self._lock:
                    self._park(rail)
                    self.pgs[rail] = pg
                result = (gen, True, bw)
            except Exception:  # noqa: BLE001 - a failed build is an outcome, voted on
                pass
            with self._lock:
                self._built[rail] = result

        t = threading.Thread(target=run, name=f"rail{rail}-build{gen}", daemon=True)
        self._builders[rail] = t
        t.start()

    def _park(self, rail: int) -> None:
        pg = self.pgs[rail]
        if pg is not None:
            self._graveyard.append(pg)
            self.pgs[rail] = None

    # ---- the watcher: carrier; the follower: peers' announcements ------------------------
    def _announce(self, rail: int, gen: int, store: dist.Store) -> None:
        with self._lock:
            if self._local_fail[rail] >= gen:
                return
            self._local_fail[rail] = gen
        try:
            self._post_announcement(f"{rail} {gen} {self.rank}", store)
        except Exception:  # noqa: BLE001 - peers still learn it from the vote
            pass

    def _post_announcement(self, text: str, store: dist.Store) -> None:
        """Claim the next free announcement number for ``text`` (compare-and-set on an absent
        key: two ranks announcing at once take two numbers, and no number is ever left empty)."""
        with self._lock:
            n = self._announced + 1
        while True:
            if store.compare_set(self._announcement_key(n), "", text) == text.encode():
                return
            n += 1

    def _announcement_key(self, n: int) -> str:
        return f"{self.prefix}/announce/{n}"

    def _follow(self) -> None:
        """Read peers' announcements in number order, each by a wait inside the store (no
        polling); ends once the group is closed (`close` posts one to wake it)."""
        while not self._stop.is_set():
            key = self._announcement_key(self._announced + 1)
            try:
                self._follow_store.wait([key], _FOLLOW_WAIT)
                words = self._follow_store.get(key).decode().split()
            except Exception:  # noqa: BLE001 - the wait's timeout, or the store is gone: the vote still agrees
                self._stop.wait(_FOLLOW_RETRY_S)  # a store that is gone fails every wait at once
                continue
            try:  # "<rail> <gen> <rank>"; "closed <rank>" only wakes, and what cannot be read is skipped
                rail, gen = (int(w) for w in words[:2])
            except ValueError:
                rail, gen = -1, -1
            with self._lock:
                self._announced += 1
                if 0 <= rail < len(self._local_fail):
                    self._local_fail[rail] = max(self._local_fail[rail], gen)

    def _watch(self) -> None:
        while not self._stop.wait(self.s.poll_s):
            now = time.monotonic()
            for r, iface in enumerate(self.s.interfaces):
                up = read_carrier(iface)
                if up != self._carrier[r]:
                    self._carrier[r], self._carrier_since[r] = up, now
                st = self.agreed.rails[r]
                if not up and st.status == LIVE:
                    if self._local_fail[r] < st.gen:
                        self.causes.append({"rail": r, "gen": st.gen, "cause": "carrier", "t_wall": time.time()})
                    self._announce(r, st.gen, self._watch_store)
            self._delete_stale_votes()

    def _delete_stale_votes(self) -> None:
        """Delete spent vote keys over the watcher's connection, off the collective's path
        (one store round trip less per step)."""
        with self._lock:
            stale, self._stale_votes = self._stale_votes, []
        for key in stale:
            try:
                self._watch_store.delete_key(key)
            except Exception:  # noqa: BLE001 - a stale key costs only memory
                pass

    # ---- collectives -----------------------------------------------------------------------
    def allreduce_(self, flat: torch.Tensor, step: int, avoid: frozenset[int] = frozenset()) -> CollectiveReport:
        """Sum `flat` over all ranks in place. ``avoid``: rails to leave out while another is
        usable (every rank passes the same).

        When every chunk finished on this rank at the first attempt (the steady state), it
        returns before the ranks' vote: the vote, and a re-run of any chunk a peer could not
        finish (this rank joins in from a kept copy of its input), complete on a helper
        thread while the caller computes, and the next collective (or `close`) waits for
        them first. The sum returned never changes: a finished chunk holds every rank's
        contribution, and a re-run of it gives the same bits. Otherwise it returns once every
        rank committed every chunk, as `broadcast_` always does."""
        return self._collective("allreduce", flat, step, 0, avoid, early=True)

    def broadcast_(self, flat: torch.Tensor, step: int, src: int = 0) -> CollectiveReport:
        return self._collective("broadcast", flat, step, src)

    def _collective(self, kind: str, flat: torch.Tensor, step: int, src: int,
                    avoid: frozenset[int] = frozenset(), early: bool = False) -> CollectiveReport:
        late_attempts, late_failed = self._join_settle(step)
        op = _Open(kind, step, src, avoid, list(torch.tensor_split(flat.view(-1), self.s.n_chunks)))
        if early:
            res = self._attempt(op)
            if res is not None and not res.failed and all(res.ok.get(c, False) for c in range(len(op.chunks))):
                return self._return_early(op, res, late_attempts, late_failed)
            if res is not None:
                self._vote_and_commit(op, res)
        self._complete(op)
        rep = op.report
        rep.attempts = op.attempt + late_attempts
        rep.rails_used, rep.failed_rails = sorted(op.used), sorted(op.failed_all | late_failed)
        rep.elapsed_s = time.monotonic() - op.t_start
        return rep

    def _complete(self, op: _Open) -> None:
        """Attempt and vote until every rank committed every chunk of ``op``."""
        while not all(op.done):
            res = self._attempt(op)
            if res is not None:
                self._vote_and_commit(op, res)

    def _attempt(self, op: _Open) -> Attempt | None:
        """Run ``op``'s open chunks once on the usable rails; None when no rail is usable
        (after a short wait and an empty vote, so that a rebuild can be agreed)."""
        usable = [r for r in self.agreed.usable() if r not in op.avoid] or self.agreed.usable()
        if not usable:
            if time.monotonic() - op.t_start > self.s.max_wait_no_rail_s:
                raise RailsError(f"step {op.step}: no usable rail for {self.s.max_wait_no_rail_s}s: "
                                 + "; ".join(f"rail{r} {st.status} {st.reason}"
                                             for r, st in enumerate(self.agreed.rails)))
            time.sleep(min(0.05, self.s.stable_s))
            self._agree(op.step, op.attempt, [False] * len(op.chunks), [], {}, {})
            op.attempt += 1
            return None
        todo = [c for c in range(len(op.chunks)) if not op.done[c]]
        res = self._run_chunks(op.kind, op.chunks, todo, usable, op.src)
        res.todo, res.usable = todo, usable
        for c in todo:
            r = usable[c % len(usable)]
            op.report.bytes_per_rail[r] = (op.report.bytes_per_rail.get(r, 0)
                                           + op.chunks[c].numel() * op.chunks[c].element_size())
        if not op.report.deadline_s:
            op.report.deadline_s = {r: d.deadline_s for r, d in res.deadline.items()}
        return res

    def _vote_and_commit(self, op: _Open, res: Attempt, keys: list[str] | None = None) -> None:
        """Vote on ``res`` (or read the vote already posted under ``keys``) and commit the
        chunks every rank finished."""
        oks = [op.done[c] or res.ok.get(c, False) for c in range(len(op.chunks))]
        if keys is None:
            keys = self._post_vote(oks, sorted(res.failed), res.bw, res.chunk_s)
        dec = self._read_votes(op.step, op.attempt, keys)
        if not op.report.chunk_s:
            op.report.chunk_s = dec.chunk_s
        op.failed_all |= set(dec.newly_dead) | res.failed
        for c in res.todo:
            if dec.commit_chunks[c]:
                if op.wants_sums:
                    op.chunks[c].copy_(res.results[c])
                op.done[c] = True
                op.used.add(res.usable[c % len(res.usable)])
        self._bufs.give_back([res.results[c] for c in res.settled])
        op.attempt += 1

    # ---- the early return and the settle behind it -------------------------------------------
    def _return_early(self, op: _Open, res: Attempt, late_attempts: int, late_failed: set[int]) -> CollectiveReport:
        """Every chunk finished here: hand the caller the sum, send the vote, and leave reading
        and settling it to the helper thread."""
        inputs = [self._bufs.copy_of(c) for c in op.chunks]  # a chunk a peer missed is re-run from these
        for c, chunk in enumerate(op.chunks):
            chunk.copy_(res.results[c])
        n = len(op.chunks)
        # sent on this thread: rounds stay in call order on every rank, and no peer's read waits
        # for this rank's helper to be scheduled
        keys = self._post_vote([True] * n, [], res.bw, res.chunk_s)
        rep = op.report
        rep.attempts, rep.failed_rails = 1 + late_attempts, sorted(late_failed)
        rep.rails_used = sorted({res.usable[c % len(res.usable)] for c in res.todo})
        rep.chunk_s = dict(res.chunk_s)  # this rank's own; the agreed ones come with the vote
        rep.elapsed_s = time.monotonic() - op.t_start
        op.chunks, op.wants_sums = inputs, False
        if self._settler is None:
            self._settler = threading.Thread(target=self._settle_loop, name="rail-settle", daemon=True)
            self._settler.start()
        self._settle_done.clear()
        self._settle_jobs.put((op, res, keys))
        return rep

    def _settle_loop(self) -> None:
        while (job := self._settle_jobs.get()) is not None:
            self._settle(*job)
            self._settle_done.set()

    def _settle(self, op: _Open, res: Attempt, keys: list[str]) -> None:
        """Read the vote of an early-returned collective; re-run with the peers any chunk one
        of them could not finish (the result is already the caller's: the re-run only serves
        the peers). Its extra attempts and failed rails go into the next report."""
        try:
            self._vote_and_commit(op, res, keys)
            extra = op.attempt
            self._complete(op)
            self._late = (op.attempt - extra, op.failed_all)
        except Exception as exc:  # noqa: BLE001 - raised by the next collective (or close)
            self._settle_error = exc
        finally:
            self._bufs.give_back(op.chunks)

    def _join_settle(self, step: int) -> tuple[int, set[int]]:
        """Wait (bounded) for the last early-returned collective to settle; its extra
        attempts and failed rails. Raises RailsError if it failed or did not end in time."""
        bound_s = 2 * (self.s.vote_timeout_s + self.s.max_wait_no_rail_s)
        if not self._settle_done.wait(bound_s):
            raise RailsError(f"step {step}: the previous collective's vote did not settle within {bound_s:g} s")
        err, self._settle_error = self._settle_error, None
        if err is not None:
            raise RailsError(f"step {step}: the previous collective could not be completed: {err}") from err
        late, self._late = self._late, (0, set())
        return late

    def _run_chunks(self, kind: str, chunks: list[torch.Tensor], todo: list[int], usable: list[int],
                    src: int) -> Attempt:
        return self._runner.run(kind, chunks, todo, usable, src)

    def _rail_now(self, rail: int) -> tuple[dist.ProcessGroup | None, int, OpDeadline]:
        """The rail's group, its agreed generation and the deadline its chunks get now."""
        st = self.agreed.rails[rail]
        return self.pgs[rail], st.gen, st.deadline(self.s)

    # ---- agreement ---------------------------------------------------------------------------
    def _agree(self, step: int, attempt: int, ok_chunks: list[bool], failed: list[int],
               bw: dict[int, float], chunk_s: dict[int, float]) -> Decision:
        return self._read_votes(step, attempt, self._post_vote(ok_chunks, failed, bw, chunk_s))

    def _post_vote(self, ok_chunks: list[bool], failed: list[int], bw: dict[int, float],
                   chunk_s: dict[int, float]) -> list[str]:
        """Post this rank's vote of the next round; the round's keys, for `_read_votes`."""
        now = time.monotonic()
        with self._lock:
            built = dict(self._built)  # latest result per rail; decide() matches it to the gen
        up_for = [(now - self._carrier_since[r]) if self._carrier[r] else 0.0
                  for r in range(len(self.s.interfaces))]
        vote = Vote(self.rank, ok_chunks, failed, up_for, built, bw, now, chunk_s)
        # one round counter on every rank: all ranks vote equally often (same decisions)
        base = f"{self.prefix}/vote/{self._round}"
        self._round += 1
        if self._round > 2:
            # this rank read round n-1 before voting in round n, so every rank voted in round
            # n-1, which each did only after reading round n-2
            with self._lock:
                self._stale_votes.append(f"{self.prefix}/vote/{self._round - 3}/{self.rank}")
        self._vote_store.set(f"{base}/{self.rank}", vote.to_json())
        return [f"{base}/{r}" for r in range(self.world)]

    def _read_votes(self, step: int, attempt: int, keys: list[str]) -> Decision:
        """Wait (bounded) for every rank's vote under ``keys`` and apply the same `decide`."""
        if not self._get_waits:
            self._vote_store.wait(keys, datetime.timedelta(seconds=self.s.vote_timeout_s))
        votes = [Vote.from_json(b) for b in self._vote_store.multi_get(keys)]
        # a build this rank finished but whose gen the vote did not settle yet stays pending
        building = [r for r, st in enumerate(self.agreed.rails) if st.status == BUILDING]
        dec = decide(self.agreed, votes, self.s)
        self._note_transitions(step, attempt, dec, building, votes)
        return dec

    def _note_transitions(self, step: int, attempt: int, dec: Decision, building: list[int],
                          votes: list[Vote]) -> None:
        """Act on a decision: park the rails given up, start the agreed rebuilds; log each."""
        for r in building:
            if self.agreed.rails[r].status == DEAD:  # the rebuild or its probe kept the rail out
                self.events.append({"step": step, "attempt": attempt, "rail": r, "event": "refused",
                                    "gen": self.agreed.rails[r].gen, "reason": self.agreed.rails[r].reason,
                                    **self._probe_figures(r, votes), "t_wall": time.time()})
        for r in dec.newly_dead:
            with self._lock:
                self._park(r)
            self.events.append({"step": step, "attempt": attempt, "rail": r, "event": "out",
                                "reason": self.agreed.rails[r].reason, "t_wall": time.time()})
        for r in dec.start_builds:
            self.events.append({"step": step, "attempt": attempt, "rail": r, "event": "probe",
                                "gen": self.agreed.rails[r].gen, "t_wall": time.time()})
            self._start_build(r, self.agreed.rails[r].gen, probe=True)
        for r in dec.newly_live:
            self.events.append({"step": step, "attempt": attempt, "rail": r, "event": "in",
                                "gen": self.agreed.rails[r].gen, **self._probe_figures(r, votes),
                                "t_wall": time.time()})

    def _probe_figures(self, rail: int, votes: list[Vote]) -> dict[str, float]:
        """The probe bandwidth decide() judged a rebuilt rail by, and the bar it had to clear."""
        gen = self.agreed.rails[rail].gen
        probes = [v.built[rail][2] for v in votes if rail in v.built and v.built[rail][0] == gen]
        if not gen or len(probes) < len(votes):  # the first groups are not probed; a failed build has no figure
            return {}
        return {"probe_mb_s": round(min(probes) / 1e6, 2),
                "bar_mb_s": round(self.s.gray_ratio * self.agreed.bw_ref_bytes_per_s / 1e6, 2)}

    def close(self, settle: bool = True) -> None:
        """Stop the watcher. First (``settle``) wait for the last collective's vote and any
        re-run a peer needs from this rank (bounded, raises as the next collective would); a
        group given up for a new generation passes False: its peers may be gone."""
        try:
            if settle:
                self._join_settle(-1)
        finally:
            self._stop.set()
            self._settle_jobs.put(None)  # the helper ends once it is idle
            self._watcher.join(1.0)
            try:  # wake the follower; peers skip a "closed" announcement
                self._post_announcement(f"closed {self.rank}", self._watch_store)
            except Exception:  # noqa: BLE001 - the store is gone: so is the follower's wait
                pass
