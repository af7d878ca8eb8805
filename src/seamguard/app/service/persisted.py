"""A range's series from memory and the ledger: the controller's last ticks, the ledger before them.

The runner holds its last ticks of fleet figures (coolant per loop, useful throughput) and
every entity's signals in the signal ring; a restarted controller holds none, and a week
never fits. The ledger keeps the same series, rolled up as they age (ledger/series.py).
For a range, the points before the oldest tick in memory are read from the ledger, the
rest from memory, and the whole is thinned to a bounded number of points by rolling up
equal spans of time (`timerange.groups`) with the ledger's own reductions. Pure over the
snapshot and the reader's answers; the renderers in render.py build the models.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seamguard.fleet.model import Kind
from seamguard.ledger.series import (
    COOLANT_FIELDS,
    FLEET_FIXED,
    LEVELS,
    WATCH_GFS,
    WATCH_MAX,
    encode_fleet,
    reduce_fleet,
    reduce_groups,
)
from seamguard.app.service import models as m
from seamguard.app.service.timerange import ALL, TimeRange, groups
from seamguard.app.snapshot import FleetPoint, Snapshot

RANGE_POINTS_MAX = 2000  # points one series of a range holds at most, whatever was asked

_KEPT = ", ".join(f"per tick for {lv.keep_s / 86400:g} d" if not lv.width_s else
                  f"per {lv.width_s / 60:g} min for {lv.keep_s / 86400:g} d" for lv in LEVELS)
FLEET_RULE = f"every tick's fleet figures are persisted: {_KEPT}"
ENTITY_RULE = (f"an entity's GFS and signals are persisted while it is not healthy or its GFS is at least "
               f"{WATCH_GFS:g} (the {WATCH_MAX} worst per tick): {_KEPT}")


@dataclass(frozen=True, eq=False)
class FleetRows:
    """Fleet vectors over a range, oldest first (`ledger.series.decode_fleet` reads ``rows``)."""

    t_s: np.ndarray
    wall_s: np.ndarray
    rows: np.ndarray
    persisted: m.Persisted | None


def width_for(loops: int) -> int:
    return FLEET_FIXED + (1 + COOLANT_FIELDS) * loops


def memory_rows(s: Snapshot, points: tuple[FleetPoint, ...]) -> np.ndarray:
    """The snapshot's fleet points as fleet vectors, with the useful throughput of their tick."""
    useful = {p.t_s: p for p in s.throughput}
    out = np.empty((len(points), width_for(_loops(s))))
    for k, p in enumerate(points):
        u = useful.get(p.t_s)
        out[k] = encode_fleet(p.gpu_counts, p.node_counts, u.useful_with if u else None,
                              u.useful_without if u else None, p.loop_state, p.coolant)
    return out


def _loops(s: Snapshot) -> int:
    return s.fleet.count(Kind.COOLING_LOOP)


def _newest(s: Snapshot, rng: TimeRange) -> float:
    """The time the ledger's retention is counted back from: the snapshot's, or the range's end
    before this controller has ticked."""
    if s.tick >= 0:
        return s.t_s
    return rng.until_t_s if rng.until_t_s is not None else float(rng.since_t_s or 0.0)


def _ledger_span(rng: TimeRange, held_since: float | None) -> tuple[float, float] | None:
    """[since, before) the ledger answers for: the range's part older than what memory holds."""
    if rng.since_t_s is None:
        return None
    before = held_since if held_since is not None else np.inf
    if rng.until_t_s is not None:
        before = min(before, np.nextafter(rng.until_t_s, np.inf))
    return (rng.since_t_s, before) if rng.since_t_s < before else None


def _note(span: tuple[float, float], rng: TimeRange, width_s: float, rule: str) -> m.Persisted:
    """Points before ``until_t_s`` came from the ledger (the range's end when all of them did)."""
    end = span[1] if rng.until_t_s is None or span[1] <= rng.until_t_s else rng.until_t_s
    return m.Persisted(until_t_s=float(end) if np.isfinite(end) else None, resolution_s=width_s, rule=rule)


def fleet_rows(s: Snapshot, reader, rng: TimeRange, points: int) -> FleetRows:
    """The fleet series over ``rng`` (default: the last ``points`` ticks in memory), at most
    ``points`` of them; with a range, the ledger's rows before the oldest tick in memory."""
    width = width_for(_loops(s))
    hist = s.fleet_history
    if rng == ALL:
        mine = hist[-points:]
        return FleetRows(np.array([p.t_s for p in mine]), np.array([p.wall_s for p in mine]),
                         memory_rows(s, mine).reshape(len(mine), width), None)
    mine = tuple(p for p in hist if rng.holds(p.t_s))
    t, wall = np.array([p.t_s for p in mine], dtype=np.float64), np.array([p.wall_s for p in mine], dtype=np.float64)
    rows, n = memory_rows(s, mine).reshape(len(mine), width), np.ones(len(mine))
    span = _ledger_span(rng, hist[0].t_s if hist else None)
    persisted = None
    if span is not None and reader is not None:
        got = reader.fleet_series(span[0], min(span[1], _newest(s, rng)), _newest(s, rng))
        keep = got["t_s"] < span[1]
        if got["rows"].shape[1:] == (width,) and keep.any():
            t, wall = np.r_[got["t_s"][keep], t], np.r_[got["wall_s"][keep], wall]
            rows, n = np.vstack([got["rows"][keep], rows]), np.r_[got["n"][keep], n]
        persisted = _note(span, rng, got["level"].width_s, FLEET_RULE)
    starts = groups(t, min(points, RANGE_POINTS_MAX))
    if starts.size == len(t):
        return FleetRows(t, wall, rows, persisted)
    return FleetRows(reduce_groups(t, starts, "last"), reduce_groups(wall, starts, "last"),
                     reduce_fleet(rows, starts, n), persisted)


@dataclass(frozen=True, eq=False)
class EntityOlder:
    """An entity's persisted points older than the signal ring's: GFS and every signal of its kind."""

    t_s: np.ndarray
    n: np.ndarray
    gfs: np.ndarray
    values: np.ndarray  # [k, signals of its kind]
    persisted: m.Persisted


def entity_older(s: Snapshot, reader, kind: str, name: str, rng: TimeRange, ring_since: float | None,
                 signals: int) -> EntityOlder | None:
    """The ledger's points of one entity in ``rng`` before ``ring_since`` (the ring's oldest
    point; None: the ring holds none)."""
    span = _ledger_span(rng, ring_since)
    if span is None or reader is None:
        return None
    newest = _newest(s, rng)
    got = reader.entity_series(kind, name, span[0], min(span[1], newest), newest)
    keep = got["t_s"] < span[1]
    if got["values"].shape[1:] != (signals,):
        keep[:] = False
    return EntityOlder(got["t_s"][keep], got["n"][keep], got["gfs"][keep], got["values"][keep].reshape(-1, signals),
                       _note(span, rng, got["level"].width_s, ENTITY_RULE))


def thin_series(t: np.ndarray, columns: dict[str, np.ndarray], how: dict[str, str], n: np.ndarray,
                points: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``columns`` (each aligned to ``t``) rolled up over at most ``points`` equal spans of time."""
    starts = groups(t, min(points, RANGE_POINTS_MAX))
    if starts.size == len(t):
        return t, columns
    return (reduce_groups(t, starts, "last"),
            {k: reduce_groups(v, starts, how.get(k, "mean"), n) for k, v in columns.items()})
