"""The two stores agree: the same reserve/reconcile sequence gets the same verdicts from SQLite and Redis (Lua)."""

from __future__ import annotations

import asyncio
import random

from seamguard.gateway.admission import Limits
from seamguard.gateway.store import RedisStore, Scope, SqliteStore


def test_sqlite_and_redis_give_the_same_verdicts(redis_url):
    async def drive(store, seed: int) -> list[tuple]:
        rng = random.Random(seed)
        scopes = [Scope("key:k", Limits(tpm=9000, tpd=15000, concurrency=3)),
                  Scope("tenant:t", Limits(tpm=6000, tpd=60000), tpm_share=0.8)]
        now, held, out = 1_800_000_000.0, [], []
        for _ in range(600):
            now += rng.expovariate(2.0)
            if held and rng.random() < 0.3:
                r = held.pop(rng.randrange(len(held)))
                await store.reconcile(r, rng.randrange(0, r.amount + 50), now)
                continue
            v, r = await store.reserve(scopes, rng.randrange(50, 1500), now, 900.0)
            out.append((round(now, 3), v.ok, v.reason, v.retry_after_s))
            if r is not None:
                held.append(r)
        c = await store.counters("key:k", now)
        await store.close()
        return out + [(c.minute_cur, c.minute_prev, c.day, c.inflight)]

    async def both() -> tuple[list, list]:
        return (await drive(SqliteStore(":memory:"), 7),
                await drive(RedisStore(redis_url, prefix="agree:"), 7))

    a, b = asyncio.run(both())
    assert a == b
    assert {x[2] for x in a[:-1]} >= {"", "key tpd", "key concurrency", "tenant shed"}  # every cap was hit


def test_a_reconcile_a_lock_refused_is_paid_by_the_next_reservation(tmp_path):
    """Another process's write lock refuses the reconcile within the busy timeout (not the old 10 s);
    the tokens and the slot come back with the next reservation, charged once."""
    import sqlite3

    import pytest

    from seamguard.gateway.store import StoreError

    async def go() -> tuple:
        store = SqliteStore(tmp_path / "g.db")
        scopes = [Scope("key:k", Limits(tpm=1000, concurrency=1))]
        now = 1_800_000_030.0
        _, r = await store.reserve(scopes, 600, now, 900.0)
        lock = sqlite3.connect(tmp_path / "g.db", isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StoreError, match="locked"):
            await store.reconcile(r, 100, now)
        with pytest.raises(StoreError):
            await store.reserve(scopes, 10, now, 900.0)
        lock.execute("ROLLBACK")
        v, r2 = await store.reserve(scopes, 10, now, 900.0)   # the slot is free again: concurrency 1
        c = await store.counters("key:k", now)
        await store.close()
        return v.ok, c

    ok, c = asyncio.run(go())
    assert ok and (c.minute_cur, c.day, c.inflight) == (110, 110, 1)
