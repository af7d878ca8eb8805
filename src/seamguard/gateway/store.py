"""Where budgets and key states live: one interface, two stores.

- `SqliteStore`: one gateway replica. A file in WAL mode; every reserve and reconcile is
  one ``BEGIN IMMEDIATE`` transaction on the connection's own thread (`SqliteThread`, a short
  busy timeout), so budgets survive a restart (requests in flight at a restart did not
  survive it, so their slots are dropped when the file is opened) and a lock held elsewhere
  refuses requests instead of freezing the event loop.
- `RedisStore`: several replicas behind a load balancer share one Redis. Reserve and
  reconcile are each one Lua script (atomic in Redis), so two replicas never both take the
  last of a budget; the only over-spend is a request's usage above its own reservation.
  Each replica also keeps a durable record on local disk (`DurableRecord`, the ledger file):
  a Redis that loses its data neither lifts a key's state (`merge_key_records`) nor zeroes a
  budget (the epoch marker and `RedisStore._join`).

Both run the same check (`seamguard.gateway.admission.fits`; the Lua script computes the
same sums and hands the counters of a refused scope back to it for the reason and the
Retry-After). Buckets are per scope (``key:<name>``, ``tenant:<name>``): one per minute
(kept two minutes), one per UTC day, and the set of in-flight reservations, each with an
expiry so a replica that dies does not hold slots forever.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from seamguard.gateway.admission import Counters, Limits, Verdict, fits, windows
from seamguard.gateway.sqlite_thread import BUSY_TIMEOUT_S, SqliteThread, write_probe


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
    epoch: str = ""  # Redis: the epoch it was charged in (its buckets are left alone after a reset)


@dataclass(frozen=True)
class KeyRecord:
    state: str = "ok"  # ok | throttled | suspended
    throttle_tpm: int | None = None
    reason: str = ""
    since: float = 0.0
    actor: str = ""
    overruled: str = ""  # set on a read: the laxer state the shared store claimed, overruled by the durable record


STRICTNESS = {"ok": 0, "throttled": 1, "suspended": 2}


def merge_key_records(shared: KeyRecord, kept: KeyRecord | None) -> tuple[KeyRecord, bool]:
    """The state a replica acts on, from the shared store's record and its own durable one: the
    stricter wins (suspended > throttled > ok), unless the laxer one is a recorded step (who and
    when) taken after the stricter one: an operator's unsuspend or reset, the detector lifting its
    own step, through any replica. A Redis that lost its data has no record at all. Returns
    (record, True when the shared store's record is a downgrade that nothing explains)."""
    if kept is None:
        return shared, False
    rs, rk = STRICTNESS.get(shared.state, 0), STRICTNESS.get(kept.state, 0)
    if rs > rk or (rs == rk and shared.since >= kept.since):
        return shared, False
    if rs == rk or (shared.actor and shared.since >= kept.since):
        return (kept if rs == rk else shared), False
    return kept, True


class Store(Protocol):
    async def reserve(self, scopes: list[Scope], amount: int, now: float,
                      ttl_s: float) -> tuple[Verdict, Reservation | None]: ...

    async def reconcile(self, r: Reservation, actual: int, now: float) -> None: ...

    async def counters(self, scope: str, now: float) -> Counters: ...

    async def key_record(self, key: str) -> KeyRecord: ...

    async def set_key_record(self, key: str, rec: KeyRecord) -> None: ...

    async def reset(self, scope: str, now: float) -> None: ...

    async def health(self, now: float) -> None: ...

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


log = logging.getLogger("seamguard.gateway.store")


class StoreError(RuntimeError):
    """The store cannot be opened, or cannot be reached now; the message names it. The gateway
    answers 503 (admission fails closed: a budget it cannot check is not spent)."""


class SqliteStore:
    """Every statement on the connection's own thread (`SqliteThread`), with a short busy timeout: a
    lock held by another process refuses admissions (503) within about half a second, and never
    freezes the event loop. A reconcile that cannot be written then is owed, and paid in the next
    reservation's transaction (the tokens and the slot come back; nothing is charged twice)."""

    def __init__(self, path: str | Path, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.path = str(path)
        try:
            self.t = SqliteThread(self.path, busy_timeout_s, "gateway-store")
            self.t.call(_sqlite_open_tx)
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"{self.path}: cannot open the gateway store: {e}") from None
        self._last_gc = [-1]  # read and written on the store's thread only
        self._owed: list[tuple[Reservation, int]] = []  # reconciles a lock refused, paid with the next write

    async def _run(self, fn, *args, patient: bool = False):
        try:
            return await self.t.run(fn, *args, patient=patient)
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: {e}") from None

    async def reserve(self, scopes: list[Scope], amount: int, now: float,
                      ttl_s: float) -> tuple[Verdict, Reservation | None]:
        owed, self._owed = self._owed, []
        try:
            return await self._run(_sqlite_reserve_tx, owed, scopes, amount, now, ttl_s, self._last_gc)
        except StoreError:
            self._owed = owed + self._owed
            raise

    async def reconcile(self, r: Reservation, actual: int, now: float) -> None:
        try:
            await self._run(_sqlite_reconcile_tx, [(r, actual)], patient=True)
        except StoreError:
            self._owed.append((r, actual))
            raise

    async def counters(self, scope: str, now: float) -> Counters:
        m, _, d, _ = windows(now)
        return await self._run(_sqlite_counters, scope, m, d, now)

    async def key_record(self, key: str) -> KeyRecord:
        return await self._run(_sqlite_key_record, key)

    async def set_key_record(self, key: str, rec: KeyRecord) -> None:
        await self._run(_sqlite_set_key_record, key, rec)

    async def reset(self, scope: str, now: float) -> None:
        await self._run(lambda db: db.execute("DELETE FROM buckets WHERE scope=?", (scope,)))

    async def health(self, now: float) -> None:
        """Raises `StoreError` unless the write lock can be taken now (within the busy timeout)."""
        await self._run(write_probe)

    async def close(self) -> None:
        self.t.close()


# ---- SQLite transactions: each runs on the store's thread, one at a time --------------------------
def _sqlite_open_tx(db: sqlite3.Connection) -> None:
    db.executescript(SQLITE_SCHEMA)
    db.execute("DELETE FROM inflight")  # nothing in flight survives a restart


def _sqlite_counters(db: sqlite3.Connection, scope: str, m: int, d: int, now: float) -> Counters:
    rows = {(k, i): t for k, i, t in db.execute(
        "SELECT kind, idx, tokens FROM buckets WHERE scope=? AND ((kind='m' AND idx IN (?, ?)) OR "
        "(kind='d' AND idx=?))", (scope, m, m - 1, d))}
    (n,) = db.execute("SELECT COUNT(*) FROM inflight WHERE scope=? AND expires>?", (scope, now)).fetchone()
    return Counters(rows.get(("m", m), 0), rows.get(("m", m - 1), 0), rows.get(("d", d), 0), n)


def _sqlite_give_back(db: sqlite3.Connection, owed: list[tuple[Reservation, int]]) -> None:
    for r, actual in owed:
        diff = actual - r.amount
        for scope in r.scopes:
            if diff:
                db.execute("UPDATE buckets SET tokens=MAX(0, tokens+?) WHERE scope=? AND "
                           "((kind='m' AND idx=?) OR (kind='d' AND idx=?))", (diff, scope, r.minute, r.day))
            db.execute("DELETE FROM inflight WHERE id=? AND scope=?", (r.id, scope))


def _sqlite_reconcile_tx(db: sqlite3.Connection, owed: list[tuple[Reservation, int]]) -> None:
    db.execute("BEGIN IMMEDIATE")
    _sqlite_give_back(db, owed)
    db.execute("COMMIT")


def _sqlite_reserve_tx(db: sqlite3.Connection, owed: list[tuple[Reservation, int]], scopes: list[Scope],
                       amount: int, now: float, ttl_s: float,
                       last_gc: list[int]) -> tuple[Verdict, Reservation | None]:
    m, em, d, ed = windows(now)
    db.execute("BEGIN IMMEDIATE")
    _sqlite_give_back(db, owed)
    for s in scopes:
        c = _sqlite_counters(db, s.name, m, d, now)
        v = fits(c, s.limits, amount, em, ed, s.tpm_share, s.name.split(":", 1)[0])
        if not v.ok:
            db.execute("COMMIT")  # the owed reconciles stay paid
            return v, None
    rid = uuid.uuid4().hex
    for s in scopes:
        for kind, idx in (("m", m), ("d", d)):
            db.execute("INSERT INTO buckets(scope, kind, idx, tokens) VALUES(?,?,?,?) ON CONFLICT"
                       "(scope, kind, idx) DO UPDATE SET tokens=tokens+excluded.tokens",
                       (s.name, kind, idx, amount))
        db.execute("INSERT INTO inflight(id, scope, expires) VALUES(?,?,?)", (rid, s.name, now + ttl_s))
    if m != last_gc[0]:  # once a minute: old minute buckets, days older than yesterday
        db.execute("DELETE FROM buckets WHERE (kind='m' AND idx<?) OR (kind='d' AND idx<?)", (m - 2, d - 1))
        db.execute("DELETE FROM inflight WHERE expires<=?", (now,))
        last_gc[0] = m
    db.execute("COMMIT")
    return Verdict(True), Reservation(rid, tuple(s.name for s in scopes), amount, m, d)


def _sqlite_key_record(db: sqlite3.Connection, key: str) -> KeyRecord:
    row = db.execute("SELECT state, throttle_tpm, reason, since, actor FROM key_state WHERE key=?",
                     (key,)).fetchone()
    return KeyRecord(*row) if row else KeyRecord()


def _sqlite_set_key_record(db: sqlite3.Connection, key: str, rec: KeyRecord) -> None:
    db.execute("INSERT INTO key_state(key, state, throttle_tpm, reason, since, actor) VALUES(?,?,?,?,?,?) "
               "ON CONFLICT(key) DO UPDATE SET state=excluded.state, throttle_tpm=excluded.throttle_tpm, "
               "reason=excluded.reason, since=excluded.since, actor=excluded.actor",
               (key, rec.state, rec.throttle_tpm, rec.reason, rec.since, rec.actor))


# KEYS, per scope i (0-based): 4i+1 this minute's bucket, 4i+2 the previous minute's, 4i+3 today's,
# 4i+4 the in-flight sorted set (member: reservation id, score: its expiry); then the epoch marker.
# ARGV: amount, now, seconds into the minute, reservation id, expiry, n, then per scope tpm, tpd,
# concurrency (-1: unlimited) and the tpm share; then the epoch this replica has contributed to.
# {-1}: the marker is not that epoch (Redis lost its data, or this replica has not contributed yet).
_RESERVE_LUA = """
local amount = tonumber(ARGV[1]); local now = tonumber(ARGV[2]); local em = tonumber(ARGV[3])
local rid = ARGV[4]; local expires = tonumber(ARGV[5]); local n = tonumber(ARGV[6])
if redis.call('GET', KEYS[4*n+1]) ~= ARGV[7+4*n] then return {-1} end
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
  redis.call('INCRBY', KEYS[4*i+1], amount); redis.call('EXPIRE', KEYS[4*i+1], MINUTE_TTL)
  redis.call('INCRBY', KEYS[4*i+3], amount); redis.call('EXPIRE', KEYS[4*i+3], DAY_TTL)
  redis.call('ZADD', KEYS[4*i+4], expires, rid)
end
return {1}
"""

# KEYS per scope i: 3i+1 the reserved minute's bucket, 3i+2 the reserved day's, 3i+3 the in-flight set;
# then the epoch marker. ARGV: actual - reserved, reservation id, the epoch it was reserved in.
# Buckets of another epoch are left alone: the replica's durable record has the difference, and
# adds it when it contributes to the new epoch.
_RECONCILE_LUA = """
local diff = tonumber(ARGV[1])
local same = redis.call('GET', KEYS[#KEYS]) == ARGV[3]
for i = 0, (#KEYS - 1) / 3 - 1 do
  for j = 1, 2 do
    local k = KEYS[3*i+j]
    if same and diff ~= 0 and redis.call('EXISTS', k) == 1 then
      local v = redis.call('INCRBY', k, diff)
      if v < 0 then redis.call('SET', k, 0, 'KEEPTTL') end
    end
  end
  redis.call('ZREM', KEYS[3*i+3], ARGV[2])
end
return 1
"""

# A replica joins the epoch (creating it when Redis has none: Redis lost its data, or never had
# any) and, once per epoch, adds its own durable charges to the window counters.
# KEYS: the epoch marker, the hash replica -> epoch it contributed to, then the counters.
# ARGV: a new epoch id, this replica's id, then per counter its tokens and its TTL.
_JOIN_LUA = """
local cur = redis.call('GET', KEYS[1])
if not cur then cur = ARGV[1]; redis.call('SET', KEYS[1], cur) end
if redis.call('HGET', KEYS[2], ARGV[2]) == cur then return {cur, 0} end
redis.call('HSET', KEYS[2], ARGV[2], cur)
for i = 3, #KEYS do
  local tokens = tonumber(ARGV[2*i-3])
  if tokens > 0 then
    redis.call('INCRBY', KEYS[i], tokens); redis.call('EXPIRE', KEYS[i], tonumber(ARGV[2*i-2]))
  end
end
return {cur, 1}
"""

# KEYS[1]: a key's state hash; ARGV: field, value pairs. Written only where Redis has no record.
_RESTORE_STATE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""

WATCH_S = 1.0  # how often a replica checks that Redis still has its epoch
MINUTE_TTL_S = 180
DAY_TTL_S = 172800
_RESERVE_LUA = _RESERVE_LUA.replace("MINUTE_TTL", str(MINUTE_TTL_S)).replace("DAY_TTL", str(DAY_TTL_S))


class DurableRecord(Protocol):
    """What a Redis-backed replica keeps on its own disk (`seamguard.gateway.ledger.GatewayLedger`): the
    key states it last knew and its own charges, per minute and per day."""

    replica_id: str

    def key_record(self, key: str) -> KeyRecord | None: ...

    def keep_key(self, key: str, rec: KeyRecord) -> None: ...

    def key_records(self) -> dict[str, KeyRecord]: ...

    def charge(self, scopes: tuple[str, ...], minute: int, day: int, tokens: int) -> None: ...

    def forget(self, scope: str) -> None: ...

    async def window_usage(self, minute: int, day: int) -> dict[tuple[str, str, int], int]: ...

    async def health(self) -> None: ...


class RedisStore:
    """Budgets and key states shared through Redis; with a ``durable`` record, each replica also keeps
    its own charges and the key states it knows on local disk, and survives a Redis that lost its
    data: key states are merged on every read (`merge_key_records`), and the window counters are
    rebuilt from every replica's durable charges (`_join`) before the next reservation."""

    def __init__(self, url: str, prefix: str = "seamguard:gw:", timeout_s: float = 2.0,
                 durable: DurableRecord | None = None) -> None:
        import redis
        import redis.asyncio as aredis

        self._errors = (redis.RedisError, OSError)
        self.prefix = prefix
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # one retry on a fresh connection: a restarted Redis leaves every pooled connection dead, and
        # each would otherwise cost one request a 503 (a script retried after a lost reply may be
        # charged twice: the safe side)
        self.r = aredis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                 retry=Retry(NoBackoff(), 1), retry_on_error=[redis.ConnectionError])
        self._reserve = self.r.register_script(_RESERVE_LUA)
        self._reconcile = self.r.register_script(_RECONCILE_LUA)
        self._join_script = self.r.register_script(_JOIN_LUA)
        self._restore = self.r.register_script(_RESTORE_STATE_LUA)
        self.durable = durable
        self.replica_id = durable.replica_id if durable is not None else uuid.uuid4().hex
        self.epoch = ""  # the epoch this replica has contributed its charges to ("" not yet)
        self._joining = asyncio.Lock()
        self._watcher: asyncio.Task | None = None
        self._now = 0.0  # the latest time a caller gave (the watcher joins at it)

    def _k(self, scope: str, kind: str, idx: int | None = None) -> str:
        return f"{self.prefix}{scope}:{kind}" + ("" if idx is None else f":{idx}")

    async def _join(self, now: float) -> None:
        """Join Redis's current epoch, contributing this replica's durable charges once per epoch."""
        async with self._joining:
            m, _, d, _ = windows(now)
            rows = await self.durable.window_usage(m, d) if self.durable is not None else {}
            keys = [self._k("", "epoch"), self._k("", "epoch:replicas")]
            args: list[object] = [uuid.uuid4().hex, self.replica_id]
            for (scope, kind, idx), tokens in sorted(rows.items()):
                keys.append(self._k(scope, kind, idx))
                args += [tokens, MINUTE_TTL_S if kind == "m" else DAY_TTL_S]
            try:
                epoch, added = await self._join_script(keys=keys, args=args)
                if added and self.durable is not None:
                    await self._restore_states()
            except self._errors as e:
                raise StoreError(f"redis: {e}") from None
            self.epoch = epoch.decode() if isinstance(epoch, bytes) else str(epoch)
            if added and self.epoch != "" and rows:
                log.warning("redis had no record of this replica's charges (epoch %s): rebuilt %d window "
                            "counters from its durable record", self.epoch, len(rows))

    def _watch(self, now: float) -> None:
        self._now = max(self._now, now)
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch_loop())

    async def _watch_loop(self) -> None:
        """Every WATCH_S: has Redis lost its data (the epoch marker gone or new)? Then join, so an idle
        replica's charges are back in the counters within a second, not at its next request."""
        while True:
            await asyncio.sleep(WATCH_S)
            try:
                current = await self.r.get(self._k("", "epoch"))
                if current is None or current.decode() != self.epoch:
                    await self._join(self._now)
            except (StoreError, *self._errors):
                pass  # Redis unreachable: requests are refused (503) meanwhile; tried again next round

    async def _restore_states(self) -> None:
        for key, rec in self.durable.key_records().items():  # type: ignore[union-attr]
            if rec.state != "ok":
                await self._restore(keys=[self._k(f"key:{key}", "state")], args=_state_fields(rec))

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
        keys.append(self._k("", "epoch"))
        self._watch(now)
        for _ in range(2):  # a second try after joining a new epoch
            try:
                out = await self._reserve(keys=keys, args=[*args, self.epoch])
            except self._errors as e:
                raise StoreError(f"redis: {e}") from None
            if int(out[0]) != -1:
                break
            await self._join(now)
        else:
            raise StoreError("redis: its epoch changed twice during one reservation")
        if int(out[0]) == 1:
            res = Reservation(rid, tuple(s.name for s in scopes), amount, m, d, self.epoch)
            if self.durable is not None:
                self.durable.charge(res.scopes, m, d, amount)
            return Verdict(True), res
        i = int(out[1])
        return _refused(Counters(*(int(x) for x in out[2:6])), scopes[i], amount, now), None

    async def reconcile(self, r: Reservation, actual: int, now: float) -> None:
        if self.durable is not None and actual != r.amount:
            self.durable.charge(r.scopes, r.minute, r.day, actual - r.amount)
        keys: list[str] = []
        for scope in r.scopes:
            keys += [self._k(scope, "m", r.minute), self._k(scope, "d", r.day), self._k(scope, "inflight")]
        keys.append(self._k("", "epoch"))
        try:
            await self._reconcile(keys=keys, args=[actual - r.amount, r.id, r.epoch])
        except self._errors as e:  # the reservation stays charged and its slot expires: errs on the safe side
            raise StoreError(f"redis: {e}") from None

    async def counters(self, scope: str, now: float) -> Counters:
        m, _, d, _ = windows(now)
        try:
            async with self.r.pipeline(transaction=True) as p:
                p.get(self._k(scope, "m", m)).get(self._k(scope, "m", m - 1)).get(self._k(scope, "d", d))
                p.zcount(self._k(scope, "inflight"), f"({now!r}", "+inf")
                mc, mp, dd, n = await p.execute()
        except self._errors as e:
            raise StoreError(f"redis: {e}") from None
        return Counters(int(mc or 0), int(mp or 0), int(dd or 0), int(n))

    async def _shared_record(self, key: str) -> KeyRecord:
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

    async def key_record(self, key: str) -> KeyRecord:
        """The key's state: Redis's, unless this replica's durable record is stricter and Redis's
        does not explain the difference (then the durable one, written back to Redis, with
        ``overruled`` set to what Redis said)."""
        shared = await self._shared_record(key)
        kept = self.durable.key_record(key) if self.durable is not None else None
        rec, downgrade = merge_key_records(shared, kept)
        if downgrade:
            log.warning("key %r: redis says %s (%s) but this replica recorded %s at %.0f by %s (%s): kept %s "
                        "and wrote it back (redis lost or rewrote its record)", key, shared.state,
                        f"at {shared.since:.0f} by {shared.actor}" if shared.actor else "no record",
                        rec.state, rec.since, rec.actor, rec.reason, rec.state)
            await self.set_key_record(key, rec)
            return replace(rec, overruled=shared.state)
        if self.durable is not None and rec != kept and rec.actor:
            self.durable.keep_key(key, rec)  # another replica's (or an operator's) step: known here from now on
        return rec

    async def set_key_record(self, key: str, rec: KeyRecord) -> None:
        if self.durable is not None:
            self.durable.keep_key(key, rec)
        try:
            await self.r.hset(self._k(f"key:{key}", "state"), mapping=dict(zip(*[iter(_state_fields(rec))] * 2)))
        except self._errors as e:
            raise StoreError(f"redis: {e}") from None

    async def reset(self, scope: str, now: float) -> None:
        m, _, d, _ = windows(now)
        if self.durable is not None:
            self.durable.forget(scope)
        try:
            await self.r.delete(self._k(scope, "m", m), self._k(scope, "m", m - 1), self._k(scope, "d", d))
        except self._errors as e:
            raise StoreError(f"redis: {e}") from None

    async def health(self, now: float) -> None:
        """Raises `StoreError` unless Redis answers and this replica's durable record can be written;
        joins a new epoch on the way (a replica with no traffic still gives its charges back to a
        Redis that lost them, at the load balancer's next health check)."""
        self._watch(now)
        try:
            current = await self.r.get(self._k("", "epoch"))
        except self._errors as e:
            raise StoreError(f"redis: {e}") from None
        if current is None or current.decode() != self.epoch:
            await self._join(now)
        if self.durable is not None:
            await self.durable.health()

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        await self.r.aclose()


def _state_fields(rec: KeyRecord) -> list[str]:
    return ["state", rec.state, "throttle_tpm", "" if rec.throttle_tpm is None else str(rec.throttle_tpm),
            "reason", rec.reason, "since", repr(rec.since), "actor", rec.actor]
