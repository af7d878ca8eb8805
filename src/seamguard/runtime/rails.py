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
  * a chunk on it misses the bounded per-op deadline (silent failures: a dead switch), or
  * it is gray: its measured bandwidth is far below its peers' for two steps in a row.
The in-flight chunk is abandoned (its buffer is a private copy; gloo cannot cancel an op,
so the broken group is parked until its own timeout ends the op) and re-run on a healthy
rail. After each attempt every rank votes over the store (keyed by step and attempt);
all ranks apply the same pure `decide()` to the same votes, so they agree on which chunks
succeeded, which rails are out, and when a rail is rebuilt (a new group under a new
generation prefix, then a bandwidth probe) and taken back into use.

Called by training code (see `seamguard.runtime.rails_job`) through `RailGroup.allreduce_`
and `RailGroup.broadcast_`; uses only the public torch.distributed gloo API.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


class RailsError(RuntimeError):
    """No rail could carry the collective within the bounds of the settings."""


@dataclass(frozen=True)
class RailSettings:
    interfaces: tuple[str, ...]
    """Rail interface names inside the host, index = rail id (e.g. ("rail0", "rail1"))."""
    chunks: int = 0
    """Fixed number of chunks per collective; 0 = one per rail. Never depends on health."""
    op_timeout_s: float = 0.5
    """A chunk not finished on a rail by then counts as that rail failing (silent faults)."""
    gloo_timeout_s: float = 2.0
    """gloo's own per-op and connect timeout; bounds abandoned ops and rebuild attempts."""
    poll_s: float = 0.02
    """Carrier and peer-announcement poll interval of the watcher thread."""
    stable_s: float = 0.3
    """Carrier must have been up this long on every host before a rail is rebuilt."""
    probe_interval_s: float = 1.0
    """Pause after a failed rebuild/probe before the next one."""
    gray_ratio: float = 0.25
    """A rail whose bandwidth is below this fraction of the best rail's is gray."""
    gray_steps: int = 2
    """Consecutive slow measurements before a rail is declared gray."""
    min_gray_bytes: int = 256 * 1024
    """Chunks smaller than this are latency-bound and not used to judge bandwidth."""
    probe_bytes: int = 1 << 20
    """Size of the allreduce that probes a rebuilt rail's bandwidth."""
    start_timeout_s: float = 120.0
    """Bound on waiting for every rank to arrive before the first groups are built."""
    vote_timeout_s: float = 15.0
    """Bound on waiting for every rank's vote (a rank that never votes is a dead process)."""
    max_wait_no_rail_s: float = 60.0
    """How long a collective waits for any rail to come back before raising RailsError."""

    def __post_init__(self) -> None:
        if not self.interfaces:
            raise ValueError("RailSettings.interfaces: at least one rail interface is needed")
        if self.op_timeout_s <= 0 or self.gloo_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        if not 0 < self.gray_ratio < 1:
            raise ValueError(f"gray_ratio must be in (0, 1), got {self.gray_ratio}")

    @property
    def n_chunks(self) -> int:
        return self.chunks or len(self.interfaces)


# ---- the agreed rail state and the pure decision over votes -------------------------------

LIVE, DEAD, BUILDING = "live", "dead", "building"


@dataclass
class RailState:
    """What every rank agrees about one rail (identical on all ranks after each vote)."""

    status: str = BUILDING
    gen: int = 0
    slow_count: int = 0
    last_try_t_s: float = -1e9  # rank 0's monotonic clock when the last build ended badly
    reason: str = ""


@dataclass
class Agreed:
    rails: list[RailState]
    bw_ref_bytes_per_s: float = 0.0  # best recent rail bandwidth: the yardstick for probes

    def usable(self) -> list[int]:
        return [r for r, s in enumerate(self.rails) if s.status == LIVE]


@dataclass
class Vote:
    rank: int
    ok_chunks: list[bool]
    failed_rails: list[int]  # rails this rank saw fail this attempt (carrier, timeout, error, peer flag)
    carrier_up_for_s: list[float]  # per rail; 0 when the carrier is down
    built: dict[int, tuple[int, bool, float]]  # rail -> (gen, ok, probe bytes/s) of finished builds
    bw_bytes_per_s: dict[int, float]  # measured per rail this attempt (big enough chunks only)
    t_s: float  # sender's monotonic clock (only rank 0's is used for decisions)

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @staticmethod
    def from_json(s: str | bytes) -> "Vote":
        d = json.loads(s)
        d["built"] = {int(k): tuple(v) for k, v in d["built"].items()}
        d["bw_bytes_per_s"] = {int(k): v for k, v in d["bw_bytes_per_s"].items()}
        return Vote(**d)


@dataclass
class Decision:
    commit_chunks: list[bool]  # chunk succeeded on every rank
    newly_dead: list[int]
    start_builds: list[int]  # rails every rank starts rebuilding now (at the new gen)
    newly_live: list[int]


def decide(agreed: Agreed, votes: list[Vote], s: RailSettings) -> Decision:
    """Pure: the same votes give the same decision on every rank; mutates `agreed` in place."""
    n = len(votes[0].ok_chunks)
    commit = [all(v.ok_chunks[c] for v in votes) for c in range(n)]
    t0 = next(v.t_s for v in votes if v.rank == 0)
    dead, builds, live = [], [], []
    failed = {r for v in votes for r in v.failed_rails}
    # bandwidth: the slowest rank's view of a rail is what a ring collective gets
    bw = {}
    for r in range(len(agreed.rails)):
        vals = [v.bw_bytes_per_s.get(r) for v in votes]
        if all(x is not None for x in vals):
            bw[r] = min(vals)  # type: ignore[type-var]
    if bw:
        best = max(bw.values())
        agreed.bw_ref_bytes_per_s = best if agreed.bw_ref_bytes_per_s == 0 else max(
            best, 0.8 * agreed.bw_ref_bytes_per_s)
        if len(bw) > 1:
            for r, b in bw.items():
                st = agreed.rails[r]
                st.slow_count = st.slow_count + 1 if b < s.gray_ratio * best else 0
                if st.slow_count >= s.gray_steps and r not in failed:
                    failed.add(r)
                    st.reason = f"gray: {b / 1e6:.1f} MB/s vs best {best / 1e6:.1f} MB/s"
    for r, st in enumerate(agreed.rails):
        if st.status == LIVE and r in failed:
            st.status, st.slow_count, st.last_try_t_s = DEAD, 0, t0
            st.reason = st.reason if st.reason.startswith("gray") else "failed"
            dead.append(r)
        elif st.status == BUILDING:
            res = [v.built.get(r) for v in votes]
            if any(x is not None and x[0] == st.gen and not x[1] for x in res):
                st.status, st.last_try_t_s, st.reason = DEAD, t0, "rebuild failed"
            elif all(x is not None and x[0] == st.gen for x in res):
                probe_bw = min(x[2] for x in res)  # type: ignore[index]
                if agreed.bw_ref_bytes_per_s and probe_bw < s.gray_ratio * agreed.bw_ref_bytes_per_s:
                    st.status, st.last_try_t_s = DEAD, t0
                    st.reason = f"probe gray: {probe_bw / 1e6:.1f} MB/s"
                else:
                    st.status, st.slow_count, st.reason = LIVE, 0, ""
                    live.append(r)
        elif st.status == DEAD:
            up_for = min(v.carrier_up_for_s[r] for v in votes)
            if up_for >= s.stable_s and t0 - st.last_try_t_s >= s.probe_interval_s:
                st.status, st.gen = BUILDING, st.gen + 1
                builds.append(r)
    return Decision(commit, dead, builds, live)


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


def _read_carrier(iface: str) -> bool:
    try:
        with open(f"/sys/class/net/{iface}/carrier") as f:
            return f.read().strip() == "1"
    except OSError:  # admin-down interfaces refuse the read
        return False


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
        self._carrier = [_read_carrier(i) for i in settings.interfaces]
        now = time.monotonic()
        self._carrier_since = [now] * n
        self._built: dict[int, tuple[int, bool, float]] = {}
        self._builders: dict[int, threading.Thread] = {}
        self._round = 0
        self._stop = threading.Event()
        self._watch_store = store.clone() if hasattr(store, "clone") else store
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
        self._agree(-1, 0, [True] * self.s.n_chunks, [], {})

    # ---- groups ----------------------------------------------------------------------
    def _make_pg(self, rail: int, gen: int) -> dist.ProcessGroup:
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [dist.ProcessGroupGloo.create_device(interface=self.s.interfaces[rail])]
        opts._timeout = datetime.timedelta(seconds=self.s.gloo_timeout_s)
        return dist.ProcessGroupGloo(dist.PrefixStore(f"{self.prefix}/pg/{rail}/{gen}/", self.store),
                                     self.rank, self.world, opts)

    def _start_build(self, rail: int, gen: int, probe: bool) -> None:
        def run() -> None:
            result = (gen, False, 0.0)
            try:
                pg = self._make_pg(rail, gen)
                bw = 0.0
                if probe:
                    x = torch.ones(self.s.probe_bytes // 4)
                    t = time.perf_counter()
                    pg.allreduce([x]).wait()
                    bw = self.s.probe_bytes / max(time.perf_counter() - t, 1e-9)
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
                up = _read_carrier(iface)
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

    # ---- collectives -----------------------------------------------------------------------
    def allreduce_(self, flat: torch.Tensor, step: int) -> CollectiveReport:
        """Sum `flat` over all ranks in place; returns once every rank committed the result."""
        return self._collective("allreduce", flat, step, 0)

    def broadcast_(self, flat: torch.Tensor, step: int, src: int = 0) -> CollectiveReport:
        return self._collective("broadcast", flat, step, src)

    def _issue(self, kind: str, pg: dist.ProcessGroup, buf: torch.Tensor, src: int) -> dist.Work:
        if kind == "allreduce":
            return pg.allreduce([buf])
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = src, 0
        return pg.broadcast([buf], opts)

    def _collective(self, kind: str, flat: torch.Tensor, step: int, src: int) -> CollectiveReport:
        t_start = time.monotonic()
        chunks = list(torch.tensor_split(flat.view(-1), self.s.n_chunks))
        done = [False] * len(chunks)
        used: set[int] = set()
        failed_all: set[int] = set()
        bytes_per_rail: dict[int, int] = {}
        attempt = 0
        while not all(done):
            usable = self.agreed.usable()
            if not usable:
                if time.monotonic() - t_start > self.s.max_wait_no_rail_s:
                    raise RailsError(f"step {step}: no usable rail for {self.s.max_wait_no_rail_s}s: "
                                     + "; ".join(f"rail{r} {st.status} {st.reason}"
                                                 for r, st in enumerate(self.agreed.rails)))
                time.sleep(min(0.05, self.s.stable_s))
                self._agree(step, attempt, [False] * len(chunks), [], {})
                attempt += 1
                continue
            todo = [c for c in range(len(chunks)) if not done[c]]
            ok, failed, bw, results = self._run_chunks(kind, chunks, todo, usable, src)
            for c in todo:
                r = usable[c % len(usable)]
                bytes_per_rail[r] = bytes_per_rail.get(r, 0) + chunks[c].numel() * chunks[c].element_size()
            oks = [done[c] or ok.get(c, False) for c in range(len(chunks))]
            dec = self._agree(step, attempt, oks, sorted(failed), bw)
            failed_all |= set(dec.newly_dead) | failed
            for c in todo:
                if dec.commit_chunks[c]:
                    chunks[c].copy_(results[c])
                    done[c] = True
                    used.add(usable[c % len(usable)])
            attempt += 1
        return CollectiveReport(step, attempt, sorted(used), sorted(failed_all),
                                time.monotonic() - t_start, bytes_per_rail)

    def _run_chunks(self, kind: str, chunks: list[torch.Tensor], todo: list[int], usable: list[int],
                    src: int) -> tuple[dict[int, bool], set[int], dict[int, float], dict[int, torch.Tensor]]:
        pending: dict[int, tuple[int, int, dist.Work, float]] = {}
        results: dict[int, torch.Tensor] = {}
        ok: dict[int, bool] = {}
        failed: set[int] = set()
        elapsed: dict[int, list[tuple[int, float]]] = {}
        for c in todo:
            r = usable[c % len(usable)]
            pg, gen = self.pgs[r], self.agreed.rails[r].gen
            buf = chunks[c].clone()  # private: an abandoned op may still write into it
            results[c] = buf
            if pg is None or self._local_fail[r] >= gen:
                ok[c] = False
                failed.add(r)
                continue
            try:
                pending[c] = (r, gen, self._issue(kind, pg, buf, src), time.monotonic())
            except Exception:  # noqa: BLE001
                ok[c] = False
                failed.add(r)
        while pending:
            now = time.monotonic()
            for c, (r, gen, work, t0) in list(pending.items()):
                if work.is_completed():
                    try:
                        work.wait()
                        ok[c] = True
                        elapsed.setdefault(r, []).append((chunks[c].numel() * 4, now - t0))
                    except Exception as e:  # noqa: BLE001 - peer gone / gloo timeout
                        self.causes.append({"rail": r, "gen": gen, "after_s": round(now - t0, 3),
                                            "cause": f"error: {str(e)[:80]}"})
                        ok[c] = False
                        failed.add(r)
                        self._announce(r, gen, self.store)
                    del pending[c]
                elif self._local_fail[r] >= gen or r in failed or now - t0 > self.s.op_timeout_s:
                    self.causes.append({"rail": r, "gen": gen, "after_s": round(now - t0, 3),
                                        "cause": "flagged" if self._local_fail[r] >= gen else
                                        ("sibling" if r in failed else "timeout")})
                    ok[c] = False  # abandoned: the buffer is private, the group gets parked
                    failed.add(r)
                    self._announce(r, gen, self.store)
                    del pending[c]
            if pending:
                time.sleep(0.001)
        bw = {}
        for r, xs in elapsed.items():
            nbytes = sum(b for b, _ in xs)
            if r not in failed and min(b for b, _ in xs) >= self.s.min_gray_bytes:
                bw[r] = nbytes / max(max(t for _, t in xs), 1e-9)
        return ok, failed, bw, results

    # ---- agreement ---------------------------------------------------------------------------
    def _agree(self, step: int, attempt: int, ok_chunks: list[bool], failed: list[int],
               bw: dict[int, float]) -> Decision:
        now = time.monotonic()
        with self._lock:
            built = dict(self._built)  # latest result per rail; decide() matches it to the gen
        up_for = [(now - self._carrier_since[r]) if self._carrier[r] else 0.0
                  for r in range(len(self.s.interfaces))]
        vote = Vote(self.rank, ok_chunks, failed, up_for, built, bw, now)
        # one round counter on every rank: all ranks call _agree equally often (same decisions)
        base = f"{self.prefix}/vote/{self._round}"
        self._round += 1
        self.store.set(f"{base}/{self.rank}", vote.to_json())
        keys = [f"{base}/{r}" for r in range(self.world)]
        self.store.wait(keys, datetime.timedelta(seconds=self.s.vote_timeout_s))
        votes = [Vote.from_json(b) for b in self.store.multi_get(keys)]
        # a build this rank finished but whose gen the vote did not settle yet stays pending
        dec = decide(self.agreed, votes, self.s)
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
                                "gen": self.agreed.rails[r].gen, "t_wall": time.time()})
        if self._round > 2:
            # every rank has read round n-2's votes once it voted in round n-1
            try:
                self.store.delete_key(f"{self.prefix}/vote/{self._round - 3}/{self.rank}")
            except Exception:  # noqa: BLE001 - a stale key costs only memory
                pass
        return dec

    def close(self) -> None:
        self._stop.set()
        self._watcher.join(1.0)
