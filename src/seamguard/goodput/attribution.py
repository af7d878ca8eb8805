"""Every second of a job's wall time, attributed to one cause: the pure core of live goodput.

Inputs are records the sources built (`JobSeries` from the runtime's own series, `Run`s from
the scheduler's accounting, `Episode`s from the ledger); the output is one `Goodput` per job
and window whose `spans` tile the job's wall time exactly, each naming a cause, the entity
and seam that cost it, and why (data, not prose to parse). No clock, no I/O: the CLI, the
API and `/metrics` render the same record. The rules and their order are in docs/goodput.md.

Precedence where explanations overlap (first match wins for each piece of time):
1. the scheduler says the job is not running            -> restart
2. running, but the step series is absent or went back, or the runtime replaced workers
   (its generation advanced; the stepless time around it) -> restart (start-up, in-job recovery)
3. steps at or below the highest step reached before     -> rollback (recomputed steps)
4. the slowest rank's wait on its snapshot copy          -> checkpoint_stall (share of step time)
5. time beyond the job's own clean per-step time, or no progress at all, while an entity of
   the job is unhealthy in the ledger                    -> straggler (straggler or gray link)
6. the same while an action that slows the job is in effect -> degraded
7. slow but unexplained steps                            -> productive (the job progressed)
8. no progress and nothing explains it                   -> unattributed
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np


class Cause(str, Enum):
    PRODUCTIVE = "productive"
    CHECKPOINT_STALL = "checkpoint_stall"
    ROLLBACK = "rollback"
    RESTART = "restart"
    STRAGGLER = "straggler"  # waiting on a straggler or a gray link
    DEGRADED = "degraded"  # running in a degraded mode an action put it in
    UNATTRIBUTED = "unattributed"


CAUSES = tuple(c.value for c in Cause)
LOST_CAUSES = tuple(c for c in CAUSES if c != Cause.PRODUCTIVE.value)
# How long before a job stops stepping an action or failure that stops it may lie: Slurm's
# checkpoint grace and KillWait, the runtime's heartbeat timeout, one scrape interval.
RESTART_LOOKBACK_S = 300.0


@dataclass(frozen=True, eq=False)
class JobSeries:
    """The runtime's series of one job at sample times (NaN where a sample is missing).

    Samples before the window are welcome: they give the highest step already reached
    (what a restart has to redo) and more clean steps for the job's own per-step time."""

    t_s: np.ndarray
    step: np.ndarray  # seamguard_job_step: the furthest step any rank reached
    step_s: np.ndarray  # seamguard_job_step_seconds: wall seconds per step, recent steps
    stall_s: np.ndarray  # the slowest rank's wait on its snapshot copy in its last step
    generation: np.ndarray  # seamguard_job_generation: one more per in-job recovery

    @classmethod
    def of(cls, t_s, step, step_s=None, stall_s=None, generation=None) -> JobSeries:
        t = np.asarray(t_s, dtype=float)
        nan = np.full(t.shape, np.nan)
        arrs = [np.asarray(a, dtype=float) if a is not None else nan for a in (step, step_s, stall_s, generation)]
        if any(a.shape != t.shape for a in arrs):
            raise ValueError(f"series of different lengths: t_s {t.shape}, step/step_s/stall_s/generation "
                             f"{[a.shape for a in arrs]}")
        if t.size > 1 and not bool(np.all(np.diff(t) > 0)):
            raise ValueError("series t_s must increase strictly")
        return cls(t, *arrs)


@dataclass(frozen=True)
class Run:
    """One allocation of the job by the scheduler: from its start until it ended (or now)."""

    start_s: float
    end_s: float  # math.inf: still running
    state: str  # how it ended (COMPLETED, REQUEUED, NODE_FAIL, ...) or RUNNING
    nodes: str = ""


@dataclass(frozen=True)
class Episode:
    """A stretch of the ledger that may explain lost time.

    ``cause`` is STRAGGLER (an entity the job runs on was not healthy), DEGRADED (an action
    that slows the job was in effect) or RESTART (an action that restarts the job, or a
    hard failure, at ``start_s``). ``severity`` orders STRAGGLER episodes (the state's rank)."""

    start_s: float
    end_s: float  # math.inf: still open at the end of the record
    cause: Cause
    entity: str
    seam: str
    why: str
    severity: int = 0


@dataclass(frozen=True)
class Span:
    """One stretch of wall time and what it went to."""

    start_s: float
    end_s: float
    cause: str
    entity: str
    seam: str
    why: str

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class Goodput:
    """A job's (or the fleet's) wall time in a window, split by cause; the one result record."""

    job: str
    since_s: float
    until_s: float
    wall_s: float
    by_cause_s: dict[str, float]
    spans: tuple[Span, ...] = ()
    steps_new: int = 0  # steps past the highest reached before
    steps_redone: int = 0
    step_clean_s: float | None = None  # the job's own per-step time (compute, no stall) the rules used
    notes: tuple[str, ...] = field(default=())

    @property
    def ettr(self) -> float | None:
        """Effective training time ratio: productive seconds / wall seconds (None: no wall time)."""
        return self.by_cause_s[Cause.PRODUCTIVE.value] / self.wall_s if self.wall_s > 0 else None

    @property
    def lost_s(self) -> float:
        return sum(self.by_cause_s[c] for c in LOST_CAUSES)

    def to_dict(self, spans: bool = True) -> dict:
        out = {"job": self.job, "since_s": self.since_s, "until_s": self.until_s, "wall_s": round(self.wall_s, 3),
               "ettr": None if self.ettr is None else round(self.ettr, 5),
               "by_cause_s": {c: round(v, 3) for c, v in self.by_cause_s.items()},
               "steps_new": self.steps_new, "steps_redone": self.steps_redone,
               "step_clean_s": None if self.step_clean_s is None else round(self.step_clean_s, 6),
               "notes": list(self.notes)}
        if spans:
            out["spans"] = [{"start_s": s.start_s, "end_s": s.end_s, "seconds": round(s.seconds, 3),
                             "cause": s.cause, "entity": s.entity, "seam": s.seam, "why": s.why}
                            for s in self.spans]
        return out


# ---- the job's lifetime in the window ------------------------------------------------------------
def _lifetime(since_s: float, until_s: float, series: JobSeries,
              runs: Sequence[Run]) -> tuple[float, float] | None:
    """Wall time counted: from the job's first start (or the window's start, if it started
    before) to its last end (or the window's end). Queue time before the first start is not
    the job's; time pending after a requeue is."""
    if runs:
        live = [r for r in runs if r.end_s > since_s and r.start_s < until_s]
        if not live:
            return None
        a0 = since_s if min(r.start_s for r in runs) < since_s else min(r.start_s for r in live)
        last = max(live, key=lambda r: r.start_s)
        a1 = min(until_s, last.end_s)
        return (a0, a1) if a1 > a0 else None
    ok = np.isfinite(series.step) & (series.t_s >= since_s) & (series.t_s <= until_s)
    if ok.sum() < 2:
        return None
    t = series.t_s[ok]
    return float(t[0]), float(t[-1])


def _running(runs: Sequence[Run], u: float, v: float) -> Run | None:
    """The run holding [u, v] (runs never overlap); None when the job was not running."""
    mid = (u + v) / 2
    return next((r for r in runs if r.start_s <= mid < r.end_s), None)


# ---- per sample interval: what the step series says ----------------------------------------------
@dataclass(frozen=True)
class _Interval:
    kind: str  # progress | stalled | back | gap
    redo: float = 0.0  # share of the interval recomputing steps
    stall: float = 0.0  # share waiting on snapshot copies
    slow: float = 0.0  # share beyond the job's clean per-step time
    new_steps: int = 0
    redone: int = 0
    step_from: float = math.nan
    step_to: float = math.nan
    recovery: bool = False  # the runtime replaced workers in or around it (its generation advanced)


def _intervals(s: JobSeries) -> tuple[list[_Interval], float | None]:
    """What each interval between consecutive samples held, and the clean per-step time used."""
    n = s.t_s.size
    hw = np.fmax.accumulate(np.where(np.isfinite(s.step), s.step, -np.inf)) if n else np.array([])
    gen = s.generation
    bumped = [bool(gen[i + 1] > gen[i]) for i in range(n - 1)]  # NaN compares False
    raw: list[tuple] = []
    for i in range(n - 1):
        a, b, dt = s.step[i], s.step[i + 1], s.t_s[i + 1] - s.t_s[i]
        if not (math.isfinite(a) and math.isfinite(b)):
            raw.append(("gap", a, b))
        elif b < a:
            raw.append(("back", a, b))
        elif b == a:
            raw.append(("stalled", a, b))
        else:
            d = b - a
            redo = min(max(hw[i] - a, 0.0), d)
            sigma = s.stall_s[i + 1] / s.step_s[i + 1] if s.step_s[i + 1] > 0 else math.nan
            sigma = min(max(sigma, 0.0), 1.0) if math.isfinite(sigma) else 0.0
            fresh = d - redo
            per_step = dt * (fresh / d) * (1 - sigma) / fresh if fresh > 0 else math.nan
            raw.append(("progress", a, b, redo / d, sigma, fresh, per_step, redo))
    clean = [r[6] for r, b in zip(raw, bumped) if r[0] == "progress" and r[3] == 0 and not b
             and math.isfinite(r[6])]
    base = float(np.median(clean)) if clean else None
    out: list[_Interval] = []
    for r in raw:
        if r[0] != "progress":
            out.append(_Interval(r[0], step_from=r[1], step_to=r[2]))
            continue
        _, a, b, redo, sigma, fresh, per_step, redone = r
        slow = 0.0
        if base is not None and fresh > 0 and per_step > base:
            # the share of the interval beyond fresh x clean step time (after rollback and stall)
            slow = (1 - redo) * (1 - sigma) * (1 - base / per_step)
        out.append(_Interval("progress", redo, (1 - redo) * sigma, slow, int(round(fresh)), int(round(redone)), a, b))
    return _recoveries(out, bumped), base


def _recoveries(ivs: list[_Interval], bumped: list[bool]) -> list[_Interval]:
    """Mark the intervals of each in-job recovery: the one where the generation advanced and
    the intervals without a step just before it (losing a worker, noticing) and just after
    (restoring, re-forming the group). The bump may come in the interval where the step went
    back (the job resumed from an older step): the stepless time beside it is the same recovery's."""
    mark = [False] * len(ivs)
    for i, b in enumerate(bumped):
        if not b or ivs[i].kind == "gap":
            continue
        mark[i] = True
        for rng in (range(i - 1, -1, -1), range(i + 1, len(ivs))):
            for k in rng:
                if ivs[k].kind != "stalled":
                    break
                mark[k] = True
    return [replace(iv, recovery=True) if m else iv for iv, m in zip(ivs, mark, strict=True)]


# ---- explanations from the ledger -------------------------------------------------------------------
def _overlapping(episodes: Sequence[Episode], u: float, v: float, cause: Cause) -> Episode | None:
    hits = [e for e in episodes if e.cause == cause and e.start_s < v and e.end_s > u]
    return min(hits, key=lambda e: (-e.severity, e.start_s, e.entity)) if hits else None


def _restart_reason(episodes: Sequence[Episode], lo: float, hi: float, job: str,
                    fallback: tuple[str, str, str] | None) -> tuple[str, str, str] | None:
    """(entity, seam, why) of a restart whose cause lies in [lo, hi]: the latest restarting
    action or hard failure there, else the most severe unhealthy entity open at ``hi``."""
    acts = [e for e in episodes if e.cause == Cause.RESTART and lo <= e.start_s <= hi]
    if acts:
        e = max(acts, key=lambda e: (e.start_s, e.entity))
        return e.entity, e.seam, e.why
    e = _overlapping(episodes, hi - 1e-9, hi, Cause.STRAGGLER)
    if e is not None:
        return e.entity, e.seam, f"{e.why} (open when the job stopped)"
    return fallback


# ---- the attribution ---------------------------------------------------------------------------------
def _pieces(iv: _Interval | None, run_ok: bool, dur: float, u: float, v: float, episodes: Sequence[Episode],
            restart: tuple[str, str, str], job: str) -> list[tuple[str, float, str, str, str]]:
    """(cause, seconds, entity, seam, why) of one elementary segment, in precedence order."""
    if not run_ok:
        return [(Cause.RESTART.value, dur, *restart)]
    if iv is None or iv.kind == "gap":
        return [(Cause.RESTART.value, dur, *restart)]
    if iv.kind == "back" or (iv.kind == "stalled" and iv.recovery):
        return [(Cause.RESTART.value, dur, *restart)]
    strag = _overlapping(episodes, u, v, Cause.STRAGGLER)
    degr = _overlapping(episodes, u, v, Cause.DEGRADED)
    expl = strag or degr
    if iv.kind == "stalled":
        if expl is None:
            return [(Cause.UNATTRIBUTED.value, dur, job, "none", f"no step past {iv.step_from:.0f} and nothing in "
                                                                  "the ledger or the scheduler explains it")]
        return [(expl.cause.value, dur, expl.entity, expl.seam, f"no step past {iv.step_from:.0f}: {expl.why}")]
    out = []
    if iv.redo > 0:
        out.append((Cause.ROLLBACK.value, dur * iv.redo, restart[0], restart[1],
                    f"recomputing steps up to {iv.step_to:.0f} lost to: {restart[2]}"))
    if iv.stall > 0:
        out.append((Cause.CHECKPOINT_STALL.value, dur * iv.stall, job, "checkpoint",
                    "the slowest rank waited on its snapshot copy"))
    if iv.slow > 0 and iv.recovery:
        out.append((Cause.RESTART.value, dur * iv.slow, *restart))
    elif iv.slow > 0 and expl is not None:
        out.append((expl.cause.value, dur * iv.slow, expl.entity, expl.seam,
                    f"steps slower than the job's clean step time: {expl.why}"))
    used = sum(p[1] for p in out)
    out.append((Cause.PRODUCTIVE.value, max(dur - used, 0.0), job, "none", f"steps {iv.step_from:.0f}->{iv.step_to:.0f}"))
    return out


def _merge(spans: list[Span]) -> list[Span]:
    out: list[Span] = []
    for s in spans:
        if s.end_s <= s.start_s:
            continue
        p = out[-1] if out else None
        if p is not None and (p.cause, p.entity, p.seam) == (s.cause, s.entity, s.seam) and p.end_s == s.start_s:
            out[-1] = Span(p.start_s, s.end_s, p.cause, p.entity, p.seam, p.why)
        else:
            out.append(s)
    return out


def _edges(a0: float, a1: float, t: np.ndarray, runs: Sequence[Run], episodes: Sequence[Episode]) -> list[float]:
    """Every time in [a0, a1] where something may change: samples, run and episode bounds."""
    cuts = {a0, a1, *t[(t > a0) & (t < a1)].tolist()}
    for r in runs:
        cuts.update(x for x in (r.start_s, r.end_s) if a0 < x < a1)
    for e in episodes:
        cuts.update(x for x in (e.start_s, e.end_s) if a0 < x < a1)
    return sorted(cuts)


def _requeue_reason(runs: Sequence[Run], episodes: Sequence[Episode], u: float, job: str) -> tuple[str, str, str]:
    """What the time from the end of the allocation before ``u`` on is charged to: the restarting
    action or hard failure within that allocation, else how the scheduler says it ended."""
    prev = [r for r in runs if r.end_s <= u]
    last = prev[-1] if prev else None
    fb = (last.nodes or job, "scheduler", f"Slurm: run ended {last.state}") if last else \
        (job, "scheduler", "pending after a requeue before the window")
    return _restart_reason(episodes, last.start_s if last else -math.inf, last.end_s if last else u, job, fb)


def _restart_now(iv: _Interval | None, run: Run | None, runs: Sequence[Run], episodes: Sequence[Episode],
                 lo_sample_s: float, u: float, v: float, job: str, current: tuple[str, str, str],
                 in_restart: bool, reported_s: float = -math.inf) -> tuple[str, str, str]:
    """What a restart at [u, v] (and the rollback after it) is charged to; ``current`` when
    the segment is no restart, or continues one that nothing newer explains; ``reported_s``: the
    job's last step sample at or before ``u``."""
    if run is None:  # between allocations: the allocation that ended says why
        return _requeue_reason(runs, episodes, u, job)
    if iv is not None and iv.kind not in ("gap", "back") and not iv.recovery:
        return current
    if reported_s < run.start_s:  # starting up in a new allocation: still the requeue's cost,
        # unless something restarted this allocation since it began
        found = _restart_reason(episodes, run.start_s, v, job, None)
        return found if found is not None else _requeue_reason(runs, episodes, run.start_s, job)
    # the job stopped stepping while it held its allocation: a restarting action or a hard
    # failure shortly before explains it; else the runtime did (or its exporter)
    if iv is not None and iv.kind == "back":
        fb = (job, "runtime", f"the step went back from {iv.step_from:.0f} to {iv.step_to:.0f} "
                              "(the runtime restored a snapshot)")
    elif iv is not None and iv.recovery:
        fb = (job, "runtime", "the runtime replaced lost workers (its membership generation advanced)")
    else:
        fb = (job, "runtime", "the job reported no step (starting, restarting, or its exporter down)")
    found = _restart_reason(episodes, lo_sample_s - RESTART_LOOKBACK_S, v, job, None)
    return found if found is not None else (current if in_restart else fb)


def attribute(job: str, since_s: float, until_s: float, series: JobSeries, runs: Sequence[Run] = (),
              episodes: Sequence[Episode] = ()) -> Goodput:
    """The job's wall time in [since_s, until_s] split by cause; spans tile it exactly."""
    if not until_s > since_s:
        raise ValueError(f"window: until ({until_s}) must be after since ({since_s})")
    runs = sorted(runs, key=lambda r: r.start_s)
    life = _lifetime(since_s, until_s, series, runs)
    zero = {c: 0.0 for c in CAUSES}
    if life is None:
        return Goodput(job, since_s, until_s, 0.0, zero, notes=("the job neither ran nor reported in the window",))
    a0, a1 = life
    ivs, base = _intervals(series)
    t = series.t_s
    no_series = not np.isfinite(series.step).any()
    notes = (f"no step series for {job}: running time is unattributed",) if no_series else ()
    spans: list[Span] = []
    restart = (job, "runtime", "the job reported no step (starting or restarting)")
    new = redone = 0
    seen_iv: set[int] = set()
    edges = _edges(a0, a1, t, runs, episodes)
    seen = np.maximum.accumulate(np.where(np.isfinite(series.step), np.arange(t.size), -1)) if t.size else t
    for u, v in zip(edges[:-1], edges[1:], strict=True):
        i = int(np.searchsorted(t, u, side="right")) - 1
        iv = ivs[i] if 0 <= i < len(ivs) and t[i + 1] >= v else None
        run = _running(runs, u, v) if runs else Run(-math.inf, math.inf, "RUNNING")
        reported_s = float(t[seen[i]]) if 0 <= i < t.size and seen[i] >= 0 else -math.inf
        restart = _restart_now(iv, run, runs, episodes, t[i] if 0 <= i < t.size else u, u, v, job, restart,
                               bool(spans) and spans[-1].cause == Cause.RESTART.value, reported_s)
        if no_series and run is not None:
            pieces = [(Cause.UNATTRIBUTED.value, v - u, job, "none", "no step series for the job")]
        else:
            pieces = _pieces(iv, run is not None, v - u, u, v, episodes, restart, job)
        if iv is not None and iv.kind == "progress" and i not in seen_iv:
            seen_iv.add(i)
            new, redone = new + iv.new_steps, redone + iv.redone
        x = u
        for k, (cause, sec, ent, seam, why) in enumerate(pieces):
            y = v if k == len(pieces) - 1 else x + sec
            spans.append(Span(x, y, cause, ent, seam, why))
            x = y
    merged = _merge(spans)
    by = dict(zero)
    for sp in merged:
        by[sp.cause] += sp.seconds
    return Goodput(job, since_s, until_s, a1 - a0, by, tuple(merged), new, redone, base, notes)


# ---- the fleet -----------------------------------------------------------------------------------------
def fleet(reports: Sequence[Goodput], since_s: float, until_s: float) -> Goodput:
    """All jobs together: wall and cause seconds summed (job-seconds); no spans."""
    by = {c: sum(r.by_cause_s[c] for r in reports) for c in CAUSES}
    return Goodput("fleet", since_s, until_s, sum(r.wall_s for r in reports), by,
                   steps_new=sum(r.steps_new for r in reports), steps_redone=sum(r.steps_redone for r in reports))


def ettr_over_time(reports: Sequence[Goodput], edges_s: Sequence[float]) -> list[dict]:
    """The fleet's ETTR in each bucket [edges[k], edges[k+1]): productive job-seconds over wall
    job-seconds of every job's spans there (None where no job ran), with lost seconds by cause."""
    e = np.asarray(edges_s, dtype=float)
    nb = max(e.size - 1, 0)
    secs = np.zeros((len(CAUSES), nb))
    col = {c: k for k, c in enumerate(CAUSES)}
    for r in reports:
        for s in r.spans:
            lo, hi = np.maximum(e[:-1], s.start_s), np.minimum(e[1:], s.end_s)
            secs[col[s.cause]] += np.clip(hi - lo, 0.0, None)
    wall = secs.sum(axis=0)
    out = []
    for k in range(nb):
        w = float(wall[k])
        out.append({"t0_s": float(e[k]), "t1_s": float(e[k + 1]), "wall_s": round(w, 3),
                    "ettr": round(float(secs[col["productive"], k]) / w, 5) if w > 0 else None,
                    "by_cause_s": {c: round(float(secs[col[c], k]), 3) for c in CAUSES}})
    return out
