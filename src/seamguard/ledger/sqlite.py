"""The durable record: SQLite in WAL mode.

Transitions with their evidence, decisions with their reasons, actions with their
results, operator pins (the ones in force, and every pin and unpin as an event), and the
controller's own state (assessment state vectors, breaker, exposure episodes) so a
controller killed mid-tick resumes without repeating or losing actions or pins.

`Ledger` is the one writer (the controller's connection). `LedgerReader` opens the same
file read-only, one connection per thread, so an API thread can query while the
controller writes (WAL lets readers run beside the writer). Both read through the same
queries (`_Reads`): the SQL that reads the record lives in this module, and, for the
dashboard's persisted series (fleet figures per tick, the gray entities' signals), in
ledger/series.py, whose tables and queries both classes take in.
"""

from __future__ import annotations

import io
import json
import math
import sqlite3
import threading
import time
from collections.abc import Iterator
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seamguard.decide.actions import ActionKey
from seamguard.ledger.series import SERIES_SCHEMA, SeriesReads, SeriesWrites

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ticks (
  tick INTEGER PRIMARY KEY, t_s REAL NOT NULL, wall_started REAL, wall_finished REAL,
  tick_s REAL, mode TEXT, flags TEXT);
CREATE TABLE IF NOT EXISTS transitions (
  id INTEGER PRIMARY KEY, tick INTEGER, t_s REAL, kind TEXT, entity TEXT,
  from_state TEXT, to_state TEXT, gfs REAL, prs REAL, fae REAL, reasons TEXT);
CREATE INDEX IF NOT EXISTS transitions_entity ON transitions(entity, t_s);
CREATE TABLE IF NOT EXISTS decisions (
  id INTEGER PRIMARY KEY, tick INTEGER, t_s REAL, key TEXT, event TEXT, verb TEXT, target TEXT,
  reason TEXT, cause TEXT, evidence TEXT, benefit REAL, cost REAL, criticality REAL);
CREATE INDEX IF NOT EXISTS decisions_key ON decisions(key);
CREATE TABLE IF NOT EXISTS desired (key TEXT PRIMARY KEY, since_tick INTEGER, action TEXT);
CREATE TABLE IF NOT EXISTS held (key TEXT PRIMARY KEY, since_tick INTEGER, action TEXT);
CREATE TABLE IF NOT EXISTS actions (
  id INTEGER PRIMARY KEY, tick INTEGER, t_s REAL, op TEXT, key TEXT, verb TEXT, actuator TEXT,
  status TEXT, detail TEXT, wall_time REAL);
CREATE INDEX IF NOT EXISTS actions_key ON actions(key, op);
CREATE TABLE IF NOT EXISTS snapshot (id INTEGER PRIMARY KEY CHECK (id = 1), tick INTEGER, blob BLOB);
CREATE TABLE IF NOT EXISTS pins (
  kind TEXT NOT NULL, name TEXT NOT NULL, state TEXT NOT NULL, note TEXT NOT NULL, pinned_by TEXT NOT NULL,
  created_wall REAL NOT NULL, tick INTEGER NOT NULL, PRIMARY KEY (kind, name));
CREATE TABLE IF NOT EXISTS pin_events (
  id INTEGER PRIMARY KEY, tick INTEGER, wall_time REAL, event TEXT, kind TEXT, name TEXT, state TEXT,
  note TEXT, actor TEXT, detail TEXT);
CREATE INDEX IF NOT EXISTS pin_events_entity ON pin_events(name, kind);
CREATE TABLE IF NOT EXISTS failsafe_events (
  id INTEGER PRIMARY KEY, tick INTEGER, t_s REAL, wall_time REAL, event TEXT, scope TEXT, detail TEXT,
  actor TEXT);
CREATE TABLE IF NOT EXISTS fence (id INTEGER PRIMARY KEY CHECK (id = 1), token INTEGER NOT NULL, holder TEXT,
  wall_time REAL);
CREATE TABLE IF NOT EXISTS leader_events (
  id INTEGER PRIMARY KEY, token INTEGER, holder TEXT, wall_time REAL, event TEXT);
""" + SERIES_SCHEMA

# The leader's fencing token on every tick and action it recorded (NULL: unfenced, one controller).
# Added by ALTER TABLE, so a ledger written before fencing existed opens unchanged.
FENCE_COLUMNS = (("actions", "fence"), ("ticks", "fence"))

# frozen / resumed: a scope's input failed / came back and re-warmed; breaker_tripped;
# breaker_reset (who and why); breaker_disabled (a policy switched it off, at start).
FAILSAFE_EVENTS = ("frozen", "resumed", "breaker_tripped", "breaker_reset", "breaker_disabled")

PIN_EVENTS = ("pinned", "unpinned", "not_restored")


def _action_json(a) -> str:
    return json.dumps({"key": a.key, "verb": a.verb.value, "target": a.target, "target_kind": a.target_kind,
                       "params": dict(a.params), "reason": a.reason, "cause": a.cause,
                       "benefit": a.benefit_gpu_h_per_h, "cost": a.cost_gpu_h_per_h})


def _num(v: object) -> float | None:
    """A finite float, or None (JSON has no NaN or infinity)."""
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _reasons(blob: str | None) -> list[dict]:
    return [{"channel": c, "score": s, "value": _num(v), "unit": u} for c, s, v, u in json.loads(blob or "[]")]


def _paged(select: str, order: str, limit: int, offset: int,
           *conditions: tuple[str, list] | None) -> tuple[str, list]:
    """``select ... WHERE 1`` with every given (clause, parameters) ANDed on, newest first."""
    args: list = []
    for cond in filter(None, conditions):
        select += f" AND {cond[0]}"
        args += cond[1]
    return f"{select} ORDER BY {order} DESC LIMIT ? OFFSET ?", args + [limit, offset]


def _between(column: str, since: float | None, until: float | None) -> tuple[tuple[str, list] | None, ...]:
    """Conditions keeping rows whose ``column`` lies in [since, until] (either end open when None)."""
    return ((f"{column} >= ?", [since]) if since is not None else None,
            (f"{column} <= ?", [until]) if until is not None else None)


class _Reads(SeriesReads):
    """The queries over the record, shared by the writer (`Ledger`) and `LedgerReader`.

    Every list is newest first and paged (``limit``/``offset``); ``upto_tick`` bounds it
    by tick (the service passes its snapshot's tick, so a response never shows a decision
    newer than the states it is shown with). Rows are plain dicts shaped like the API's.
    """

    def _read_db(self) -> sqlite3.Connection:
        raise NotImplementedError

    def transitions(self, *, upto_tick: int | None = None, entity: str | None = None, kind: str | None = None,
                    non_healthy_only: bool = False, limit: int = 1000, offset: int = 0,
                    since_t_s: float | None = None, until_t_s: float | None = None) -> list[dict]:
        q, args = _paged(
            "SELECT tick, t_s, kind, entity, from_state, to_state, gfs, prs, fae, reasons FROM transitions WHERE 1=1",
            "id", limit, offset,
            ("tick <= ?", [upto_tick]) if upto_tick is not None else None,
            ("entity = ?", [entity]) if entity is not None else None,
            ("kind = ?", [kind]) if kind is not None else None,
            ("(to_state != 'healthy' OR from_state != 'healthy')", []) if non_healthy_only else None,
            *_between("t_s", since_t_s, until_t_s))
        return [{"tick": r[0], "t_s": r[1], "kind": r[2], "entity": r[3], "from_state": r[4], "to_state": r[5],
                 "gfs": r[6], "prs": r[7], "fae": r[8], "reasons": _reasons(r[9])}
                for r in self._read_db().execute(q, args)]

    def decisions(self, *, upto_tick: int | None = None, entity: str | None = None, event: str | None = None,
                  limit: int = 1000, offset: int = 0, since_t_s: float | None = None,
                  until_t_s: float | None = None) -> list[dict]:
        """``entity`` matches the decision's target or its cause."""
        q, args = _paged(
            "SELECT tick, t_s, key, event, verb, target, reason, cause, evidence, benefit, cost, criticality "
            "FROM decisions WHERE 1=1", "id", limit, offset,
            ("tick <= ?", [upto_tick]) if upto_tick is not None else None,
            ("(target = ? OR cause = ?)", [entity, entity]) if entity is not None else None,
            ("event = ?", [event]) if event is not None else None,
            *_between("t_s", since_t_s, until_t_s))
        return [{"tick": r[0], "t_s": r[1], "key": r[2], "event": r[3], "verb": r[4], "target": r[5],
                 "reason": r[6] or "", "cause": r[7] or "", "evidence": _reasons(r[8]),
                 "benefit_gpu_h_per_h": r[9], "cost_gpu_h_per_h": r[10], "criticality": r[11]}
                for r in self._read_db().execute(q, args)]

    def actions(self, *, upto_tick: int | None = None, entity: str | None = None, status: str | None = None,
                limit: int = 1000, offset: int = 0, since_t_s: float | None = None,
                until_t_s: float | None = None) -> list[dict]:
        """Actions joined with the target, reason and cause of the decision that asked for them;
        ``entity`` matches that target or cause."""
        q, args = _paged(
            "SELECT a.tick, a.t_s, a.op, a.key, a.verb, a.actuator, a.status, a.detail, d.target, d.reason, d.cause "
            "FROM actions a LEFT JOIN decisions d ON d.id = (SELECT MAX(id) FROM decisions "
            "WHERE key = a.key AND event = 'decided') WHERE 1=1", "a.id", limit, offset,
            ("a.tick <= ?", [upto_tick]) if upto_tick is not None else None,
            ("(d.target = ? OR d.cause = ?)", [entity, entity]) if entity is not None else None,
            ("a.status = ?", [status]) if status is not None else None,
            *_between("a.t_s", since_t_s, until_t_s))
        return [{"tick": r[0], "t_s": r[1], "op": r[2], "key": r[3], "verb": r[4], "actuator": r[5],
                 "status": r[6], "detail": r[7] or "",
                 "target": r[8] or ActionKey.parse(r[3]).entity,
                 "reason": r[9] or "", "cause": r[10] or ""}
                for r in self._read_db().execute(q, args)]

    def transition_counts(self, kind: str, *, since_t_s: float, upto_tick: int | None = None,
                          limit: int = 100_000) -> list[dict]:
        """How many entities of ``kind`` moved between each pair of states at each tick after
        ``since_t_s``, newest first: enough to replay state counts back from the present
        (the dashboard's fleet-state history over days, longer than any in-memory series)."""
        upto = "AND tick <= ? " if upto_tick is not None else ""
        q = ("SELECT tick, MAX(t_s), from_state, to_state, COUNT(*) FROM transitions WHERE kind = ? AND t_s > ? "
             f"{upto}GROUP BY tick, from_state, to_state ORDER BY tick DESC LIMIT ?")
        args = [kind, since_t_s, *([upto_tick] if upto_tick is not None else []), limit]
        return [{"tick": r[0], "t_s": r[1], "from_state": r[2], "to_state": r[3], "n": r[4]}
                for r in self._read_db().execute(q, args)]

    def first_tick_t_s(self) -> float | None:
        """Controller time of the first tick recorded (None before any): where history begins."""
        row = self._read_db().execute("SELECT MIN(t_s) FROM ticks").fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def pins(self) -> list[dict]:
        """The pins in force (as last recorded), oldest first."""
        return [{"kind": r[0], "name": r[1], "state": r[2], "note": r[3], "by": r[4], "created_wall_s": r[5],
                 "tick": r[6]}
                for r in self._read_db().execute(
                    "SELECT kind, name, state, note, pinned_by, created_wall, tick FROM pins "
                    "ORDER BY created_wall, kind, name")]

    def pin_events(self, *, upto_tick: int | None = None, kind: str | None = None, entity: str | None = None,
                   limit: int = 1000, offset: int = 0) -> list[dict]:
        """Every pin, unpin and pin not restored at a start (``event``), newest first."""
        q, args = _paged(
            "SELECT tick, wall_time, event, kind, name, state, note, actor, detail FROM pin_events WHERE 1=1",
            "id", limit, offset,
            ("tick <= ?", [upto_tick]) if upto_tick is not None else None,
            ("kind = ?", [kind]) if kind is not None else None,
            ("name = ?", [entity]) if entity is not None else None)
        return [{"tick": r[0], "wall_s": r[1], "event": r[2], "kind": r[3], "entity": r[4], "state": r[5],
                 "note": r[6] or "", "by": r[7] or "", "detail": r[8] or ""}
                for r in self._read_db().execute(q, args)]

    def failsafe_events(self, *, upto_tick: int | None = None, event: str | None = None,
                        limit: int = 1000, offset: int = 0) -> list[dict]:
        """Freezes and thaws of scopes whose input failed, breaker trips and resets (who, why)."""
        q, args = _paged("SELECT tick, t_s, wall_time, event, scope, detail, actor FROM failsafe_events WHERE 1=1",
                         "id", limit, offset,
                         ("tick <= ?", [upto_tick]) if upto_tick is not None else None,
                         ("event = ?", [event]) if event is not None else None)
        return [{"tick": r[0], "t_s": r[1], "wall_s": r[2], "event": r[3], "scope": r[4] or "",
                 "detail": r[5] or "", "by": r[6] or ""} for r in self._read_db().execute(q, args)]


class LedgerError(RuntimeError):
    """The ledger file cannot be opened as a seamguard ledger; the message names the file."""


class Fenced(RuntimeError):
    """A write refused because this writer's fencing token is no longer the newest: another
    leader has taken the ledger over, or this one's lease deadline has passed. Nothing of the
    refused write was recorded, and the action it preceded must not be taken."""


@dataclass(frozen=True)
class Fence:
    """The leader's fencing token (its etcd key's revision) and the check of its own lease
    deadline (`leader.Term.may_act`): every write by a fenced ledger checks both, in the
    write's own transaction."""

    token: int
    holder: str
    may_act: Callable[[], bool]


def _never() -> bool:
    return False


class Ledger(SeriesWrites, _Reads):
    """The writer: the controller's connection. Reads (`_Reads`) go through the same connection.

    Unfenced (the default, one controller) every write is its own statement. Fenced
    (`take_fence`, a leader of an HA pair) every write is a transaction that first checks
    the writer's lease deadline and that no newer token has taken the ledger over; a write
    that fails either raises `Fenced` and records nothing.
    """

    BEGIN = "BEGIN IMMEDIATE"  # SQLite: take the write lock at BEGIN, so the fence check holds to COMMIT

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.fence: Fence | None = None
        self._depth = 0
        self._rolled: dict[int, float] = {}  # series level -> start of the newest bucket rolled up
        self.db = self._connect()

    def _connect(self) -> Any:
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as e:
            raise LedgerError(f"{self.path}: cannot open the ledger: {getattr(e, 'strerror', None) or e}") from None
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(SCHEMA)
            for table, column in FENCE_COLUMNS:  # ledgers written before fencing existed
                if column not in {r[1] for r in db.execute(f"PRAGMA table_info({table})")}:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} INTEGER")
        except sqlite3.Error as e:  # garbage, another program's database, a directory
            db.close()
            raise LedgerError(f"{self.path}: not a usable seamguard ledger (SQLite: {e})") from None
        return db

    @property
    def where(self) -> str:
        """The ledger's location for messages (a PostgreSQL ledger hides its password)."""
        return self.path

    def close(self) -> None:
        self.db.close()

    def _read_db(self) -> Any:
        return self.db

    @contextmanager
    def _txn(self) -> Iterator[None]:
        if self._depth:  # already inside one: it commits with the outermost
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self.db.execute(self.BEGIN)
        self._depth = 1
        try:
            if self.fence is not None:
                self._check_fence(self.fence)
            yield
        except BaseException:
            self._depth = 0
            self.db.execute("ROLLBACK")
            raise
        self._depth = 0
        self.db.execute("COMMIT")
        fence = self.fence
        if fence is not None and not fence.may_act():
            # Recorded, but the deadline passed while it committed (a slow ledger): what the
            # write preceded must not happen now. A pending action row stays pending; the next
            # leader settles it from what the actuators hold, as after any restart.
            raise Fenced(f"{self.where}: {fence.holder}'s lease deadline (token {fence.token}) passed while "
                         "the write committed")

    @contextmanager
    def _write(self) -> Iterator[None]:
        """One write: a statement of its own when unfenced, a fenced transaction otherwise."""
        if self.fence is None and not self._depth:
            yield
            return
        with self._txn():
            yield

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One atomic write: everything inside commits together or not at all (the
        controller commits the decisions it admitted and the breaker's state this way,
        before it calls any actuator)."""
        with self._txn():
            yield

    # ---- fencing (HA: app/leader.py) ------------------------------------------------------
    FENCE_READ = "SELECT token, holder FROM fence WHERE id = 1"

    def _check_fence(self, fence: Fence) -> None:
        if not fence.may_act():
            raise Fenced(f"{self.where}: {fence.holder}'s lease deadline (token {fence.token}) has passed: "
                         "write refused")
        row = self.db.execute(self.FENCE_READ).fetchone()
        if row is None or int(row[0]) != fence.token:
            newest = f"token {row[0]} of {row[1]}" if row else "no token"
            raise Fenced(f"{self.where}: {fence.holder}'s token {fence.token} is not the newest ({newest}): "
                         "write refused")

    def take_fence(self, fence: Fence) -> None:
        """A new leader takes the ledger over with its token: refused (`Fenced`) when a newer
        token already holds it; from now on every write of this connection is fenced."""
        self.fence = None
        try:
            self._take_fence(fence)
        except BaseException:
            self.drop_fence()  # refused (or failed): this connection writes nothing until taken again
            raise
        self.fence = fence

    def _take_fence(self, fence: Fence) -> None:
        with self._txn():
            self.db.execute(
                "INSERT INTO fence(id, token, holder, wall_time) VALUES(1, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET token=excluded.token, holder=excluded.holder, "
                "wall_time=excluded.wall_time WHERE fence.token <= excluded.token",
                (fence.token, fence.holder, time.time()))
            row = self.db.execute(self.FENCE_READ).fetchone()
            if int(row[0]) != fence.token:
                raise Fenced(f"{self.where}: {fence.holder}'s token {fence.token} is older than the newest "
                             f"(token {row[0]} of {row[1]}): not taken over")
            self.db.execute("INSERT INTO leader_events(token, holder, wall_time, event) VALUES(?,?,?,'took')",
                            (fence.token, fence.holder, time.time()))

    def drop_fence(self, holder: str = "follower") -> None:
        """Stepped down: this connection writes nothing more until it takes the ledger again."""
        self.fence = Fence(-1, self.fence.holder if self.fence else holder, _never)

    def fence_token(self) -> int | None:
        """The newest token that took the ledger over (None: never fenced)."""
        row = self.db.execute(self.FENCE_READ).fetchone()
        return int(row[0]) if row else None

    def leader_events(self) -> list[dict]:
        """Every takeover of the ledger, oldest first."""
        return [{"token": r[0], "holder": r[1], "wall_s": r[2], "event": r[3]} for r in self.db.execute(
            "SELECT token, holder, wall_time, event FROM leader_events ORDER BY id")]

    def record_failsafe_event(self, tick: int, t_s: float, event: str, scope: str, detail: str,
                              actor: str = "") -> None:
        assert event in FAILSAFE_EVENTS, event
        with self._write():
            self.db.execute("INSERT INTO failsafe_events(tick, t_s, wall_time, event, scope, detail, actor) "
                            "VALUES(?,?,?,?,?,?,?)", (tick, t_s, time.time(), event, scope, detail, actor))

    # ---- meta / controller state ------------------------------------------------
    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def set_meta(self, key: str, value: Any) -> None:
        with self._write():
            self.db.execute("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                            (key, json.dumps(value)))

    def last_tick(self) -> int:
        row = self.db.execute("SELECT MAX(tick) FROM ticks WHERE wall_finished IS NOT NULL").fetchone()
        return int(row[0]) if row and row[0] is not None else -1

    def save_snapshot(self, tick: int, arrays: dict[str, np.ndarray]) -> None:
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        with self._write():
            self.db.execute("INSERT INTO snapshot(id, tick, blob) VALUES(1, ?, ?) "
                            "ON CONFLICT(id) DO UPDATE SET tick=excluded.tick, blob=excluded.blob",
                            (tick, buf.getvalue()))

    def load_snapshot(self) -> tuple[int, dict[str, np.ndarray]] | None:
        row = self.db.execute("SELECT tick, blob FROM snapshot WHERE id=1").fetchone()
        if not row:
            return None
        with np.load(io.BytesIO(bytes(row[1]))) as z:
            return int(row[0]), {k: z[k] for k in z.files}

    # ---- one tick -----------------------------------------------------------------
    def begin_tick(self, tick: int, t_s: float, mode: str, flags: tuple[str, ...]) -> None:
        with self._write():
            self.db.execute(
                "INSERT INTO ticks(tick, t_s, wall_started, mode, flags, fence) VALUES(?,?,?,?,?,?) "
                "ON CONFLICT(tick) DO UPDATE SET t_s=excluded.t_s, wall_started=excluded.wall_started, "
                "wall_finished=NULL, tick_s=NULL, mode=excluded.mode, flags=excluded.flags, fence=excluded.fence",
                (tick, t_s, time.time(), mode, json.dumps(list(flags)), self._token()))

    def finish_tick(self, tick: int, tick_s: float) -> None:
        with self._write():
            self.db.execute("UPDATE ticks SET wall_finished=?, tick_s=? WHERE tick=?", (time.time(), tick_s, tick))

    def _token(self) -> int | None:
        return self.fence.token if self.fence is not None else None

    def record_transitions(self, tick: int, transitions) -> None:
        if not transitions:
            return
        with self._write():
            self.db.executemany(
                "INSERT INTO transitions(tick, t_s, kind, entity, from_state, to_state, gfs, prs, fae, reasons) "
                "VALUES(?,?,?,?,?,?,?,?,?,?)",
                [(tick, tr.t_s, tr.kind.label, tr.entity, tr.from_state.label, tr.to_state.label, tr.gfs, tr.prs,
                  tr.fae, json.dumps([[r.channel, r.score, r.value, r.unit] for r in tr.reasons]))
                 for tr in transitions])

    def record_decisions(self, tick: int, t_s: float, desired: dict, held: list) -> list[tuple[str, str]]:
        """Record what changed, not what stands: returns the (event, key) pairs recorded.

        ``decided`` when a key enters the desired state, ``withdrawn`` when it leaves;
        ``held_by_breaker`` when a key becomes held, nothing while it stays held, and when it
        stops being held either ``decided`` (admitted) or ``withdrawn`` (no longer wanted, its
        reason says it was held and never admitted).
        """
        with self._write():
            return self._record_decisions(tick, t_s, desired, held)

    def _record_decisions(self, tick: int, t_s: float, desired: dict, held: list) -> list[tuple[str, str]]:
        before = {k for (k,) in self.db.execute("SELECT key FROM desired")}
        held_before = {k: (since, action) for k, since, action in self.db.execute(
            "SELECT key, since_tick, action FROM held")}
        held_now = {a.key: a for a in held}
        events: list[tuple[str, str]] = []
        rows = []
        for k, a in desired.items():
            if k not in before:
                events.append(("decided", k))
                rows.append((tick, t_s, k, "decided", a.verb.value, a.target, a.reason, a.cause,
                             json.dumps(a.evidence), a.benefit_gpu_h_per_h, a.cost_gpu_h_per_h, a.criticality))
                self.db.execute("INSERT INTO desired(key, since_tick, action) VALUES(?,?,?)", (k, tick, _action_json(a)))
        for k in before - set(desired):
            events.append(("withdrawn", k))
            ak = ActionKey.parse(k)
            rows.append((tick, t_s, k, "withdrawn", ak.verb.value, ak.entity,
                         "no longer desired", "", "[]", 0.0, 0.0, 0.0))
            self.db.execute("DELETE FROM desired WHERE key=?", (k,))
        for k, a in held_now.items():
            if k not in held_before:
                events.append(("held_by_breaker", k))
                rows.append((tick, t_s, k, "held_by_breaker", a.verb.value, a.target, a.reason, a.cause,
                             json.dumps(a.evidence), a.benefit_gpu_h_per_h, a.cost_gpu_h_per_h, a.criticality))
                self.db.execute("INSERT INTO held(key, since_tick, action) VALUES(?,?,?)", (k, tick, _action_json(a)))
        for k, (since, blob) in held_before.items():
            if k in held_now:
                continue
            self.db.execute("DELETE FROM held WHERE key=?", (k,))
            if k in desired:
                continue  # admitted: its ``decided`` row (above, or from before it was held) says so
            events.append(("withdrawn", k))
            ak = ActionKey.parse(k)
            target = cause = ak.entity
            try:
                was = json.loads(blob or "{}")
                target, cause = was.get("target") or target, was.get("cause") or cause
            except json.JSONDecodeError:
                pass
            rows.append((tick, t_s, k, "withdrawn", ak.verb.value, target,
                         f"no longer desired (held by the breaker since tick {since}, never admitted)", cause,
                         "[]", 0.0, 0.0, 0.0))
        if rows:
            self.db.executemany(
                "INSERT INTO decisions(tick, t_s, key, event, verb, target, reason, cause, evidence, benefit, cost, "
                "criticality) VALUES(?,?,?,?,?,?,?,?,?,?,?,?)", rows)
        return events

    def begin_action(self, tick: int, t_s: float, op: str, key: str, verb: str, actuator: str) -> None:
        """The action as pending, with the writer's fencing token, committed before the actuator
        is called. Fenced, a deposed leader's call raises `Fenced` here: it never reaches the
        actuator (act/reconcile.py calls the actuator only after this returns)."""
        with self._write():
            self.db.execute("INSERT INTO actions(tick, t_s, op, key, verb, actuator, status, wall_time, fence) "
                            "VALUES(?,?,?,?,?,?, 'pending', ?, ?)",
                            (tick, t_s, op, key, verb, actuator, time.time(), self._token()))

    def finish_action(self, key: str, op: str, status: str, detail: str) -> None:
        with self._write():
            self.db.execute("UPDATE actions SET status=?, detail=? WHERE id = (SELECT MAX(id) FROM actions "
                            "WHERE key=? AND op=? AND status='pending')", (status, detail, key, op))

    def record_dry_run(self, tick: int, t_s: float, op: str, key: str, verb: str, actuator: str) -> None:
        with self._write():
            self.db.execute("INSERT INTO actions(tick, t_s, op, key, verb, actuator, status, detail, wall_time, "
                            "fence) VALUES(?,?,?,?,?,?, 'dry_run', 'not applied', ?, ?)",
                            (tick, t_s, op, key, verb, actuator, time.time(), self._token()))

    def done_keys(self) -> set[str]:
        return {k for (k,) in self.db.execute("SELECT DISTINCT key FROM actions WHERE op='apply' AND status='done'")}

    def refused_keys(self) -> set[str]:
        """Desired actions an actuator refused permanently since they were last decided: not retried
        until the decision is withdrawn and made again (or a person clears it)."""
        return {k for (k,) in self.db.execute(
            "SELECT DISTINCT a.key FROM actions a JOIN desired d ON d.key = a.key "
            "WHERE a.op = 'apply' AND a.status = 'refused' AND a.tick >= d.since_tick")}

    def settle_pending(self, actual: set[str]) -> int:
        """After a restart: pending actions the world shows as done are closed as done."""
        with self._write():
            rows = self.db.execute("SELECT id, key, op FROM actions WHERE status='pending'").fetchall()
            for rid, key, op in rows:
                took = (key in actual) if op == "apply" else (key not in actual)
                self.db.execute("UPDATE actions SET status=?, detail=? WHERE id=?",
                                ("done" if took else "interrupted",
                                 "settled after restart from actual state" if took else
                                 "controller stopped before the actuator call completed", rid))
        return len(rows)

    # ---- operator pins ---------------------------------------------------------------
    def record_pin(self, tick: int, kind: str, name: str, state: str, note: str, by: str,
                   created_wall_s: float) -> None:
        """A pin set (or replaced): the row in force, and a ``pinned`` event."""
        with self._txn():
            self.db.execute(
                "INSERT INTO pins(kind, name, state, note, pinned_by, created_wall, tick) VALUES(?,?,?,?,?,?,?) "
                "ON CONFLICT(kind, name) DO UPDATE SET state=excluded.state, note=excluded.note, "
                "pinned_by=excluded.pinned_by, created_wall=excluded.created_wall, tick=excluded.tick",
                (kind, name, state, note, by, created_wall_s or time.time(), tick))
            self._pin_event(tick, "pinned", kind, name, state, note, by, "")

    def record_unpin(self, tick: int, kind: str, name: str, by: str) -> None:
        """A pin released: its row goes, an ``unpinned`` event (with what was released) stays."""
        with self._txn():
            row = self.db.execute("SELECT state, note FROM pins WHERE kind=? AND name=?", (kind, name)).fetchone()
            self.db.execute("DELETE FROM pins WHERE kind=? AND name=?", (kind, name))
            self._pin_event(tick, "unpinned", kind, name, row[0] if row else "", row[1] if row else "", by, "")

    def record_pin_not_restored(self, tick: int, kind: str, name: str, detail: str) -> None:
        """A recorded pin a starting controller could not apply; its row is kept."""
        with self._write():
            row = self.db.execute("SELECT state, note, pinned_by FROM pins WHERE kind=? AND name=?",
                                  (kind, name)).fetchone()
            self._pin_event(tick, "not_restored", kind, name, *(row if row else ("", "", "")), detail)

    def _pin_event(self, tick: int, event: str, kind: str, name: str, state: str, note: str, by: str,
                   detail: str) -> None:
        assert event in PIN_EVENTS
        self.db.execute("INSERT INTO pin_events(tick, wall_time, event, kind, name, state, note, actor, detail) "
                        "VALUES(?,?,?,?,?,?,?,?,?)", (tick, time.time(), event, kind, name, state, note, by, detail))


class PerThreadReads(_Reads):
    """`_Reads` over one connection per reading thread, opened by `_open` on first use;
    `close` closes every thread's (a thread that reads again gets a new one)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()

    def _open(self) -> Any:
        raise NotImplementedError

    def _read_db(self) -> Any:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._open()
            self._local.db = db
            with self._lock:
                self._all.append(db)
        return db

    def close(self) -> None:
        with self._lock:
            dbs, self._all = self._all, []
        self._local = threading.local()
        for db in dbs:
            db.close()


class LedgerReader(PerThreadReads):
    """The record, read-only, from any thread: one read-only connection per thread.

    WAL lets these connections read beside the controller's writes; a query sees the
    record as of its start. The ledger file must exist (the writer creates it).
    """

    def __init__(self, path: str | Path, timeout_s: float = 5.0) -> None:
        self.path = str(path)
        self.timeout_s = timeout_s
        self._uri = Path(self.path).absolute().as_uri() + "?mode=ro"
        super().__init__()

    def _open(self) -> sqlite3.Connection:
        return sqlite3.connect(self._uri, uri=True, timeout=self.timeout_s, check_same_thread=False)
