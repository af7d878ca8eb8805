"""The dashboard's series, persisted: fleet figures per tick and the gray entities' signals.

The runner keeps its last ticks in memory (coolant per loop, useful throughput, every
entity's signals in the signal ring); a restart loses them and a week does not fit. This
module is what the ledger keeps of them, bounded:

- **fleet**, one row per tick: GPUs and nodes per state, useful throughput with and
  without control, and per cooling loop its state and coolant flow, supply and return
  temperature — one float32 vector (`encode_fleet`), ``56 + 16 × loops`` bytes.
- **entities**, per tick only the entities worth looking back at (`watched`): not healthy
  or GFS at least `WATCH_GFS`, the `WATCH_MAX` highest GFS first; each with its GFS and
  every signal of its kind (float32).

Rows are rolled up as time passes (`LEVELS`): per tick for a day, per minute for 8 days
(the picker's 7 days), per 15 minutes for 35 days (a request spans at most 31); older rows
of each level are deleted. A rolled-up row keeps the worst of states and scores (max),
the last state counts (counts are levels, not rates) and the mean of everything else,
weighted by the ticks it holds. The same reductions thin a read to a bounded number of
points (`reduce_groups`). Pure functions over arrays; `SeriesWriter` is the one side
effect: a thread of its own with its own ledger connection, so the tick never waits on
a series write and a failed one is counted, logged and dropped.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from seamguard.assess.states import State

log = logging.getLogger("seamguard.ledger.series")

N_STATES = len(State)
FLEET_FIXED = 2 * N_STATES + 2  # gpu counts, node counts, useful with, useful without
COOLANT_FIELDS = 3  # flow litres/min, supply and return temperature celsius


@dataclass(frozen=True)
class Level:
    """Rows at one resolution: ``width_s`` 0 is one row per tick."""

    level: int
    width_s: float
    keep_s: float
    span_max_s: float  # the longest range read at this level (longer goes coarser)


DAY_S = 86400.0
LEVELS = (Level(0, 0.0, 1 * DAY_S, 6 * 3600.0),
          Level(1, 60.0, 8 * DAY_S, 8 * DAY_S),
          Level(2, 900.0, 35 * DAY_S, 35 * DAY_S))
WATCH_GFS = 0.2  # an entity at least this gray has its signals persisted (with the not healthy)
WATCH_MAX = 32  # entities persisted per tick, highest GFS first
TAIL_ROWS_MAX = 5000  # per-tick rows a read takes after a coarse level's last bucket
QUEUE_TICKS = 512  # ticks the writer holds before it drops (a stuck ledger)


@dataclass(frozen=True, eq=False)
class SeriesTick:
    """What the ledger keeps of one tick: the one record the runner hands the writer."""

    tick: int
    t_s: float
    wall_s: float
    fleet: np.ndarray  # float32, encode_fleet's layout
    entities: tuple[tuple[str, str, float, np.ndarray], ...] = ()  # (kind, name, gfs, signal values float32)


# ---- the fleet vector -------------------------------------------------------------------
def encode_fleet(gpu_counts, node_counts, useful_with: float | None, useful_without: float | None,
                 loop_state: np.ndarray, coolant: np.ndarray) -> np.ndarray:
    """[gpu counts, node counts, useful with, useful without, loop states, flow, supply, return]."""
    loops = int(np.asarray(loop_state).size)
    cool = np.asarray(coolant, dtype=np.float32).reshape(loops, COOLANT_FIELDS)
    head = [*gpu_counts, *node_counts, np.nan if useful_with is None else useful_with,
            np.nan if useful_without is None else useful_without]
    return np.concatenate([np.asarray(head, dtype=np.float32), np.asarray(loop_state, dtype=np.float32),
                           cool.T.reshape(-1)]).astype(np.float32)


def loops_of(width: int) -> int:
    return (width - FLEET_FIXED) // (1 + COOLANT_FIELDS)


def decode_fleet(rows: np.ndarray) -> dict[str, np.ndarray]:
    """Columns of fleet vectors [k, width]: gpu_counts/node_counts [k, states], useful_with/
    useful_without [k], loop_state [k, loops], coolant [k, loops, 3]."""
    rows = np.atleast_2d(np.asarray(rows, dtype=np.float64))
    k, loops = rows.shape[0], loops_of(rows.shape[1])
    s = N_STATES
    cool = rows[:, FLEET_FIXED + loops:].reshape(k, COOLANT_FIELDS, loops).transpose(0, 2, 1)
    return {"gpu_counts": rows[:, :s], "node_counts": rows[:, s:2 * s], "useful_with": rows[:, 2 * s],
            "useful_without": rows[:, 2 * s + 1], "loop_state": rows[:, FLEET_FIXED:FLEET_FIXED + loops],
            "coolant": cool}


def fleet_reductions(width: int) -> np.ndarray:
    """How each column of a fleet vector rolls up: 0 mean, 1 max (worst), 2 last."""
    how = np.zeros(width, dtype=np.int8)
    how[:2 * N_STATES] = 2
    how[FLEET_FIXED:FLEET_FIXED + loops_of(width)] = 1
    return how


# ---- reductions over groups of consecutive rows ---------------------------------------------------
def reduce_groups(x: np.ndarray, starts: np.ndarray, how: str, weights: np.ndarray | None = None) -> np.ndarray:
    """``x`` [k] or [k, m] reduced over the groups of consecutive rows beginning at ``starts``:
    ``mean`` (weighted, NaN skipped; all NaN stays NaN), ``max`` (NaN skipped) or ``last``."""
    x = np.asarray(x, dtype=np.float64)
    if len(starts) == 0:
        return x[:0]
    if how == "last":
        return x[np.append(starts[1:], len(x)) - 1]
    if how == "max":
        return np.fmax.reduceat(x, starts, axis=0)
    w = np.ones(len(x)) if weights is None else np.asarray(weights, dtype=np.float64)
    w = w.reshape(-1, *([1] * (x.ndim - 1)))
    ok = np.isfinite(x)
    total = np.add.reduceat(np.where(ok, x * w, 0.0), starts, axis=0)
    n = np.add.reduceat(np.where(ok, w, 0.0), starts, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / np.where(n > 0, n, 1.0), np.nan)


def reduce_fleet(rows: np.ndarray, starts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Fleet vectors [k, width] rolled up per group (`fleet_reductions`)."""
    rows = np.asarray(rows, dtype=np.float64)
    how = fleet_reductions(rows.shape[1])
    out = np.empty((len(starts), rows.shape[1]))
    for code, name in ((0, "mean"), (1, "max"), (2, "last")):
        cols = np.flatnonzero(how == code)
        if cols.size:
            out[:, cols] = reduce_groups(rows[:, cols], starts, name, weights)
    return out


def bucket_starts(t_s: np.ndarray, width_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each bucket, bucket start time) for rows sorted by time, buckets
    ``floor(t / width) * width``."""
    b = np.floor(np.asarray(t_s, dtype=np.float64) / width_s)
    starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]]) if b.size else np.empty(0, dtype=np.int64)
    return starts, b[starts] * width_s


# ---- which entities are kept ------------------------------------------------------------------
def watched(gfs: dict[str, np.ndarray], state: dict[str, np.ndarray], floor: float = WATCH_GFS,
            limit: int = WATCH_MAX) -> list[tuple[str, int]]:
    """(kind, index) of the entities not healthy or with GFS >= ``floor``, at most ``limit``,
    not healthy first, then by GFS, highest first (ties in kind and index order). A partition,
    then a sort of ``limit`` rows: a mass event at 100k GPUs costs the tick a few milliseconds."""
    kinds = list(gfs)
    g = [np.nan_to_num(np.asarray(gfs[k], dtype=np.float64)) for k in kinds]
    bad = [np.asarray(state[k]) != 0 for k in kinds]
    sel = [np.flatnonzero(b | (x >= floor)) for x, b in zip(g, bad)]
    if not sum(x.size for x in sel):
        return []
    kind_no = np.concatenate([np.full(x.size, j) for j, x in enumerate(sel)])
    idx = np.concatenate(sel)
    score = np.concatenate([x[i] for x, i in zip(g, sel)])
    sick = np.concatenate([b[i] for b, i in zip(bad, sel)])
    key = sick * 2.0 + np.clip(score, 0.0, 1.0)  # not healthy first, then GFS; candidates are in kind, index order
    if key.size > limit:
        kth = np.partition(key, key.size - limit)[key.size - limit]
        above = np.flatnonzero(key > kth)
        top = np.sort(np.r_[above, np.flatnonzero(key == kth)[:limit - above.size]])
    else:
        top = np.arange(key.size)
    order = top[np.argsort(-key[top], kind="stable")]
    return [(kinds[int(kind_no[t])], int(idx[t])) for t in order]


def pick_level(since_t_s: float, until_t_s: float, newest_t_s: float) -> Level:
    """The finest level whose rows reach back to ``since_t_s`` and whose span bound holds."""
    for lv in LEVELS:
        if until_t_s - since_t_s <= lv.span_max_s and since_t_s >= newest_t_s - lv.keep_s:
            return lv
    return LEVELS[-1]


# ---- the SQL (both backends: sqlite.py's _Reads and Ledger take these in) -------------------------
SERIES_SCHEMA = """
CREATE TABLE IF NOT EXISTS fleet_series (
  level INTEGER NOT NULL, t_s REAL NOT NULL, tick INTEGER, wall_time REAL, n INTEGER NOT NULL, vec BLOB NOT NULL,
  PRIMARY KEY (level, t_s));
CREATE TABLE IF NOT EXISTS entity_series (
  level INTEGER NOT NULL, kind TEXT NOT NULL, entity TEXT NOT NULL, t_s REAL NOT NULL, n INTEGER NOT NULL,
  gfs REAL, vec BLOB NOT NULL, PRIMARY KEY (kind, entity, level, t_s));
CREATE INDEX IF NOT EXISTS entity_series_level ON entity_series(level, t_s);
"""
SERIES_ROWS_MAX = 50_000  # rows one read of one level takes at most

_FLEET_UPSERT = ("INSERT INTO fleet_series(level, t_s, tick, wall_time, n, vec) VALUES(?,?,?,?,?,?) "
                 "ON CONFLICT(level, t_s) DO UPDATE SET tick=excluded.tick, wall_time=excluded.wall_time, "
                 "n=excluded.n, vec=excluded.vec")
_ENTITY_UPSERT = ("INSERT INTO entity_series(level, kind, entity, t_s, n, gfs, vec) VALUES(?,?,?,?,?,?,?) "
                  "ON CONFLICT(kind, entity, level, t_s) DO UPDATE SET n=excluded.n, gfs=excluded.gfs, "
                  "vec=excluded.vec")


def _vecs(blobs: list) -> tuple[np.ndarray, np.ndarray]:
    """(rows kept, matrix) of float32 blobs: only those as wide as the newest (the current fleet's
    loops or the kind's signals; rows from before a change of either are left out)."""
    if not blobs:
        return np.empty(0, dtype=np.int64), np.empty((0, 0))
    width = len(blobs[-1])
    keep = np.array([len(b) == width for b in blobs])
    mat = np.frombuffer(b"".join(bytes(b) for b, k in zip(blobs, keep) if k), dtype=np.float32)
    return np.flatnonzero(keep), mat.reshape(int(keep.sum()), width // 4).astype(np.float64)


class SeriesReads:
    """The persisted series, read over a range (mixed into sqlite.py's `_Reads`)."""

    def _read_db(self) -> Any:
        raise NotImplementedError

    def _walk(self, select: str, args: list, since_t_s: float, until_t_s: float,
              newest_t_s: float) -> tuple[Level, list[tuple]]:
        """Rows in [since, until] from the finest level that reaches back to ``since``, then,
        after its last bucket, from each finer level in turn (the newest buckets are rolled
        up only when they close)."""
        top = pick_level(since_t_s, until_t_s, newest_t_s)
        rows: list[tuple] = []
        cursor = since_t_s
        for lv in reversed(LEVELS[:top.level + 1]):
            got = list(self._read_db().execute(
                f"{select} AND level = ? AND t_s >= ? AND t_s <= ? ORDER BY t_s LIMIT ?",
                [*args, lv.level, cursor, until_t_s, SERIES_ROWS_MAX]))
            if got:
                rows += got
                cursor = float(got[-1][0]) + (lv.width_s or 1e-6)
            if cursor > until_t_s:
                break
        return top, rows

    def fleet_series(self, since_t_s: float, until_t_s: float, newest_t_s: float) -> dict[str, Any]:
        """Fleet vectors in [since, until], oldest first: ``level`` (the `Level` read), ``t_s``,
        ``wall_s``, ``n`` (ticks per row) and ``rows`` [k, width] (`decode_fleet`)."""
        lv, rows = self._walk("SELECT t_s, wall_time, n, vec FROM fleet_series WHERE 1=1", [],
                              since_t_s, until_t_s, newest_t_s)
        keep, mat = _vecs([r[3] for r in rows])
        rows = [rows[i] for i in keep]
        return {"level": lv, "t_s": np.array([r[0] for r in rows], dtype=np.float64),
                "wall_s": np.array([np.nan if r[1] is None else r[1] for r in rows], dtype=np.float64),
                "n": np.array([r[2] for r in rows], dtype=np.float64), "rows": mat}

    def entity_series(self, kind: str, entity: str, since_t_s: float, until_t_s: float,
                      newest_t_s: float) -> dict[str, Any]:
        """One entity's persisted GFS and signals in [since, until], oldest first: ``level``,
        ``t_s``, ``n``, ``gfs`` [k] and ``values`` [k, signals of its kind]."""
        lv, rows = self._walk("SELECT t_s, n, gfs, vec FROM entity_series WHERE kind = ? AND entity = ?",
                              [kind, entity], since_t_s, until_t_s, newest_t_s)
        keep, mat = _vecs([r[3] for r in rows])
        rows = [rows[i] for i in keep]
        return {"level": lv, "t_s": np.array([r[0] for r in rows], dtype=np.float64),
                "n": np.array([r[1] for r in rows], dtype=np.float64),
                "gfs": np.array([np.nan if r[2] is None else r[2] for r in rows], dtype=np.float64),
                "values": mat}


class SeriesWrites:
    """Writing and rolling up the series (mixed into sqlite.py's `Ledger`; the writer thread's
    connection calls `record_series`)."""

    db: Any
    _rolled: dict[int, float]

    def _txn(self) -> Any:
        raise NotImplementedError

    def record_series(self, st: SeriesTick) -> None:
        """One tick's rows, and every bucket that closed before it rolled up (one transaction)."""
        with self._txn():
            self.db.execute(_FLEET_UPSERT, (0, st.t_s, st.tick, st.wall_s, 1, st.fleet.astype(np.float32).tobytes()))
            if st.entities:
                self.db.executemany(_ENTITY_UPSERT, [(0, k, e, st.t_s, 1, float(g), v.astype(np.float32).tobytes())
                                                     for k, e, g, v in st.entities])
            if self._roll_series(st.t_s):
                self._prune_series(st.t_s)

    def _roll_series(self, t_s: float) -> bool:
        """Roll up, level by level, the buckets that closed before ``t_s``; True when any did."""
        rolled = False
        for src, lv in zip(LEVELS, LEVELS[1:]):
            cur = np.floor(t_s / lv.width_s) * lv.width_s
            last = self._rolled.get(lv.level)
            if last is None:
                row = self.db.execute("SELECT MAX(t_s) FROM fleet_series WHERE level = ?", (lv.level,)).fetchone()
                last = -np.inf if row is None or row[0] is None else float(row[0])
            lo = last + lv.width_s
            if lo >= cur:
                continue
            self._roll_fleet(src, lv, lo, cur)
            self._roll_entities(src, lv, lo, cur)
            self._rolled[lv.level] = cur - lv.width_s
            rolled = True
        return rolled

    def _roll_fleet(self, src: Level, lv: Level, lo: float, hi: float) -> None:
        rows = self.db.execute("SELECT t_s, tick, wall_time, n, vec FROM fleet_series WHERE level = ? AND t_s >= ? "
                               "AND t_s < ? ORDER BY t_s", (src.level, max(lo, -1e18), hi)).fetchall()
        keep, mat = _vecs([r[4] for r in rows])
        if not keep.size:
            return
        rows = [rows[i] for i in keep]
        t = np.array([r[0] for r in rows])
        n = np.array([r[3] for r in rows], dtype=np.float64)
        starts, b0 = bucket_starts(t, lv.width_s)
        ends = np.append(starts[1:], len(rows)) - 1
        out = reduce_fleet(mat, starts, n).astype(np.float32)
        sums = np.add.reduceat(n, starts)
        self.db.executemany(_FLEET_UPSERT, [(lv.level, float(b0[j]), rows[ends[j]][1], rows[ends[j]][2],
                                             int(sums[j]), out[j].tobytes()) for j in range(len(starts))])

    def _roll_entities(self, src: Level, lv: Level, lo: float, hi: float) -> None:
        rows = self.db.execute("SELECT kind, entity, t_s, n, gfs, vec FROM entity_series WHERE level = ? "
                               "AND t_s >= ? AND t_s < ? ORDER BY kind, entity, t_s",
                               (src.level, max(lo, -1e18), hi)).fetchall()
        out: list[tuple] = []
        i = 0
        while i < len(rows):
            j = i
            while j < len(rows) and rows[j][:2] == rows[i][:2]:
                j += 1
            out += _rolled_entity(lv, rows[i:j])
            i = j
        if out:
            self.db.executemany(_ENTITY_UPSERT, out)

    def _prune_series(self, t_s: float) -> None:
        for lv in LEVELS:
            for table in ("fleet_series", "entity_series"):
                self.db.execute(f"DELETE FROM {table} WHERE level = ? AND t_s < ?", (lv.level, t_s - lv.keep_s))


def _rolled_entity(lv: Level, rows: list[tuple]) -> list[tuple]:
    """One entity's rows (kind, entity, t_s, n, gfs, vec), oldest first, rolled up into ``lv``."""
    keep, mat = _vecs([r[5] for r in rows])
    if not keep.size:
        return []
    rows = [rows[i] for i in keep]
    n = np.array([r[3] for r in rows], dtype=np.float64)
    starts, b0 = bucket_starts(np.array([r[2] for r in rows]), lv.width_s)
    gfs = reduce_groups(np.array([np.nan if r[4] is None else r[4] for r in rows]), starts, "max")
    vals = reduce_groups(mat, starts, "mean", n).astype(np.float32)
    sums = np.add.reduceat(n, starts)
    kind, entity = rows[0][0], rows[0][1]
    return [(lv.level, kind, entity, float(b0[j]), int(sums[j]), None if np.isnan(gfs[j]) else float(gfs[j]),
             vals[j].tobytes()) for j in range(len(starts))]


# ---- the writer thread ----------------------------------------------------------------------------
class SeriesWriter:
    """Persists `SeriesTick`s off the tick path, on a connection of its own.

    `put` never waits: with ``QUEUE_TICKS`` ticks queued (a stuck or slow ledger) the tick is
    dropped and counted. A write that fails is counted and logged (the first, then every
    100th) and the writer goes on with the next tick.
    """

    def __init__(self, open_writer: Callable[[], Any], queue_ticks: int = QUEUE_TICKS) -> None:
        self._open = open_writer
        self._q: queue.Queue[SeriesTick | None] = queue.Queue(maxsize=queue_ticks)
        self.written = 0
        self.dropped = 0
        self.failed = 0
        self.last_error = ""
        self._thread = threading.Thread(target=self._run, name="seamguard-series", daemon=True)
        self._thread.start()

    def put(self, tick: SeriesTick) -> bool:
        try:
            self._q.put_nowait(tick)
            return True
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 100 == 0:
                log.error("series writer: %d tick(s) dropped, the ledger is not keeping up", self.dropped)
            return False

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait (at most ``timeout_s``) until every queued tick is written or has failed."""
        done = threading.Event()
        waiter = threading.Thread(target=lambda: (self._q.join(), done.set()), daemon=True)
        waiter.start()
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued (bounded by ``timeout_s``), then stop."""
        try:
            self._q.put(None, timeout=timeout_s)
        except queue.Full:
            log.error("series writer: %d tick(s) not written at close", self._q.qsize())
            return
        self._thread.join(timeout_s)

    def _run(self) -> None:
        ledger = None
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                if ledger is None:
                    ledger = self._open()
                ledger.record_series(item)
                self.written += 1
            except Exception as e:  # counted and logged; the next tick is written anew
                self.failed += 1
                self.last_error = f"{type(e).__name__}: {e}"
                if self.failed == 1 or self.failed % 100 == 0:
                    log.error("series writer: %d write(s) failed, last: %s", self.failed, self.last_error)
                if ledger is not None and not _usable(ledger):
                    ledger = None  # reopened with the next tick
            finally:
                self._q.task_done()
                if item is None and ledger is not None:
                    ledger.close()


def _usable(ledger: Any) -> bool:
    try:
        ledger.db.execute("SELECT 1").fetchone()
        return True
    except Exception:
        try:
            ledger.close()
        except Exception:
            pass
        return False
