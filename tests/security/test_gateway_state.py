"""Attacks on the gateway's key state and budgets: a Redis that lost its data, a backend outage, a locked SQLite file.

Each gateway here is the real HTTP gateway, reached with the ``openai`` client, in front of
the vLLM-like stand-in backend; Redis is a redis-server this module starts and restarts
without its data (no persistence), as a crash or an eviction would leave it.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import redis

from seamguard.testbed.openai_backend import FakeBackend, ThreadedServer
from seamguard.testbed.redis_server import RedisServer
from tests.gateway.conftest import ADMIN_TOKEN, KEY_B, base_config, eventually

T0 = 1_800_000_030.0  # a frozen clock: every request in one minute, so budgets are exact
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def own_redis(tmp_path: Path):
    with RedisServer(tmp_path / "redis") as r:
        yield r


def _client(url: str, key: str = KEY_B) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=20)


def _ask(url: str, max_tokens: int = 90) -> int:
    """One chat completion; its HTTP status."""
    try:
        _client(url).chat.completions.create(model="fake-model", max_tokens=max_tokens,
                                             messages=[{"role": "user", "content": "x"}])
        return 200
    except openai.APIStatusError as e:
        return e.status_code
    except openai.APIConnectionError:   # no answer within the client's 20 s (a timeout included)
        return -1


def _redis_store(r: RedisServer, ledger: Path) -> dict:
    return {"type": "redis", "url": r.url, "prefix": "gw:", "ledger": str(ledger)}


def _polled(read, want, timeout_s: float = 5.0):
    """``read()`` until it returns ``want`` or ``timeout_s`` passed; its last value."""
    deadline = time.monotonic() + timeout_s
    while (got := read()) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def _key(url: str, name: str = "b") -> dict:
    keys = httpx.get(url + "/admin/keys", headers=ADMIN, timeout=10).json()["keys"]
    return next(k for k in keys if k["name"] == name)


def test_a_suspended_key_comes_back_after_redis_restarts_without_its_data(own_redis, backend, gateway_factory,
                                                                          tmp_path, observed, caplog):
    """A suspended key retried after Redis restarted empty, to be served again as `ok`.
    Refused: still 403 key_suspended (this replica's durable record is stricter than Redis's empty one); one log line and seamguard_gateway_key_state_downgrades_total raised."""
    _, burl = backend
    url, _ = gateway_factory(base_config(burl, _redis_store(own_redis, tmp_path / "ledger.db")))
    assert _ask(url, 2) == 200
    r = httpx.post(url + "/admin/keys/b/suspend", headers=ADMIN, json={"note": "leaked in a public repo"})
    assert r.status_code == 200, r.text
    assert _ask(url, 2) == 403
    own_redis.stop()
    own_redis.start()   # same port, no data: the key's state and every counter are gone
    with caplog.at_level(logging.WARNING, logger="seamguard.gateway"):
        after = [_ask(url, 2) for _ in range(3)]
    lines = [rec.getMessage() for rec in caplog.records if "redis says ok" in rec.getMessage()]
    metrics = httpx.get(url + "/metrics", headers=ADMIN, timeout=10).text
    alert = [ln for ln in metrics.splitlines() if ln.startswith("seamguard_gateway_key_state_downgrades_total{")]
    observed(f"after the Redis restart: HTTP {after}; log lines {len(lines)}: {lines[:1]}; metric {alert}")
    assert after == [403, 403, 403]
    assert len(lines) == 1   # written back to Redis at once: one downgrade, one line
    assert alert == ['seamguard_gateway_key_state_downgrades_total{kept="suspended",key="b",seen="ok"} 1.0']
    assert _key(url)["state"] == "suspended"
    # the operator's own unsuspend is itself durable: it lifts the key, with nothing logged
    r = httpx.post(url + "/admin/keys/b/unsuspend", headers=ADMIN, json={"note": "secret rotated"})
    assert r.status_code == 200 and _ask(url, 2) == 200


def test_a_redis_flush_zeroes_every_budget_of_two_replicas(own_redis, gateway_factory, tmp_path, observed):
    """FLUSHALL on the Redis two replicas share, to spend a key's minute budget a second time.
    Refused: the window counters are rebuilt from each replica's durable charges (the sum of both), so nothing over the 1,000 TPM is admitted."""
    fb = FakeBackend()
    with ThreadedServer(fb.app()) as be:
        urls = []
        for i in range(2):
            cfg = base_config(be.url, _redis_store(own_redis, tmp_path / f"ledger{i}.db"))
            cfg["tenants"][0]["keys"][1]["tpm"] = 1000
            urls.append(gateway_factory(cfg, clock=lambda: T0)[0])
        # each request reserves 5 + 90 and is charged 4 + 90 (the stand-in's count): 5 via each replica
        before = [_ask(urls[i % 2]) for i in range(10)]
        spent = _key(urls[0])["used"]["tokens_last_minute"]
        redis.Redis.from_url(own_redis.url).flushall()
        # each replica notices within a second (its watcher; a health check or its next request does it too)
        for u in urls:
            assert httpx.get(u + "/healthz", timeout=10).status_code == 200
        rebuilt = _key(urls[1])["used"]["tokens_last_minute"]
        after = [_ask(urls[i % 2]) for i in range(10)]
        admitted_after = sum(s == 200 for s in after)
        total = _key(urls[0])["used"]["tokens_last_minute"]
    observed(f"before the flush: {before.count(200)} x 200, {spent} tokens; after it: counters rebuilt to "
             f"{rebuilt}, then {admitted_after} of 10 more admitted, {total} tokens in the minute")
    assert before == [200] * 10 and spent == 10 * 94
    assert rebuilt == spent
    assert after.count(200) == 0 and set(after) == {429}   # 940 + 95 > 1,000
    assert total <= 1000


def test_a_backend_outage_gets_a_retrying_client_suspended(gateway_factory, tmp_path, observed):
    """A fair client retrying once a second through a 100 s backend outage (every answer 502), to have its key throttled or suspended.
    Refused: the gateway's own 502s never count against the key: 502 throughout, nothing charged, no key-state step, and 200 once the backend is back."""
    fb = FakeBackend()
    fb.fail_next(100, 503)   # the backend answers 503: the gateway's 502
    now = [T0]
    with ThreadedServer(fb.app()) as be:
        url, gw = gateway_factory(base_config(be.url, {"type": "sqlite", "path": str(tmp_path / "g.db")}),
                                  clock=lambda: now[0])
        statuses = []
        for i in range(100):
            now[0] = T0 + i
            statuses.append(_ask(url, 20))
        now[0] += 1
        back = _ask(url, 20)
        key = _key(url)
        events = httpx.get(url + "/admin/events?key=b", headers=ADMIN, timeout=10).json()["events"]
    seen = {s: statuses.count(s) for s in sorted(set(statuses))}
    observed(f"statuses over 100 s: {seen}; then {back}; key state {key['state']}; tokens charged today "
             f"{key['used']['tokens_today']} (the one 200's); ledger steps {[(e['from'], e['to']) for e in events]}")
    assert statuses == [502] * 100
    assert back == 200 and key["state"] == "ok" and events == []
    assert key["used"]["tokens_today"] == 4 + 20 and key["used"]["inflight"] == 0


LOCKER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()   # held until the test closes our stdin
"""


def test_a_sqlite_lock_held_by_another_process_freezes_the_gateway(backend, gateway_factory, tmp_path, observed):
    """Another process holds an exclusive lock on the gateway's SQLite file, to freeze every request and hide it from /healthz.
    Refused: completions are refused promptly (503 store_unavailable, nothing spent) and /healthz answers 503 within 2 s; both recover when the lock goes."""
    _, burl = backend
    db = tmp_path / "g.db"
    url, _ = gateway_factory(base_config(burl, {"type": "sqlite", "path": str(db)}), clock=lambda: T0)
    assert _ask(url, 2) == 200
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert locker.stdout.readline().strip() == "locked"

        def timed(_: int) -> tuple[int, float]:
            t = time.monotonic()
            return _ask(url, 2), time.monotonic() - t

        with ThreadPoolExecutor(3) as ex:
            answers = list(ex.map(timed, range(3)))
        t = time.monotonic()
        health = httpx.get(url + "/healthz", timeout=30)
        health_s = time.monotonic() - t
    finally:
        locker.stdin.close()
        locker.wait(10)
        locker.stdout.close()
    after = _ask(url, 2)
    health_after = httpx.get(url + "/healthz", timeout=10).status_code
    observed(f"3 completions during the lock: {[(s, round(d, 2)) for s, d in answers]} (status, s); /healthz "
             f"{health.status_code} after {health_s:.2f} s; after the lock: completion {after}, /healthz {health_after}")
    assert [s for s, _ in answers] == [503, 503, 503]
    assert max(d for _, d in answers) < 5.0   # it took 10, 20 and 30 s
    assert health.status_code == 503 and health_s < 2.0
    assert after == 200 and health_after == 200
    eventually(lambda: _key(url)["used"]["tokens_last_minute"] == 2 * (4 + 2))


def test_a_lock_on_a_replicas_ledger_file_stops_it_or_loses_its_durable_record(own_redis, gateway_factory, tmp_path,
                                                                                observed):
    """Another process holds an exclusive lock on a Redis-backed replica's ledger file, to stop the replica or have its charges never reach disk.
    Refused: completions keep being served (the budgets are in Redis), /healthz answers 503 within 2 s, and the charges made meanwhile are written when the lock goes: a Redis flush afterwards rebuilds them."""
    ledger = tmp_path / "ledger.db"
    fb = FakeBackend()
    with ThreadedServer(fb.app()) as be:
        url, _ = gateway_factory(base_config(be.url, _redis_store(own_redis, ledger)), clock=lambda: T0)
        assert _ask(url, 20) == 200
        locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(ledger)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert locker.stdout.readline().strip() == "locked"
            t = time.monotonic()
            during = [_ask(url, 20) for _ in range(3)]
            during_s = time.monotonic() - t
            t = time.monotonic()
            health = httpx.get(url + "/healthz", timeout=30)
            health_s = time.monotonic() - t
        finally:
            locker.stdin.close()
            locker.wait(10)
            locker.stdout.close()
        spent = _key(url)["used"]["tokens_today"]
        eventually(lambda: httpx.get(url + "/healthz", timeout=10).status_code == 200)
        redis.Redis.from_url(own_redis.url).flushall()
        rebuilt = _polled(lambda: _key(url)["used"]["tokens_today"], spent)   # the watcher joins within 1 s
    observed(f"3 completions during the lock: {during} in {during_s:.2f} s; /healthz {health.status_code} after "
             f"{health_s:.2f} s; tokens today {spent}, after a FLUSHALL once the lock went: {rebuilt}")
    assert during == [200, 200, 200] and during_s < 5.0
    assert health.status_code == 503 and health_s < 2.0
    assert spent == 4 * (4 + 20) and rebuilt == spent
