"""Where budgets and key states live: one interface, two stores.

- `SqliteStore`: one gateway replica. A file in WAL mode; every reserve and reconcile is
  one ``BEGIN IMMEDIATE`` transaction, so budgets survive a restart (requests in flight at
  a restart did not survive it, so their slots are dropped when the file is opened).
- `RedisStore`: several replicas behind a load balancer share one Redis. Reserve and
  reconcile are each one Lua script (atomic in Redis), so two replicas never both take the
  last of a budget; the only over-spend is a request's usage above its own reservation.

Both run the same check (`seamguard.gateway.admission.fits`; the Lua script computes the
same sums and hands the counters of a refused scope back to it for the reason and the
Retry-After). Buckets are per scope (``key:<name>``, ``tenant:<name>``): one per minute
(kept two minutes), one per UTC day, and the set of in-flight reservations, each with an
expiry so a replica that dies does not hold slots forever.
"""

from __future__ import annotations

import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from seamguard.gateway.admission import Counters, Limits, Verdict, fits, windows


@dataclass(frozen=True)
class Scope:
    """One set of caps a request is charged against."""

    name: str  # "key:<name>" or "tenant:<name>"
    limits: Limits
    tpm_share: float = 1.0  # < 1: a throttled key, or a lower priority near its tenant's budget


@dataclass(frozen=True)
class Reservation:
    id: str
    scopes: tuple[str, ...]
    amount: int
    minute: int
    day: int


@dataclass(frozen=True)
class KeyRecord:
    state: str = "ok"  # ok | throttled | suspended
    throttle_tpm: int | None = None
    reason: str = ""
    since: float = 0.0
    actor: str = ""


class Store(Protocol):
    async def reserve(self, scopes: list[Scope], amount: int, now: float,
                      ttl_s: float) -> tuple[Verdict, Reservation | None]: ...

    async def reconcile(self, r: Reservation, actual: int, now: float) -> None: ...

    async def counters(self, scope: str, now: float) -> Counters: ...

    async def key_record(self, key: str) -> KeyRecord: ...

    async def set_key_record(self, key: str, rec: KeyRecord) -> None: ...

    async def reset(self, scope: str, now: float) -> None: ...

    async def close(self) -> None: ...


def _refused(c: Counters, s: Scope, amount: int, now: float) -> Verdict:
    _, em, _, ed = windows(now)
    v = fits(c, s.limits, amount, em, ed, s.tpm_share, s.name.split(":", 1)[0])
    return v if not v.ok else Verdict(False, f"{s.name.split(':', 1)[0]} busy", 1)  # raced: counters moved


SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS buckets (scope TEXT NOT NULL, kind TEXT NOT NULL, idx INTEGER NOT NULL,
  tokens INTEGER NOT NULL, PRIMARY KEY (scope, kind, idx));
CREATE TABLE IF NOT EXISTS inflight (id TEXT NOT NULL, scope TEXT NOT NULL, expires REAL NOT NULL,
  PRIMARY KEY (id, scope));
CREATE INDEX IF NOT EXISTS inflight_scope ON inflight(scope, expires);
CREATE TABLE IF NOT EXISTS key_state (key TEXT PRIMARY KEY, state TEXT NOT NULL, throttle_tpm INTEGER,
  reason TEXT NOT NULL, since REAL NOT NULL, actor TEXT NOT NULL);
"""


class StoreError(RuntimeError):
    """The store cannot be opened, or cannot be reached now; the message names it. The gateway
    answers 503 (admission fails closed: a budget it cannot check is not spent)."""


class SqliteStore:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SQLITE_SCHEMA)
            self.db.execute("DELETE FROM inflight")  # nothing in flight survives a restart
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"{self.path}: cannot open the gateway store: {e}") from None
        self._last_gc = -1

    def _counters(self, scope: str, m: int, d: int, now: float) -> Counters:
        rows = {(k, i): t for k, i, t in self.db.execute(
            "SELECT kind, idx, tokens FROM buckets WHERE scope=? AND ((kind='m' AND idx IN (?, ?)) OR "
            "(kind='d' AND idx=?))", (scope, m, m - 1, d))}
        (n,) = self.db.execute("SELECT COUNT(*) FROM inflight WHERE scope=? AND expires>?", (scope, now)).fetchone()
        return Counters(rows.get(("m", m), 0), rows.get(("m", m - 1), 0), rows.get(("d", d), 0), n)

    async def reserve(self, scopes: list[Scope], amount: int, now: float,
                      ttl_s: float) -> tuple[Verdict, Reservation | None]:
        m, em, d, ed = windows(now)
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            for s in scopes:
                c = self._counters(s.name, m, d, now)
                v = fits(c, s.limits, amount, em, ed, s.tpm_share, s.name.split(":", 1)[0])
                if not v.ok:
                    db.execute("ROLLBACK")
                    return v, None
            rid = uuid.uuid4().hex
            for s in scopes:
                for kind, idx in (("m", m), ("d", d)):
                    db.execute("INSERT INTO buckets(scope, kind, idx, tokens) VALUES(?,?,?,?) ON CONFLICT"
                               "(scope, kind, idx) DO UPDATE SET tokens=tokens+excluded.tokens",
                               (s.name, kind, idx, amount))
                db.execute("INSERT INTO inflight(id, scope, expires) VALUES(?,?,?)", (rid, s.name, now + ttl_s))
            if m != self._last_gc:  # once a minute: old minute buckets, days older than yesterday
                db.execute("DELETE FROM buckets WHERE (kind='m' AND idx<?) OR (kind='d' AND idx<?)", (m - 2, d - 1))
                db.execute("DELETE FROM inflight WHERE expires<=?", (now,))
                self._last_gc = m
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return Verdict(True), Reservation(rid, tuple(s.name for s in scopes), amount, m, d)

    async def reconcile(self, r: Reservation, actual: int, now: float) -> None:
        diff = actual - r.amount
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            for scope in r.scopes:
                if diff:
                    db.execute("UPDATE buckets SET tokens=MAX(0, tokens+?) WHERE scope=? AND "
                               "((kind='m' AND idx=?) OR (kind='d' AND idx=?))", (diff, scope, r.minute, r.day))
                db.execute("DELETE FROM inflight WHERE id=? AND scope=?", (r.id, scope))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    async def counters(self, scope: str, now: float) -> Counters:
        m, _, d, _ = windows(now)
        return self._counters(scope, m, d, now)

    async def key_record(self, key: str) -> KeyRecord:
        row = self.db.execute("SELECT state, throttle_tpm, reason, since, actor FROM key_state WHERE key=?",
                              (key,)).fetchone()
        return KeyRecord(*row) if row else KeyRecord()

    async def set_key_record(self, key: str, rec: KeyRecord) -> None:
        self.db.execute("INSERT INTO key_state(key, state, throttle_tpm, reason, since, actor) VALUES(?,?,?,?,?,?) "
                        "ON CONFLICT(key) DO UPDATE SET state=excluded.state, throttle_tpm=excluded.throttle_tpm, "
                        "reason=excluded.reason, since=excluded.since, actor=excluded.actor",
                        (key, rec.state, rec.throttle_tpm, rec.reason, rec.since, rec.actor))

    async def reset(self, scope: str, now: float) -> None:
        self.db.execute("DELETE FROM buckets WHERE scope=?", (scope,))

    async def close(self) -> None:
        self.db.close()


# KEYS, per scope i (0-based): 4i+1 this minute's bucket, 4i+2 the previous minute's, 4i+3 today's,
# 4i+4 the in-flight sorted set (member: reservation id, score: its expiry).
# ARGV: amount, now, seconds into the minute, reservation id, expiry, n, then per scope tpm, tpd,
# concurrency (-1: unlimited) and the tpm share.
_RESERVE_LUA = """
local amount = tonumber(ARGV[1]); local now = tonumber(ARGV[2]); local em = tonumber(ARGV[3])
local rid = ARGV[4]; local expires = tonumber(ARGV[5]); local n = tonumber(ARGV[6])
for i = 0, n - 1 do
  local mc = tonumber(redis.call('GET', KEYS[4*i+1]) or '0')
  local mp = tonumber(redis.call('GET', KEYS[4*i+2]) or '0')
  local d = tonumber(redis.call('GET', KEYS[4*i+3]) or '0')
  redis.call('ZREMRANGEBYSCORE', KEYS[4*i+4], '-inf', now)
  local inflight = redis.call('ZCARD', KEYS[4*i+4])
  local tpm = tonumber(ARGV[7+4*i]); local tpd = tonumber(ARGV[8+4*i])
  local conc = tonumber(ARGV[9+4*i]); local share = tonumber(ARGV[10+4*i])
  local used = mc + mp * math.max(0, 1 - em / 60)
  if (conc >= 0 and inflight + 1 > conc) or (tpd >= 0 and d + amount > tpd)
     or (tpm >= 0 and used + amount > tpm * share) then
    return {0, i, mc, mp, d, inflight}
  end
end
for i = 0, n - 1 do
  redis.call('INCRBY', KEYS[4*i+1], amount); redis.call('EXPIRE', KEYS[4*i+1], 180)
  redis.call('INCRBY', KEYS[4*i+3], amount); redis.call('EXPIRE', KEYS[4*i+3], 172800)
  redis.call('ZADD', KEYS[4*i+4], expires, rid)
end
return {1}
"""

# KEYS per scope i: 3i+1 the reserved minute's bucket, 3i+2 the reserved day's, 3i+3 the in-flight set.
# ARGV: actual - reserved, reservation id.
_RECONCILE_LUA = """
local diff = tonumber(ARGV[1])
for i = 0, #KEYS / 3 - 1 do
  for j = 1, 2 do
    local k = KEYS[3*i+j]
    if diff ~= 0 and redis.call('EXISTS', k) == 1 then
      local v = redis.call('INCRBY', k, diff)
      if v < 0 then redis.call('SET', k, 0, 'KEEPTTL') end
    end
  end
  redis.call('ZREM', KEYS[3*i+3], ARGV[2])
end
return 1
"""


class RedisStore:
    def __init__(self, url: str, prefix: str = "seamguard:gw:", timeout_s: float = 2.0) -> None:
        import redis
        import redis.asyncio as aredis

        self._errors = (redis.RedisError, OSError)
        self.prefix = prefix
        self.r = aredis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._reserve = self.r.register_script(_RESERVE_LUA)
        self._reconcile = self.r.register_script(_RECONCILE_LUA)

    def _k(self, scope: str, kind: str, idx: int | None = None) -> str:
        return f"{self.prefix}{scope}:{kind}" + ("" if idx is None else f":{idx}")

    async def reserve(self, scopes: list[Scope], amount: int, now: float,
                      ttl_s: float) -> tuple[Verdict, Reservation | None]:
        m, em, d, _ = windows(now)
        keys: list[str] = []
        args: list[object] = [amount, repr(now), repr(em), rid := uuid.uuid4().hex, repr(now + ttl_s), len(scopes)]
        for s in scopes:
            keys += [self._k(s.name, "m", m), self._k(s.name, "m", m - 1), self._k(s.name, "d", d),
                     self._k(s.name, "inflight")]
            lim = s.limits
            args += [-1 if lim.tpm is None else lim.tpm, -1 if lim.tpd is None else lim.tpd,
                     -1 if lim.concurrency is None else lim.concurrency, repr(s.tpm_share)]
        try:
            out = await self._reserve(keys=keys, args=args)
        except self._errors as e:
            raise StoreError(f"redis: {e}") from None
        if int(out[0]) == 1:
            return Verdict(True), Reservation(rid, tuple(s.name for s in scopes), amount, m, d)
        i = int(out[1])
        return _refused(Counters(*(int(x) for x in out[2:6])), scopes[i], amount, now), None

    async def reconcile(self, r: Reservation, actual: int, now: float) -> None:
        keys: list[str] = []
        for scope in r.scopes:
            keys += [self._k(scope, "m", r.minute), self._k(scope, "d", r.day), self._k(scope, "inflight")]
        try:
            await self._reconcile(keys=keys, args=[actual - r.amount, r.id])
        except self._errors as e:  # the reservation stays charged and its slot expires: errs on the safe side
            raise StoreError(f"redis: {e}") from None

    async def counters(self, scope: str, now: float) -> Counters:
        m, _, d, _ = windows(now)
        async with self.r.pipeline(transaction=True) as p:
            p.get(self._k(scope, "m", m)).get(self._k(scope, "m", m - 1)).get(self._k(scope, "d", d))
            p.zcount(self._k(scope, "inflight"), f"({now!r}", "+inf")
            mc, mp, dd, n = await p.execute()
        return Counters(int(mc or 0), int(mp or 0), int(dd or 0), int(n))

    async def key_record(self, key: str) -> KeyRecord:
        try:
            h = await self.r.hgetall(self._k(f"key:{key}", "state"))
        except self._errors as e:
            raise StoreError(f"redis: {e}") from None
        if not h:
            return KeyRecord()
        g = {k.decode(): v.decode() for k, v in h.items()}
        tpm = g.get("throttle_tpm", "")
        return KeyRecord(g.get("state", "ok"), int(tpm) if tpm else None, g.get("reason", ""),
                         float(g.get("since", 0.0)), g.get("actor", ""))

    async def set_key_record(self, key: str, rec: KeyRecord) -> None:
        await self.r.hset(self._k(f"key:{key}", "state"), mapping={
            "state": rec.state, "throttle_tpm": "" if rec.throttle_tpm is None else str(rec.throttle_tpm),
            "reason": rec.reason, "since": repr(rec.since), "actor": rec.actor})

    async def reset(self, scope: str, now: float) -> None:
        m, _, d, _ = windows(now)
        await self.r.delete(self._k(scope, "m", m), self._k(scope, "m", m - 1), self._k(scope, "d", d))

    async def close(self) -> None:
        await self.r.aclose()
