"""Kills at uniformly random points of a training step, and what each one cost: pure functions.

Used by benchmarks/failover_training.py. A kill is planned as (step, rank, phase): the
phase is a fraction of the step drawn uniformly in [0, 1), so kills land anywhere in the
step, the boundary window (the optimizer step, the commit, the next step's snapshot) as
often as the forward pass. Where a kill actually landed is read back from the job's own
step log (its in-flight step and phase), so the result shows which part of the step was
covered, not what was aimed at. The capacity arithmetic charges every rank a system holds
(hot spares included) for the whole run. No clock, no processes: rows and times in,
figures out.

A row is one committed step of one rank: ``Row(step, time_s, rank, gen)``, ``time_s``
the wall time it was logged (right after the optimizer step).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import NamedTuple, Sequence

#: Share of a step at each end counted as the boundary window: the last tenth (all-reduce,
#: optimizer step, commit) and the first tenth (the next step's snapshot and hand-off).
BOUNDARY_FRAC = 0.1


class Row(NamedTuple):
    step: int
    time_s: float
    rank: int
    gen: int


@dataclass(frozen=True)
class KillPoint:
    """One planned SIGKILL: of ``rank``, at ``phase`` (fraction of a step) into ``step``."""
    step: int
    rank: int
    phase: float


def draw_kill_points(rng: random.Random, segment: int, count: int,
                     world_size: int) -> tuple[KillPoint, ...]:
    """Kill i in the segment centred on step (i + 1) * segment (an eighth of a segment kept
    clear at each end, so one recovery ends before the next kill), victim a rank in
    1..world_size-1 (rank 0 stays, as a job's coordinator usually does), phase uniform in
    [0, 1)."""
    if segment < 4 or count < 0 or world_size < 2:
        raise ValueError(f"draw_kill_points: need segment >= 4, count >= 0, world_size >= 2; "
                         f"got {segment}, {count}, {world_size}")
    margin = max(1, segment // 8)
    return tuple(KillPoint(rng.randrange(int((i + 0.5) * segment) + margin,
                                         int((i + 1.5) * segment) - margin + 1),
                           rng.randrange(1, world_size), rng.random()) for i in range(count))


def step_time_s(rows: Sequence[Row], before_s: float, last: int = 6) -> float | None:
    """The job's own step time just before ``before_s``: the median gap between the first
    commits of its last ``last`` distinct steps (None with fewer than 3 such steps)."""
    first: dict[int, float] = {}
    for r in sorted(rows, key=lambda r: r.time_s):
        if r.time_s <= before_s:
            first.setdefault(r.step, r.time_s)
    times = sorted(first.values())[-last:]
    gaps = [b - a for a, b in zip(times, times[1:]) if b > a]
    return statistics.median(gaps) if len(gaps) >= 2 else None


def landed(rows: Sequence[Row], kill_s: float, step_s: float) -> dict:
    """Where a kill at ``kill_s`` landed: the step in flight (the newest commit before it,
    plus one), the phase (time since that commit over the step time; above 1 when that
    step ran slower than the ones before it) and whether it fell in the boundary window."""
    last = last_commit(rows, kill_s)
    if last is None or step_s <= 0:
        return {"step": 0, "phase": None, "boundary": None}
    phase = (kill_s - last.time_s) / step_s
    return {"step": last.step + 1, "phase": round(phase, 4), "boundary": in_boundary(phase)}


def last_commit(rows: Sequence[Row], kill_s: float) -> Row | None:
    """The step committed last before ``kill_s``, timed by its first rank to log it (the
    ranks of one step log a little apart; the killer aims from the first one too)."""
    before = [r for r in rows if r.time_s <= kill_s]
    if not before:
        return None
    newest = max(before, key=lambda r: r.time_s)
    return min((r for r in before if r.step == newest.step and r.gen == newest.gen),
               key=lambda r: r.time_s)


def in_boundary(phase: float) -> bool:
    """A phase within BOUNDARY_FRAC of either end of the step (past the end counts as the end)."""
    return phase < BOUNDARY_FRAC or phase >= 1.0 - BOUNDARY_FRAC


def lost_s(rows: Sequence[Row], kill_s: float, step_s: float, new_generation: bool) -> float | None:
    """Seconds of progress a kill cost: when the job next committed a step at or past the
    one in flight at the kill, minus when it would have committed that step without the
    kill (the last commit before it plus that many steps). With ``new_generation`` (a
    system that recovers into a new generation: seamguard, torchrun) only the recovered
    generation's commits count, so a step the survivors logged just after the kill and
    then redid is not taken for progress; detection, restart, state transfer and every
    step redone are in it. None if the job never got there."""
    last = last_commit(rows, kill_s)
    if last is None:
        return None
    gen_at_kill = max(r.gen for r in rows if r.time_s <= kill_s)
    after = [r for r in rows if r.time_s > kill_s and r.step > last.step
             and (r.gen > gen_at_kill or not new_generation)]
    if not after:
        return None
    first = min(after, key=lambda r: r.time_s)
    return first.time_s - (last.time_s + (first.step - last.step) * step_s)


def phase_coverage(phases: Sequence[float | None], bins: int = 10) -> dict:
    """How many kills landed in each tenth of the step (a phase past 1 in the last), and
    in the boundary window."""
    seen = [p for p in phases if p is not None]
    counts = [0] * bins
    for p in seen:
        counts[min(bins - 1, max(0, int(p * bins)))] += 1
    return {"bins": counts, "boundary": sum(in_boundary(p) for p in seen), "n": len(seen)}


def describe(values: Sequence[float | None], digits: int = 3) -> dict | None:
    """Median, p10, p90, min, max and n of every value given (None skipped): all runs, no pick."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None

    def q(p: float) -> float:   # linear interpolation between closest ranks
        k = (len(v) - 1) * p
        lo = int(k)
        hi = min(lo + 1, len(v) - 1)
        return v[lo] + (v[hi] - v[lo]) * (k - lo)

    return {"median": round(statistics.median(v), digits), "p10": round(q(0.1), digits),
            "p90": round(q(0.9), digits), "min": round(v[0], digits), "max": round(v[-1], digits),
            "n": len(v)}


def goodput_per_rank_s(samples: float, ranks_provisioned: int, window_s: float) -> float:
    """Useful training samples per provisioned rank-second (GPU-second): every rank held for
    the run is charged, training or idle (a hot spare), for the whole training window."""
    if ranks_provisioned < 1 or window_s <= 0:
        raise ValueError(f"goodput_per_rank_s: need ranks >= 1 and window > 0, "
                         f"got {ranks_provisioned}, {window_s}")
    return samples / (ranks_provisioned * window_s)


def samples_dropped(rows: Sequence[Row], steps: int, world_size: int, global_batch: int) -> int:
    """Samples of steps committed without every rank (torchft goes on without a dead replica
    and skips its shard of the batch): the shards missing from ``steps`` steps."""
    per_step: dict[int, set[int]] = {}
    for r in rows:
        per_step.setdefault(r.step, set()).add(r.rank)
    missing = sum(world_size - min(world_size, len(per_step.get(s, ()))) for s in range(steps))
    return missing * global_batch // world_size
