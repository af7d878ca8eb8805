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
