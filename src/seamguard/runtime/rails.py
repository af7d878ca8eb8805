"""Multi-rail collectives that survive NIC/link flaps: the step commits exactly once.

Why this exists: with one network path, a link flap stalls a synchronous job until the
collective times out and then kills it. Here every rail (NIC) of a host has its own gloo
process group, bound to that rail's interface, all created from one shared store on the
management network under distinct prefixes. A collective is split into a *fixed* number
of chunks (independent of rail health, so the sums are bit-identical whatever rail
carried them) and the chunks run concurrently on the usable rails.

A rail is given up when
  * its carrier drops (a watcher thread polls ``/sys/class/net/<if>/carrier``),
  * a peer announced that it gave the rail up (a store key, polled by the same thread),
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
    chunk_s: dict[int, float] = field(default_factory=dict)  # agreed chunk time per rail, first attempt


@dataclass
class _Attempt:
    """This rank's outcome of running the open chunks once; what it votes."""

    deadline: dict[int, OpDeadline]  # per usable rail: the agreed deadline this attempt uses
    ok: dict[int, bool] = field(default_factory=dict)  # chunk -> finished here
    failed: set[int] = field(default_factory=set)
    bw: dict[int, float] = field(default_factory=dict)
    chunk_s: dict[int, float] = field(default_factory=dict)  # as in Vote.chunk_s
    results: dict[int, torch.Tensor] = field(default_factory=dict)
    settled: set[int] = field(default_factory=set)  # chunks whose op finished or never ran


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
        self._watch_store = own_connection(store)  # the watcher polls while the votes wait
        self._vote_store, self._get_waits = vote_connection(store, settings.vote_timeout_s)
        self._bufs = ChunkBuffers(keep=2 * settings.n_chunks)
        self._stale_votes: list[str] = []  # this rank's spent vote keys; the watcher deletes them
        self.events: list[dict] = []  # rail transitions, for the job's log
        self.causes: list[dict] = []  # why this rank abandoned chunks (carrier, peer flag, timeout)
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

    # ---- the watcher: carrier and peers' announcements ------------------------------
    def _fail_key(self, rail: int, gen: int) -> str:
        return f"{self.prefix}/fail/{rail}/{gen}"

    def _announce(self, rail: int, gen: int, store: dist.Store) -> None:
        with self._lock:
            if self._local_fail[rail] >= gen:
                return
            self._local_fail[rail] = gen
        try:
            store.set(self._fail_key(rail, gen), str(self.rank))
        except Exception:  # noqa: BLE001 - peers still learn it from the vote
            pass

    def _watch(self) -> None:
        while not self._stop.wait(self.s.poll_s):
            now = time.monotonic()
            for r, iface in enumerate(self.s.interfaces):
                up = read_carrier(iface)
                if up != self._carrier[r]:
                    self._carrier[r], self._carrier_since[r] = up, now
                st = self.agreed.rails[r]
                if st.status != LIVE:
                    continue
                gen = st.gen
                if not up:
                    if self._local_fail[r] < gen:
                        self.causes.append({"rail": r, "gen": gen, "cause": "carrier", "t_wall": time.time()})
                    self._announce(r, gen, self._watch_store)
                elif self._local_fail[r] < gen:
                    try:
                        if self._watch_store.check([self._fail_key(r, gen)]):
                            with self._lock:
                                self._local_fail[r] = max(self._local_fail[r], gen)
                    except Exception:  # noqa: BLE001 - store hiccup: the vote still agrees
                        pass
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
        """Sum `flat` over all ranks in place; returns once every rank committed the result.
        ``avoid``: rails to leave out while another is usable (every rank passes the same)."""
        return self._collective("allreduce", flat, step, 0, avoid)

    def broadcast_(self, flat: torch.Tensor, step: int, src: int = 0) -> CollectiveReport:
        return self._collective("broadcast", flat, step, src)

    def _issue(self, kind: str, pg: dist.ProcessGroup, buf: torch.Tensor, src: int) -> dist.Work:
        if kind == "allreduce":
            return pg.allreduce([buf])
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = src, 0
        return pg.broadcast([buf], opts)

    def _collective(self, kind: str, flat: torch.Tensor, step: int, src: int,
                    avoid: frozenset[int] = frozenset()) -> CollectiveReport:
        t_start = time.monotonic()
        chunks = list(torch.tensor_split(flat.view(-1), self.s.n_chunks))
        done = [False] * len(chunks)
        used: set[int] = set()
        failed_all: set[int] = set()
        bytes_per_rail: dict[int, int] = {}
        report = CollectiveReport(step, 0, [], [], 0.0, bytes_per_rail)
        attempt = 0
        while not all(done):
            usable = [r for r in self.agreed.usable() if r not in avoid] or self.agreed.usable()
            if not usable:
                if time.monotonic() - t_start > self.s.max_wait_no_rail_s:
                    raise RailsError(f"step {step}: no usable rail for {self.s.max_wait_no_rail_s}s: "
                                     + "; ".join(f"rail{r} {st.status} {st.reason}"
                                                 for r, st in enumerate(self.agreed.rails)))
                time.sleep(min(0.05, self.s.stable_s))
                self._agree(step, attempt, [False] * len(chunks), [], {}, {})
                attempt += 1
                continue
            todo = [c for c in range(len(chunks)) if not done[c]]
            res = self._run_chunks(kind, chunks, todo, usable, src)
            for c in todo:
                r = usable[c % len(usable)]
                bytes_per_rail[r] = bytes_per_rail.get(r, 0) + chunks[c].numel() * chunks[c].element_size()
            oks = [done[c] or res.ok.get(c, False) for c in range(len(chunks))]
            dec = self._agree(step, attempt, oks, sorted(res.failed), res.bw, res.chunk_s)
            if not report.deadline_s:
                report.deadline_s = {r: d.deadline_s for r, d in res.deadline.items()}
                report.chunk_s = dec.chunk_s
            failed_all |= set(dec.newly_dead) | res.failed
            for c in todo:
                if dec.commit_chunks[c]:
                    chunks[c].copy_(res.results[c])
                    done[c] = True
                    used.add(usable[c % len(usable)])
            self._bufs.give_back([res.results[c] for c in res.settled])
            attempt += 1
        report.attempts, report.rails_used, report.failed_rails = attempt, sorted(used), sorted(failed_all)
        report.elapsed_s = time.monotonic() - t_start
        return report

    def _run_chunks(self, kind: str, chunks: list[torch.Tensor], todo: list[int], usable: list[int],
                    src: int) -> _Attempt:
        """Run the chunks `todo` on the usable rails once; give up a rail on its first failure.

        A chunk's time counts from when the chunks issued before it on the same rail were
        done (a rail carrying two chunks gives each its own time). That time, and how long
        ago a chunk finished on another rail, decide whether it is overdue (`overdue`); the
        longest such time per rail is voted as the rail's chunk time (`Vote.chunk_s`).
        """
        res = _Attempt({r: self.agreed.rails[r].deadline(self.s) for r in usable})
        pending: dict[int, tuple[int, int, dist.Work, float]] = {}  # chunk -> rail, gen, work, issued
        queue: dict[int, list[int]] = {r: [] for r in usable}  # rail -> its unresolved chunks, in issue order
        clock: dict[int, float] = {}  # chunk -> when its own time began (it reached the head of its rail)
        elapsed: dict[int, list[tuple[int, float]]] = {}
        for c in todo:
            r = usable[c % len(usable)]
            pg, gen = self.pgs[r], self.agreed.rails[r].gen
            buf = self._bufs.copy_of(chunks[c])  # private: an abandoned op may still write into it
            res.results[c] = buf
            if pg is None or self._local_fail[r] >= gen:
                res.settled.add(c)
                res.ok[c] = False
                res.failed.add(r)
                continue
            try:
                pending[c] = (r, gen, self._issue(kind, pg, buf, src), time.monotonic())
                queue[r].append(c)
            except Exception:  # noqa: BLE001
                res.ok[c] = False
                res.failed.add(r)

        clock.update({q[0]: pending[q[0]][3] for q in queue.values() if q})

        def took(r: int, dt: float) -> None:
            res.chunk_s[r] = max(res.chunk_s.get(r, 0.0), dt)

        done_t: dict[int, float] = {}  # rail -> when its first chunk of this attempt finished
        while pending:
            now = time.monotonic()
            for c, (r, gen, work, t0) in list(pending.items()):
                if work.is_completed():
                    try:
                        work.wait()
                        res.ok[c] = True
                        res.settled.add(c)
                        done_t.setdefault(r, now)
                        elapsed.setdefault(r, []).append((chunks[c].numel() * 4, now - t0))
                        if c in clock:
                            took(r, now - clock[c])
                    except Exception as e:  # noqa: BLE001 - peer gone / gloo timeout
                        self.causes.append({"rail": r, "gen": gen, "after_s": round(now - t0, 3),
                                            "cause": f"error: {str(e)[:80]}"})
                        res.ok[c] = False
                        res.failed.add(r)
                        self._announce(r, gen, self.store)
                else:
                    why = ""
                    if self._local_fail[r] >= gen:
                        cause = "flagged"
                    elif r in res.failed:
                        cause = "sibling"
                    else:
                        others = [x for q, x in done_t.items() if q != r]
                        why = overdue(now - clock[c], now - min(others) if others else None,
                                      res.deadline[r], self.s) if c in clock else ""
                        if not why:
                            continue
                        cause = "timeout"
                        took(r, now - clock[c])  # it took at least this long
                    self.causes.append({"rail": r, "gen": gen, "after_s": round(now - t0, 3), "cause": cause,
                                        **({"why": why} if why else {})})
                    res.ok[c] = False  # abandoned: the buffer is private, the group gets parked
                    res.failed.add(r)
                    self._announce(r, gen, self.store)
                del pending[c]
                queue[r].remove(c)
                if queue[r] and queue[r][0] not in clock:
                    clock[queue[r][0]] = now  # the chunks ahead of it on this rail are done
            if pending:
                nap(pending[next(iter(pending))][2])
        for r, xs in elapsed.items():
            nbytes = sum(b for b, _ in xs)
            if r not in res.failed and min(b for b, _ in xs) >= self.s.min_gray_bytes:
                res.bw[r] = nbytes / max(max(t for _, t in xs), 1e-9)
        return res

    # ---- agreement ---------------------------------------------------------------------------
    def _agree(self, step: int, attempt: int, ok_chunks: list[bool], failed: list[int],
               bw: dict[int, float], chunk_s: dict[int, float]) -> Decision:
        now = time.monotonic()
        with self._lock:
            built = dict(self._built)  # latest result per rail; decide() matches it to the gen
        up_for = [(now - self._carrier_since[r]) if self._carrier[r] else 0.0
                  for r in range(len(self.s.interfaces))]
        vote = Vote(self.rank, ok_chunks, failed, up_for, built, bw, now, chunk_s)
        # one round counter on every rank: all ranks call _agree equally often (same decisions)
        base = f"{self.prefix}/vote/{self._round}"
        self._round += 1
        self._vote_store.set(f"{base}/{self.rank}", vote.to_json())
        keys = [f"{base}/{r}" for r in range(self.world)]
        if not self._get_waits:
            self._vote_store.wait(keys, datetime.timedelta(seconds=self.s.vote_timeout_s))
        votes = [Vote.from_json(b) for b in self._vote_store.multi_get(keys)]
        # a build this rank finished but whose gen the vote did not settle yet stays pending
        building = [r for r, st in enumerate(self.agreed.rails) if st.status == BUILDING]
        dec = decide(self.agreed, votes, self.s)
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
        if self._round > 2:
            # every rank has read round n-2's votes once it voted in round n-1
            with self._lock:
                self._stale_votes.append(f"{self.prefix}/vote/{self._round - 3}/{self.rank}")
        return dec

    def _probe_figures(self, rail: int, votes: list[Vote]) -> dict[str, float]:
        """The probe bandwidth decide() judged a rebuilt rail by, and the bar it had to clear."""
        gen = self.agreed.rails[rail].gen
        probes = [v.built[rail][2] for v in votes if rail in v.built and v.built[rail][0] == gen]
        if not gen or len(probes) < len(votes):  # the first groups are not probed; a failed build has no figure
            return {}
        return {"probe_mb_s": round(min(probes) / 1e6, 2),
                "bar_mb_s": round(self.s.gray_ratio * self.agreed.bw_ref_bytes_per_s / 1e6, 2)}

    def close(self) -> None:
        self._stop.set()
        self._watcher.join(1.0)
