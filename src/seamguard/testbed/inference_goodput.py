"""Goodput as the disaggregated-serving literature defines it: the highest offered rate at which
a router's SLO attainment stays at or above a target, read off a grid of load levels.

Why this exists: benchmarks/inference_routing.py also reports goodput as "requests/s meeting
the SLO at one offered load"; at equal load that ratio is the attainment ratio, bounded by
1 / (the best baseline's attainment). DistServe (Zhong et al., OSDI 2024,
https://arxiv.org/abs/2401.09670) compares serving systems by "the maximum request rate that can
be served while meeting the SLO attainment goal" (90 % there). This module turns a table of
(level, rate, attainment) into that rate and compares two of them. Pure functions; no clock, no
I/O. The benchmark calls it; tests/gateway/test_inference_goodput.py holds its decision table.

Reading a grid honestly: the max rate is the highest level at which the target was met with every
lower level also meeting it (a curve that dips and recovers is reported, not smoothed over), or,
read generously, the highest level that met it at all. A router that misses at the lowest level
is "below" that level (not 0); one that meets at the highest is "at least" that level (not
infinity). A ratio involving either is a bound.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

AT, AT_LEAST, BELOW = "at", "at_least", "below"


@dataclass(frozen=True)
class Point:
    """One level of the grid for one router."""

    level: float  # offered load as a fraction of the pool's capacity
    rate_rps: float  # the same load in requests/s
    attainment: float  # share of requests meeting their SLO, 0..1


@dataclass(frozen=True)
class MaxRate:
    """The highest rate at which a router met the attainment target, as the grid can tell it."""

    bound: str  # AT: met here, missed at the next level; AT_LEAST: met at every level tried; BELOW: missed at the lowest
    level: float  # AT, AT_LEAST: the highest level met; BELOW: the lowest level tried
    rate_rps: float  # the same, in requests/s
    met_again_at: tuple[float, ...] = ()  # levels above the first miss where the target was met again

    def interval_rps(self) -> tuple[float, float]:
        """The router's max rate as an interval: [r, r] at a grid level, [r, inf) at least, [0, r) below."""
        if self.bound == AT:
            return self.rate_rps, self.rate_rps
        if self.bound == AT_LEAST:
            return self.rate_rps, math.inf
        return 0.0, self.rate_rps

    def __str__(self) -> str:
        prefix = {AT: "", AT_LEAST: ">= ", BELOW: "below "}[self.bound]
        return f"{prefix}{self.level:g} ({self.rate_rps:.2f} req/s)"


def max_rate_at_target(points: Sequence[Point], target: float, contiguous: bool = True) -> MaxRate:
    """The highest level whose attainment, and every lower level's, is >= target; with
    contiguous=False the highest level whose own attainment is (a curve that rises with load, as a
    balancer's can when queues start to steer it off a slow path, then gets its best point)."""
    if not 0.0 < target <= 1.0:
        raise ValueError(f"max_rate_at_target: target {target}: need 0 < target <= 1")
    if not points:
        raise ValueError("max_rate_at_target: no points")
    pts = sorted(points, key=lambda p: p.level)
    for a, b in itertools.pairwise(pts):
        if a.level == b.level:
            raise ValueError(f"max_rate_at_target: level {a.level} appears twice")
    for p in pts:
        if not 0.0 <= p.attainment <= 1.0:
            raise ValueError(f"max_rate_at_target: level {p.level}: attainment {p.attainment} outside 0..1")
    misses = [i for i, p in enumerate(pts) if p.attainment < target]
    if not contiguous:
        met = [i for i, p in enumerate(pts) if p.attainment >= target]
        if met and met[-1] != len(pts) - 1:
            return MaxRate(AT, pts[met[-1]].level, pts[met[-1]].rate_rps)
        misses = [i for i in misses if not met or i > met[-1]]
    if not misses:
        return MaxRate(AT_LEAST, pts[-1].level, pts[-1].rate_rps)
    first = misses[0]
    again = tuple(p.level for p in pts[first + 1:] if p.attainment >= target)
    if first == 0:
        return MaxRate(BELOW, pts[0].level, pts[0].rate_rps, again)
    return MaxRate(AT, pts[first - 1].level, pts[first - 1].rate_rps, again)


def best_interval_rps(rates: Sequence[MaxRate]) -> tuple[float, float]:
    """The interval of the largest of several max rates (the best baseline's)."""
    if not rates:
        raise ValueError("best_interval_rps: no rates")
    ivs = [r.interval_rps() for r in rates]
    return max(lo for lo, _ in ivs), max(hi for _, hi in ivs)


@dataclass(frozen=True)
class RateRatio:
    """ours / theirs where either may be known only as a bound."""

    bound: str  # "=": the grid's ratio; ">=": a lower bound; "<=": an upper bound; "?": the grid cannot tell
    value: float | None  # None when bound is "?"

    def __str__(self) -> str:
        if self.value is None:
            return "undetermined by the grid"
        return f"{'' if self.bound == '=' else self.bound + ' '}{self.value:.2f}x"


def rate_ratio(ours: MaxRate, theirs: Sequence[MaxRate]) -> RateRatio:
    """Our max rate over the best of theirs, by interval division: [o_lo / t_hi, o_hi / t_lo]."""
    o_lo, o_hi = ours.interval_rps()
    t_lo, t_hi = best_interval_rps(theirs)
    lo = o_lo / t_hi if t_hi != math.inf else 0.0
    hi = o_hi / t_lo if t_lo > 0 else math.inf
    if lo == hi:
        return RateRatio("=", round(lo, 4))
    if lo > 0 and hi == math.inf:
        return RateRatio(">=", round(lo, 4))
    if lo == 0 and hi != math.inf:
        return RateRatio("<=", round(hi, 4))
    return RateRatio("?", None)
