"""A replica's own record on local disk: who changed which key's state and why, and (with Redis) what it
knows of key states and what it charged.

One SQLite file in WAL mode (beside the store's tables with the SQLite store; the replica's own
file with Redis). Tables:

- ``gateway_events``: every key-state change with its evidence and who made it (`record`).
- ``replica_key_state``: the last state this replica knew for each key (`keep_key`): its own
  steps, an operator's, and those it read from Redis. A Redis that lost its data cannot
  bring a suspended key back to ``ok`` (`seamguard.gateway.store.merge_key_records`).
- ``replica_usage``: this replica's own charges per scope, per minute and per UTC day
  (`charge`, reconciled by the same deltas as Redis), from which a Redis that lost its data
  rebuilds its window counters (`window_usage`).

Writes are queued and written behind, on the connection's own thread (`SqliteThread`): the
event loop never waits for the disk, a lock held by another process delays the record (it
is kept in memory and retried every `RETRY_S`) but no request, and reads see what is queued
as well as what is written.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from seamguard.gateway.sqlite_thread import BUSY_TIMEOUT_S, SqliteThread, write_probe
from seamguard.gateway.store import KeyRecord, StoreError

RETRY_S = 0.5  # a record the disk refused is tried again this often

SCHEMA = """
CREATE TABLE IF NOT EXISTS gateway_events (
  id INTEGER PRIMARY KEY, wall_time REAL NOT NULL, key TEXT NOT NULL, tenant TEXT NOT NULL,
  from_state TEXT NOT NULL, to_state TEXT NOT NULL, reason TEXT NOT NULL, evidence TEXT NOT NULL,
  actor TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS gateway_events_key ON gateway_events(key, id);
CREATE TABLE IF NOT EXISTS replica_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS replica_key_state (key TEXT PRIMARY KEY, state TEXT NOT NULL, throttle_tpm INTEGER,
  reason TEXT NOT NULL, since REAL NOT NULL, actor TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS replica_usage (scope TEXT NOT NULL, kind TEXT NOT NULL, idx INTEGER NOT NULL,
  tokens INTEGER NOT NULL, PRIMARY KEY (scope, kind, idx));
"""

Bucket = tuple[str, str, int]  # (scope, "m" | "d", minute or day index)


@dataclass
class _Batch:
    """Writes not yet on disk, in the order they must be applied: forgotten scopes first, then the rest."""

    events: list[tuple] = field(default_factory=list)  # (id, wall_time, key, tenant, from, to, reason, evidence, actor)
    keys: dict[str, KeyRecord] = field(default_factory=dict)
    usage: dict[Bucket, int] = field(default_factory=dict)
    forget: set[str] = field(default_factory=set)
    committed: bool = False  # set on the writer thread once it is on disk

    def empty(self) -> bool:
        return not (self.events or self.keys or self.usage or self.forget)

    def then(self, newer: _Batch) -> _Batch:
        """This (older, refused) batch followed by ``newer``, as one batch."""
        out = _Batch(self.events + newer.events, {**self.keys, **newer.keys},
                     {b: t for b, t in self.usage.items() if b[0] not in newer.forget}, self.forget | newer.forget)
        for b, t in newer.usage.items():
            out.usage[b] = out.usage.get(b, 0) + t
        return out


class GatewayLedger:
    def __init__(self, path: str | Path, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.path = str(path)
        try:
            self.t = SqliteThread(self.path, busy_timeout_s, "gateway-ledger")
            self.replica_id, self._keys, self._next_id = self.t.call(_open_tx)
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"{self.path}: cannot open the gateway ledger: {e}") from None
        self._pending = _Batch()
        self._writing: _Batch | None = None
        self._flusher: asyncio.Task | None = None
        self.last_error = ""  # why the last write was refused ("" once one succeeds)

    # ---- writes (queued, written behind) ----------------------------------------------------
    def record(self, wall_time: float, key: str, tenant: str, from_state: str, to_state: str, reason: str,
               evidence: dict[str, float], actor: str) -> None:
        self._pending.events.append((self._next_id, wall_time, key, tenant, from_state, to_state, reason,
                                     json.dumps(evidence), actor))
        self._next_id += 1
        self._kick()

    def keep_key(self, key: str, rec: KeyRecord) -> None:
        rec = KeyRecord(rec.state, rec.throttle_tpm, rec.reason, rec.since, rec.actor)
        if self._keys.get(key) != rec:
            self._keys[key] = self._pending.keys[key] = rec
            self._kick()

    def charge(self, scopes: tuple[str, ...], minute: int, day: int, tokens: int) -> None:
        """``tokens`` (a reservation, or a reconcile's difference) charged to each scope's minute and day."""
        if not tokens:
            return
        u = self._pending.usage
        for scope in scopes:
            for b in ((scope, "m", minute), (scope, "d", day)):
                u[b] = u.get(b, 0) + tokens
        self._kick()

    def forget(self, scope: str) -> None:
        """An operator cleared the scope's counters: its charges so far are not to be rebuilt."""
        self._pending.usage = {b: t for b, t in self._pending.usage.items() if b[0] != scope}
        self._pending.forget.add(scope)
        self._kick()

    def _kick(self) -> None:
        if self._flusher is not None and not self._flusher.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a synchronous caller): written by the next flush or at close
            return
        self._flusher = loop.create_task(self._flush_loop())

    async def _flush_loop(self) -> None:
        while not self._pending.empty():
            batch, self._pending = self._pending, _Batch()
            self._writing = batch
            try:
                await self.t.run(_write_tx, batch, patient=True)
                self.last_error = ""
            except sqlite3.Error as e:
                self.last_error = str(e)
                self._pending = batch.then(self._pending)
                self._writing = None
                await asyncio.sleep(RETRY_S)
            finally:
                self._writing = None

    # ---- reads --------------------------------------------------------------------------------
    def key_record(self, key: str) -> KeyRecord | None:
        return self._keys.get(key)

    def key_records(self) -> dict[str, KeyRecord]:
        return dict(self._keys)

    async def window_usage(self, minute: int, day: int) -> dict[Bucket, int]:
        """This replica's charges in the buckets a window reads now: this minute, the one before, today."""
        try:
            rows = await self.t.run(_usage_rows, minute, day, patient=True)
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: {e}") from None
        wanted = {("m", minute), ("m", minute - 1), ("d", day)}
        queued = [b for b in (self._writing, self._pending) if b is not None and not b.committed]
        gone = set().union(*(b.forget for b in queued))
        out = {b: t for b, t in rows.items() if b[0] not in gone}
        for b in queued:
            for k, t in b.usage.items():
                if (k[1], k[2]) in wanted:
                    out[k] = out.get(k, 0) + t
        return {b: t for b, t in out.items() if t > 0}

    def events(self, key: str | None = None, limit: int = 100) -> list[dict]:
        """Newest first: those queued, then those written (an admin read; waits at most the busy timeout)."""
        queued = [e for b in (self._writing, self._pending) if b is not None and not b.committed for e in b.events]
        try:
            rows = self.t.call(_event_rows, key, limit)
        except sqlite3.Error:
            rows = []
        seen = {r[0] for r in rows}
        mine = [e for e in queued if e[0] not in seen and (key is None or e[2] == key)]
        both = sorted(mine + rows, key=lambda r: r[0], reverse=True)[:limit]
        return [{"wall_s": r[1], "key": r[2], "tenant": r[3], "from": r[4], "to": r[5], "reason": r[6],
                 "evidence": json.loads(r[7]), "by": r[8]} for r in both]

    async def health(self) -> None:
        """Raises `StoreError` unless the file's write lock can be taken now."""
        try:
            await self.t.run(write_probe)
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: {e}" + (f" ({self.last_error})" if self.last_error else "")) from None

    def close(self) -> None:
        if self._flusher is not None and not self._flusher.done():
            self._flusher.cancel()
        batch = self._pending if self._writing is None else self._writing.then(self._pending)
        try:
            if not batch.empty():
                self.t.call(_write_tx, batch)
        except sqlite3.Error:
            pass  # the disk refused it to the end: what was written stays
        finally:
            self.t.close()


# ---- on the ledger's thread -----------------------------------------------------------------------------
def _open_tx(db: sqlite3.Connection) -> tuple[str, dict[str, KeyRecord], int]:
    db.executescript(SCHEMA)
    db.execute("INSERT OR IGNORE INTO replica_meta(name, value) VALUES('replica_id', ?)", (uuid.uuid4().hex,))
    (rid,) = db.execute("SELECT value FROM replica_meta WHERE name='replica_id'").fetchone()
    keys = {k: KeyRecord(s, t, r, since, a) for k, s, t, r, since, a in db.execute(
        "SELECT key, state, throttle_tpm, reason, since, actor FROM replica_key_state")}
    (last,) = db.execute("SELECT COALESCE(MAX(id), 0) FROM gateway_events").fetchone()
    return rid, keys, last + 1


def _write_tx(db: sqlite3.Connection, b: _Batch) -> None:
    db.execute("BEGIN IMMEDIATE")
    for scope in b.forget:
        db.execute("DELETE FROM replica_usage WHERE scope=?", (scope,))
    db.executemany("INSERT OR IGNORE INTO gateway_events(id, wall_time, key, tenant, from_state, to_state, reason, "
                   "evidence, actor) VALUES(?,?,?,?,?,?,?,?,?)", b.events)
    db.executemany("INSERT INTO replica_key_state(key, state, throttle_tpm, reason, since, actor) VALUES(?,?,?,?,?,?) "
                   "ON CONFLICT(key) DO UPDATE SET state=excluded.state, throttle_tpm=excluded.throttle_tpm, "
                   "reason=excluded.reason, since=excluded.since, actor=excluded.actor",
                   [(k, r.state, r.throttle_tpm, r.reason, r.since, r.actor) for k, r in b.keys.items()])
    db.executemany("INSERT INTO replica_usage(scope, kind, idx, tokens) VALUES(?,?,?,?) ON CONFLICT"
                   "(scope, kind, idx) DO UPDATE SET tokens=MAX(0, tokens+excluded.tokens)",
                   [(s, k, i, t) for (s, k, i), t in b.usage.items()])
    db.execute("UPDATE replica_usage SET tokens=0 WHERE tokens<0")  # a give-back for a row already gone
    minutes = [i for (_, k, i) in b.usage if k == "m"]
    days = [i for (_, k, i) in b.usage if k == "d"]
    if minutes and days:  # rows no window reads any more: minutes before the last two, days before yesterday
        db.execute("DELETE FROM replica_usage WHERE (kind='m' AND idx<?) OR (kind='d' AND idx<?)",
                   (max(minutes) - 2, max(days) - 1))
    db.execute("COMMIT")
    b.committed = True


def _usage_rows(db: sqlite3.Connection, minute: int, day: int) -> dict[Bucket, int]:
    return {(s, k, i): t for s, k, i, t in db.execute(
        "SELECT scope, kind, idx, tokens FROM replica_usage WHERE (kind='m' AND idx IN (?, ?)) OR "
        "(kind='d' AND idx=?)", (minute, minute - 1, day))}


def _event_rows(db: sqlite3.Connection, key: str | None, limit: int) -> list[tuple]:
    q = "SELECT id, wall_time, key, tenant, from_state, to_state, reason, evidence, actor FROM gateway_events"
    args: list = []
    if key is not None:
        q += " WHERE key=?"
        args.append(key)
    q += " ORDER BY id DESC LIMIT ?"
    return list(db.execute(q, [*args, limit]))
