"""The rails' functional core: settings, per-chunk deadlines and the decision over votes.

Every rank of a multi-rail collective (runtime/rails.py) votes after each attempt: which
chunks it finished, which rails it saw fail, its carriers, its finished rebuilds, the
bandwidth and chunk times it measured. Every rank then applies the same `decide` to the
same votes, so all agree on which chunks committed, which rails are out, when one is
rebuilt and when it is back. The deadlines a chunk is given (`op_deadline`, `overdue`)
come from the agreed chunk times in those votes. Pure functions and plain records: no
process group, no clock, no I/O; tested with decision tables (tests/rails/).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field


class RailsError(RuntimeError):
    """No rail could carry the collective within the bounds of the settings."""


@dataclass(frozen=True)
class RailSettings:
    interfaces: tuple[str, ...]
    """Rail interface names inside the host, index = rail id (e.g. ("rail0", "rail1"))."""
    chunks: int = 0
    """Fixed number of chunks per collective; 0 = one per rail (striped: every rail carries a
    share). 1 = active-standby: one chunk, on the first usable rail, the others idle until it
    fails (the bond's mode; on a host whose links are not the bottleneck a second ring only
    costs CPU, measured in docs/benchmarks.md); a slow-but-working rail is then caught only
    by the deadline ceiling, as there is no second rail's time to compare. Never depends on
    health, so the sums are bit-identical whatever rail carried them."""
    op_deadline_min_s: float = 0.5
    """Floor of the per-chunk deadline: a host that is merely slow is not a rail failure. On
    the loaded 2-core testbed a healthy rail's chunk finished up to 0.63 s after the other
    rail's while recent chunk times stayed short, so a lower floor fails healthy rails."""
    op_deadline_max_s: float = 1.0
    """Ceiling of the per-chunk deadline, and its value until a rail has chunk times: a
    silent failure (dead switch, carriers up) is caught within this. Below gloo_timeout_s."""
    op_deadline_factor: float = 3.0
    """Deadline = this x the slowest recent chunk time on the rail, then clamped."""
    op_deadline_window_chunks: int = 50
    """Recent chunk times per rail (one per attempt: the slowest rank's) the deadline uses."""
    op_deadline_warmup_chunks: int = 5
    """A rail with fewer recent chunk times than this gets the ceiling as its deadline."""
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
    gray_min_lag_s: float = 0.1
    """A slow measurement counts only if the rail's chunks also took at least this much longer
    than the fastest rail's: a shorter lag is scheduling noise on a loaded host (30-70 ms
    seen on the 2-core testbed, at 4x-5x lower bandwidth), not a collapsed link."""
    probe_bytes: int = 1 << 20
    """Size of the allreduce that probes a rebuilt rail's bandwidth."""
    probe_rounds: int = 3
    """Allreduces a probe runs; the fastest one gives the rail's bandwidth (`probe_bandwidth`)."""
    start_timeout_s: float = 120.0
    """Bound on waiting for every rank to arrive before the first groups are built."""
    vote_timeout_s: float = 15.0
    """Bound on waiting for every rank's vote (a rank that never votes is a dead process)."""
    max_wait_no_rail_s: float = 60.0
    """How long a collective waits for any rail to come back before raising RailsError."""

    def __post_init__(self) -> None:
        if not self.interfaces:
            raise ValueError("RailSettings.interfaces: at least one rail interface is needed")
        if not 0 < self.op_deadline_min_s <= self.op_deadline_max_s < self.gloo_timeout_s:
            # at or above gloo's timeout, gloo would end a silent failure as an error first
            raise ValueError("need 0 < op_deadline_min_s <= op_deadline_max_s < gloo_timeout_s, got "
                             f"{self.op_deadline_min_s}, {self.op_deadline_max_s}, {self.gloo_timeout_s}")
        if self.op_deadline_factor < 1:
            raise ValueError(f"op_deadline_factor must be >= 1, got {self.op_deadline_factor}")
        if not 1 <= self.op_deadline_warmup_chunks <= self.op_deadline_window_chunks:
            raise ValueError("need 1 <= op_deadline_warmup_chunks <= op_deadline_window_chunks")
        if not 0 < self.gray_ratio < 1:
            raise ValueError(f"gray_ratio must be in (0, 1), got {self.gray_ratio}")
        if self.probe_rounds < 1:
            raise ValueError(f"probe_rounds must be >= 1, got {self.probe_rounds}")

    @property
    def n_chunks(self) -> int:
        return self.chunks or len(self.interfaces)


# ---- the per-chunk deadline: a pure function of agreed chunk times -----------------------

@dataclass(frozen=True)
class OpDeadline:
    """How long a chunk on a rail may take before the rail counts as failed, and why."""

    deadline_s: float
    basis: str


def op_deadline(recent_chunk_s: Sequence[float], s: RailSettings) -> OpDeadline:
    """Pure: the deadline for a rail's next chunks from its recent chunk times (oldest first).

    A multiple of the slowest of the last `op_deadline_window_chunks` times, not a mean or a
    quantile: it rises at once with a burst of slow-but-successful chunks and falls only
    once the burst has left the window. Clamped to [`op_deadline_min_s`,
    `op_deadline_max_s`], so a rail whose chunks never finish is given up within the ceiling.
    """
    recent = list(recent_chunk_s)[-s.op_deadline_window_chunks:]
    if len(recent) < s.op_deadline_warmup_chunks:
        return OpDeadline(s.op_deadline_max_s, f"warm-up ({len(recent)}/{s.op_deadline_warmup_chunks} "
                                               f"chunk times): ceiling {s.op_deadline_max_s:g} s")
    slowest = max(recent)
    raw = s.op_deadline_factor * slowest
    basis = f"{s.op_deadline_factor:g} x slowest of {len(recent)} recent chunks ({slowest:.3f} s)"
    if raw < s.op_deadline_min_s:
        return OpDeadline(s.op_deadline_min_s, f"{basis} = {raw:.3f} s, raised to floor {s.op_deadline_min_s:g} s")
    if raw > s.op_deadline_max_s:
        return OpDeadline(s.op_deadline_max_s, f"{basis} = {raw:.3f} s, cut to ceiling {s.op_deadline_max_s:g} s")
    return OpDeadline(raw, f"{basis} = {raw:.3f} s")


def overdue(own_s: float, since_other_rail_s: float | None, deadline: OpDeadline, s: RailSettings) -> str:
    """Pure: why a chunk still running is given up (its rail counts as failed), or "" to wait.

    `own_s`: how long the chunk has had its rail (since the chunks ahead of it there were
    done). `since_other_rail_s`: how long ago a chunk of this attempt finished on another
    rail, None if none has. A finished chunk elsewhere shows that every peer joined the
    collective, so from then on this rail gets its own deadline. Before that, a late chunk
    most likely waits for a slow peer (a rank descheduled on a loaded host), which delays
    every rail alike and is no reason to give any of them up; it gets the ceiling.
    """
    if own_s > s.op_deadline_max_s:
        alone = "" if since_other_rail_s is not None else ", no other rail finished"
        return f"{own_s:.3f} s > ceiling {s.op_deadline_max_s:g} s{alone}"
    if since_other_rail_s is not None and min(own_s, since_other_rail_s) > deadline.deadline_s:
        return (f"{min(own_s, since_other_rail_s):.3f} s after another rail finished > deadline "
                f"{deadline.deadline_s:.3f} s ({deadline.basis})")
    return ""


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
    recent_chunk_s: list[float] = field(default_factory=list)  # agreed chunk times, oldest first

    def deadline(self, s: RailSettings) -> OpDeadline:
        return op_deadline(self.recent_chunk_s, s)


@dataclass
class Agreed:
    rails: list[RailState]
    bw_ref_bytes_per_s: float = 0.0  # typical best-rail bandwidth: the yardstick for probes
    recent_best_bw: list[float] = field(default_factory=list)  # each step's best rail, oldest first

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
    # per rail: the longest a chunk took on this rank this attempt, counted from when the
    # chunks ahead of it on that rail were done; a chunk that missed its deadline counts
    # with the time it was given up after (it took at least that long)
    chunk_s: dict[int, float] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @staticmethod
    def from_json(s: str | bytes) -> "Vote":
        d = json.loads(s)
        d["built"] = {int(k): tuple(v) for k, v in d["built"].items()}
        d["bw_bytes_per_s"] = {int(k): v for k, v in d["bw_bytes_per_s"].items()}
        d["chunk_s"] = {int(k): v for k, v in d.get("chunk_s", {}).items()}
        return Vote(**d)


@dataclass
class Decision:
    commit_chunks: list[bool]  # chunk succeeded on every rank
    newly_dead: list[int]
    start_builds: list[int]  # rails every rank starts rebuilding now (at the new gen)
    newly_live: list[int]
    chunk_s: dict[int, float] = field(default_factory=dict)  # rail -> chunk time added to its window


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
    # chunk times: the slowest rank's, since a deadline that fits it fits every rank
    chunk_s = {}
    for r, st in enumerate(agreed.rails):
        vals = [v.chunk_s[r] for v in votes if r in v.chunk_s]
        if vals:
            chunk_s[r] = max(vals)
            st.recent_chunk_s = (st.recent_chunk_s + [chunk_s[r]])[-s.op_deadline_window_chunks:]
    if bw:
        best = max(bw.values())
        # The median of recent steps, not the latest: a few steps slowed by a busy host
        # must not lower the bar a probe of a still-gray rail has to clear.
        agreed.recent_best_bw = (agreed.recent_best_bw + [best])[-s.op_deadline_window_chunks:]
        agreed.bw_ref_bytes_per_s = statistics.median(agreed.recent_best_bw)
        if len(bw) > 1:
            fastest_s = min((chunk_s[r] for r in bw if r in chunk_s), default=0.0)
            for r, b in bw.items():
                st = agreed.rails[r]
                lag_s = chunk_s.get(r, math.inf) - fastest_s  # no chunk times voted: bandwidth alone
                slow = b < s.gray_ratio * best and lag_s >= s.gray_min_lag_s
                st.slow_count = st.slow_count + 1 if slow else 0
                if st.slow_count >= s.gray_steps and r not in failed:
                    failed.add(r)
                    st.reason = f"gray: {b / 1e6:.1f} MB/s vs best {best / 1e6:.1f} MB/s"
                    if r in chunk_s:
                        st.reason += f", {lag_s * 1e3:.0f} ms behind"
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
    return Decision(commit, dead, builds, live, chunk_s)
